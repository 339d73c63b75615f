"""Small data works by default: a few hundred rows of a real public table (scikit-learn's
bundled Wisconsin breast-cancer data, 300 of its 569 rows, as a CSV) through every stage with
every method and the project's default parameters, only ``data:`` pointing at the file."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml
from sklearn.datasets import load_breast_cancer

from conftest import PROJECT
from dpclip.stage_outputs import load_split
from dpclip.pipeline.params import parse_params
from dpclip.files import read_json
from dpclip.layout import Layout
from dpclip.run_keys import configured_runs
from dpclip.catalog import BY_NAME
from dpclip.runner import run_every
from dpclip.stages.partition import partition
from dpclip.stages.prepare import prepare
from dpclip.stages.report import report
from dpclip.stages.shadow import shadow, shadow_batch_size
from dpclip.stages.tune import tune

pytestmark = pytest.mark.e2e
ROWS = 300


def test_a_batch_larger_than_the_shadow_set_becomes_a_quarter_of_it_with_a_notice(caplog):
    assert shadow_batch_size(64, 200) == 64
    assert shadow_batch_size(64, 61) == 15 and "using 15" in caplog.text
    assert shadow_batch_size(64, 3) == 1


def test_every_method_runs_every_stage_on_300_rows_with_the_defaults(tmp_path, monkeypatch):
    data = load_breast_cancer(as_frame=True).frame.sample(n=ROWS, random_state=0)
    path = tmp_path / "breast_cancer.csv"
    data.to_csv(path, index=False)
    raw = yaml.safe_load((PROJECT / "params.yaml").read_text())
    raw["data"] = {"dataset": "csv", "path": str(path), "target": "target"}
    params = parse_params(raw)
    layout = Layout(tmp_path / "project")
    meta = prepare(params, layout)
    assert sum(meta["sizes"].values()) == ROWS
    for alpha in params.partition.alphas:
        partition(params, alpha, layout)
    public = len(load_split(layout, "shadow_train")[0])
    assert public < params.shadow.batch_size  # the default batch does not fit ...
    risk = shadow(params, layout, progress=False)
    assert risk["batch_size"] == public // 4  # ... and the shadow model trains anyway
    tune(params, layout, progress=False)
    for stage in ("train", "audit", "reference", "evaluate"):  # two runs at a time
        list(run_every(BY_NAME[stage], params, layout, jobs=2))
    runs = configured_runs(params)
    assert {key.method for key in runs} == set(params.train.methods)
    for key in runs:
        metrics = read_json(layout.metrics(key.name))
        assert 0 <= metrics["utility"]["accuracy"] <= 1, key.name
        assert metrics["mia"]["lira"]["auc"] is not None, key.name  # references trained
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    result = report(params, layout, track=True)
    table = result.table
    # the experiment the report names is the one it logged to (it said 'dpclip-csv')
    assert result.mlflow["experiment"] == "dpclip-csv-breast_cancer"
    assert len(table) == len(runs) and not table["accuracy"].isna().any()
    assert pd.read_csv(layout.reports / "summary.csv")["method"].tolist() == \
        list(params.train.methods)
