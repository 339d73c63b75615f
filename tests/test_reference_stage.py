"""The reference stage: reference models trained like the target (its n where the pool allows,
its q, so its steps and sigma), offline models that never see a member or a holdout record,
online models on complementary halves that see each of them in exactly half, the match the
evaluate stage records, and its LiRA and RMIA built on them."""

from __future__ import annotations

import pandas as pd
import pytest

from conftest import prepared_project
from dpclip.stage_outputs import load_signals, load_split
from dpclip.cli import main
from dpclip.pipeline.params import parse_params
from dpclip.files import read_json
from dpclip.layout import Layout
from dpclip.stages.reference import complementary_halves, first_and_last, reference_seed


def test_complementary_halves_put_every_record_in_exactly_half_of_the_models():
    inside = complementary_halves(11, 6, seed=3)
    assert inside.shape == (6, 11)
    assert (inside.sum(axis=0) == 3).all()  # every record IN for K / 2 models
    assert (inside[0::2] ^ inside[1::2]).all()  # each pair splits the pool
    assert sorted(inside[0::2].sum(axis=1)) == [5, 5, 5]  # halves of n // 2 and the rest
    assert (complementary_halves(11, 6, seed=3) == inside).all()
    assert (complementary_halves(11, 6, seed=4) != inside).any()
    with pytest.raises(ValueError, match="odd"):
        complementary_halves(11, 3, seed=0)


def test_first_and_last_give_every_model_the_targets_size():
    # a pool of 10 and sets of 4: each pair disjoint (8 of the 10 records)
    inside = first_and_last(10, 4, 4, seed=1)
    assert (inside.sum(axis=1) == 4).all() and not (inside[0] & inside[1]).any()
    # sets of 7 from 10: each pair shares 2 x 7 - 10 = 4 records and covers the pool
    inside = first_and_last(10, 7, 2, seed=1)
    assert (inside.sum(axis=1) == 7).all()
    assert (inside[0] & inside[1]).sum() == 4 and (inside[0] | inside[1]).all()
    assert first_and_last(10, 10, 2, seed=1).all()  # the whole pool when it is the target's size
    with pytest.raises(ValueError, match="a reference set of 11 records from a pool of 10"):
        first_and_last(10, 11, 2, seed=1)


def test_a_small_pool_is_topped_up_to_the_targets_size():
    import numpy as np
    from dpclip.stages.reference import topped_up

    records = np.array([3, 5, 8, 9])
    assert (topped_up(records, 3, seed=0) == records).all()  # large enough: as it is
    six = topped_up(records, 6, seed=0)
    assert len(six) == 6 and (six[:4] == records).all() and len(set(six[4:])) == 2
    assert set(six) == set(records)  # nothing from outside the set
    assert len(topped_up(records, 11, seed=0)) == 11  # more missing than there are: repeats


def test_reference_seeds_differ_by_run_and_model(tiny_raw):
    params = parse_params(tiny_raw())
    seeds = {reference_seed(params, run, what) for run in ("a", "b")
             for what in ("halves", "model0", "model1")}
    assert len(seeds) == 6 and all(0 <= s < 2 ** 31 for s in seeds)


@pytest.mark.parametrize("mode", ["offline", "online"])
def test_reference_models_and_the_calibrated_attacks(tmp_path, tiny_raw, write_params, mode,
                                                     capsys):
    raw = tiny_raw(attack={"references": 4, "mode": mode})
    base = prepared_project(tmp_path, raw, write_params)
    for stage in ("train", "reference", "evaluate"):
        assert main([*base, stage]) == 0
    layout = Layout(tmp_path)
    run = "dp_sgd-eps8-iid-seed0"
    signals = load_signals(layout, run)
    facts = signals["facts"]
    n_members = read_json(layout.run_dir(run) / "record.json")["n_members"]
    n_holdout = len(load_split(layout, "target_holdout")[1])
    assert signals["logits_members"].shape[:2] == (4, n_members)
    assert signals["logits_holdout"].shape[:2] == (4, n_holdout)
    record = read_json(layout.run_dir(run) / "record.json")["privacy"]
    if mode == "offline":  # public pool: no reference model saw a member or a holdout record
        assert not signals["in_members"].any() and not signals["in_holdout"].any()
        public = sum(len(load_split(layout, s)[1]) for s in ("shadow_train", "shadow_holdout"))
        assert facts["pool_size"] == facts["population_size"] == public
        # trained like the target: its n (the pool of 716 topped up to the 719 members with 3
        # records drawn twice), q, steps and noise multiplier
        assert all(m["n_train"] == n_members for m in facts["models"])
        assert all(m["repeated"] == max(0, n_members - public) for m in facts["models"])
    else:  # members and holdout: each IN for exactly two of the four
        assert (signals["in_population"].sum(axis=0) == 2).all()  # z: IN for half the models
        assert (signals["in_members"].sum(axis=0) == 2).all()
        assert (signals["in_holdout"].sum(axis=0) == 2).all()
        assert facts["pool_size"] == n_members + n_holdout
        assert facts["population_size"] == n_holdout
    for model in facts["models"]:  # online halves are smaller, but q, T and sigma match
        assert model["sample_rate"] == pytest.approx(record["sample_rate"])
        assert model["steps"] == record["steps"]
        assert model["noise_multiplier"] == pytest.approx(record["noise_multiplier"])
        assert model["epsilon"] == pytest.approx(8, abs=0.1)
    assert facts["target_plan"] == {"n_train": n_members, "sample_rate": pytest.approx(
        record["sample_rate"]), "steps": record["steps"]}
    assert len({m["seed"] for m in facts["models"]}) == 4

    metrics = read_json(layout.metrics(run))
    match = metrics["mia"]["references"]["match"]
    assert match["matched"] == {"n_train": mode == "offline", "sample_rate": True,
                                "steps": True, "noise_multiplier": True}
    assert match["target"]["n_train"] == n_members
    assert 0 <= match["references"]["unseen_accuracy"] <= 1
    assert 0 <= match["target"]["unseen_accuracy"] <= 1
    assert metrics["mia"]["headline"]["attack"] == "lira"  # auto: LiRA with references
    from dpclip.stages.report import references_section

    section = "\n".join(references_section([metrics]))
    same = "yes, yes, yes, yes" if mode == "offline" else "no, yes, yes, yes"
    assert f"| {run} | 4 | {n_members} |" in section and f"| {same} |" in section
    assert metrics["mia"]["headline"]["auc"] == metrics["mia"]["lira"]["auc"]
    n = metrics["mia"]["matching"]["n_members"]
    for attack in ("loss", "lira", "rmia"):
        result = metrics["mia"][attack]
        assert 0 <= result["auc"] <= 1 and result["dp_bound"]["checked"]
        lo, hi = result["tpr_at_fpr_1pct_ci95"]
        assert lo <= result["tpr_at_fpr_1pct"] <= hi
    assert metrics["mia"]["dp_bound_family"]["checks"] == 3 + 2  # three attacks, two layers
    scores = pd.read_csv(layout.attack_scores(run))
    assert list(scores.columns) == ["split", "position", "label", "member", "loss", "lira",
                                    "rmia"]
    assert scores["member"].sum() == n and len(scores) == 2 * n
    assert set(pd.read_csv(layout.roc(run))["attack"]) == {"loss", "lira", "rmia"}
    # a second pass finds every run's reference models up to date
    assert main([*base, "reference"]) == 0
    assert load_signals(layout, run)["facts"] == facts
    if mode == "offline":  # signals of another population are refused, not misread
        write_params(tiny_raw(attack={"references": 4, "population": "shadow_train"}))
        assert main([*base, "evaluate", "--force"]) != 0
        assert "run the reference stage again" in capsys.readouterr().err


def test_no_reference_models_no_calibrated_attacks(tmp_path, tiny_raw, write_params):
    base = prepared_project(tmp_path, tiny_raw(attack={"references": 0}), write_params)
    for stage in ("train", "reference", "evaluate"):
        assert main([*base, stage]) == 0
    layout = Layout(tmp_path)
    assert list((tmp_path / "references").iterdir()) == []
    mia = read_json(layout.metrics("dp_sgd-eps8-iid-seed0"))["mia"]
    assert "lira" not in mia and "rmia" not in mia
    assert list(pd.read_csv(layout.attack_scores("dp_sgd-eps8-iid-seed0")).columns)[-1] == \
        "loss"
