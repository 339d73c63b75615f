"""Adding an attack is one new file plus params.yaml: the example of docs/adding-an-attack.md,
dropped into a plugin folder of the attacks package, is found, validated, scored as worked out
by hand, run by the evaluate stage on every run, and shown in the report, the overlays, the
MLflow names and the run's provenance, with no other edit."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from conftest import docs_example

from dpclip.attacks import AttackEvidence, available_attacks, build, get_attack, headline_attack
from dpclip.pipeline.params import parse_params
from dpclip.errors import ConfigError, DpclipError
from dpclip.files import read_json
from dpclip.layout import Layout
from dpclip.stages.evaluate import evaluate
from dpclip.stages.partition import partition
from dpclip.stages.prepare import prepare
from dpclip.catalog import BY_NAME
from dpclip.pipeline.provenance import code_files
from dpclip.stages.report import report
from dpclip.stages.train import train
from dpclip.tracking import summary_metrics


@pytest.fixture
def mentr(plugin):
    """The documented module dropped into a folder the attacks package searches."""
    return plugin("dpclip.attacks", "mentr", docs_example("adding-an-attack.md"))


def test_an_unknown_attack_lists_the_known_ones(tiny_raw):
    with pytest.raises(DpclipError) as info:
        get_attack("mentr_typo")
    assert all(name in str(info.value) for name in available_attacks())
    with pytest.raises(ConfigError, match=r"attack\.kinds: 'mentr_typo' is not one of"):
        parse_params(tiny_raw(attack={"kinds": ["loss", "mentr_typo"]}))


def test_the_documented_attack_is_found_validated_and_scores_as_by_hand(mentr, tiny_raw):
    assert mentr in available_attacks()
    with pytest.raises(ConfigError, match=r"attack\.mentr\.floor: 0"):
        parse_params(tiny_raw(attack={"kinds": ["loss", mentr], "mentr": {"floor": 0}}))
    params = parse_params(tiny_raw(attack={"kinds": ["loss", mentr], "headline": mentr}))
    assert headline_attack(params.attack) == mentr
    # two classes, p = (0.8, 0.2): label 0 gives Mentr = -0.2 log 0.8 - 0.2 log 0.8,
    # label 1 gives -0.8 log 0.2 - 0.8 log 0.2
    logits = np.log([[0.8, 0.2], [0.8, 0.2]])
    scores = build(mentr, params.attack).scores(
        AttackEvidence(x=np.zeros((2, 1)), labels=np.array([0, 1]), logits=logits, model=None))
    assert scores == pytest.approx([0.4 * math.log(0.8), 1.6 * math.log(0.2)])


def test_the_documented_attack_runs_through_the_stages_into_every_output(mentr, tiny_raw,
                                                                         tmp_path):
    params = parse_params(tiny_raw(
        train={"methods": ["dp_sgd"], "epochs": 1}, evaluate={"ir_attack": False},
        audit={"kinds": []}, attack={"kinds": ["loss", "lira", mentr], "references": 0,
                                     "mentr": {"floor": 1e-20}}))
    layout = Layout(tmp_path)
    prepare(params, layout)
    partition(params, "iid", layout)
    train(params, "dp_sgd", 8, "iid", 0, layout, progress=False)
    metrics = evaluate(params, "dp_sgd", 8, "iid", 0, layout)
    run = metrics["run"]
    ours = metrics["mia"][mentr]
    assert 0 <= ours["auc"] <= 1 and ours["dp_bound"]["checked"]
    assert list(metrics["mia"]["not_run"]) == ["lira"]
    assert metrics["mia"]["not_run"]["lira"].startswith("needs reference models")
    assert mentr in pd.read_csv(layout.attack_scores(run)).columns
    # the run's provenance names the attack's file among its code
    code = read_json(layout.figures(run) / "provenance.json")["inputs"]["files"]
    # (a plugin here; the file in src/ when a reader saved the page's module there)
    labels = {"plugin:dpclip.attacks.mentr", "src/dpclip/attacks/mentr.py"}
    assert labels & set(code) and labels & code_files(BY_NAME["evaluate"], "dp_sgd", params).keys()
    report(params, layout, track=False)
    table = pd.read_csv(layout.reports / "comparison.csv")
    assert table.loc[0, "mentr_auc"] == pytest.approx(ours["auc"])
    assert table.loc[0, "mentr_tpr_at_fpr_0.1pct"] == pytest.approx(ours["tpr_at_fpr_0.1pct"])
    assert "`mentr_*`: Modified entropy" in (layout.reports / "comparison.md").read_text()
    assert (layout.reports / "roc_mentr.png").exists()
    (labelled,) = set(pd.read_csv(layout.overlays / "roc" / "mentr.csv")["run"])
    assert labelled.startswith(f"{run} (digits-")  # each series names its data
    assert summary_metrics()["mia_mentr_auc"] == ("mia", mentr, "auc")
