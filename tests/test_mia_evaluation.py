"""Membership inference on label-skewed partitions (class-matched evaluation sets, the
label-only baseline) and the DP-bound check of every attack through the evaluate stage."""

from __future__ import annotations

import json
import logging

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dpclip.stage_outputs import load_partition, load_split
from dpclip.attacks.common.membership import class_matched_indices, label_only_auc, label_only_scores
from dpclip.cli import main
from dpclip.pipeline.params import parse_params
from dpclip.errors import ConfigError, DpclipError
from dpclip.files import read_json, write_csv_frame, write_json
from dpclip.layout import Layout
from dpclip.models import build_model
from dpclip.stages.evaluate import evaluate, ir_attack

RUN = "dp_sgd-eps8-0.1-seed0"


# --- class matching ----------------------------------------------------------------------------

def test_matching_keeps_every_member_when_the_holdout_can_match():
    # members 3 x class 0, 1 x class 1 (p = 3/4, 1/4); holdout 5 of each:
    # S = min(4, floor(5 / 0.75) = 6, floor(5 / 0.25) = 20) = 4 -> counts (3, 1) on both sides
    y_in, y_out = np.array([0, 0, 0, 1]), np.array([0] * 5 + [1] * 5)
    pick_in, pick_out = class_matched_indices(y_in, y_out, np.random.default_rng(0))
    np.testing.assert_array_equal(pick_in, [0, 1, 2, 3])
    np.testing.assert_array_equal(np.bincount(y_out[pick_out]), [3, 1])


def test_matching_subsamples_members_when_the_holdout_cannot():
    # members 8 x class 0, 2 x class 1 (p = 0.8, 0.2); holdout 4 of each:
    # S = min(10, floor(4 / 0.8) = 5, floor(4 / 0.2) = 20) = 5 -> counts (4, 1) on both sides
    y_in, y_out = np.array([0] * 8 + [1] * 2), np.array([0] * 4 + [1] * 4)
    pick_in, pick_out = class_matched_indices(y_in, y_out, np.random.default_rng(0))
    np.testing.assert_array_equal(np.bincount(y_in[pick_in]), [4, 1])
    np.testing.assert_array_equal(np.bincount(y_out[pick_out]), [4, 1])
    # a cap per side keeps the proportions: 3 -> largest remainder of (2.4, 0.6) = (2, 1)
    pick_in, pick_out = class_matched_indices(y_in, y_out, np.random.default_rng(0),
                                              max_per_side=3)
    np.testing.assert_array_equal(np.bincount(y_in[pick_in]), [2, 1])
    np.testing.assert_array_equal(np.bincount(y_out[pick_out]), [2, 1])


def test_matching_refuses_when_the_holdout_has_none_of_the_members_classes():
    with pytest.raises(DpclipError, match="no record of the members' classes"):
        class_matched_indices(np.array([2, 2]), np.array([0, 1]), np.random.default_rng(0))


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_matched_sets_have_identical_class_counts_and_the_members_proportions(data):
    k = data.draw(st.integers(1, 6))
    y_in = np.array(data.draw(st.lists(st.integers(0, k - 1), min_size=1, max_size=120)))
    y_out = np.array(data.draw(st.lists(st.integers(0, k - 1), min_size=1, max_size=120)))
    shared = np.isin(y_in, y_out)
    if not shared.any():
        return
    seed = data.draw(st.integers(0, 2 ** 32 - 1))
    pick_in, pick_out = class_matched_indices(y_in, y_out, np.random.default_rng(seed))
    # subsets, no record twice, seeded
    assert len(np.unique(pick_in)) == len(pick_in) and len(np.unique(pick_out)) == len(pick_out)
    again = class_matched_indices(y_in, y_out, np.random.default_rng(seed))
    np.testing.assert_array_equal(again[0], pick_in)
    np.testing.assert_array_equal(again[1], pick_out)
    c_in = np.bincount(y_in[pick_in], minlength=k)
    np.testing.assert_array_equal(c_in, np.bincount(y_out[pick_out], minlength=k))
    # the members' proportions (over the classes the holdout has) up to rounding
    p = np.bincount(y_in[shared], minlength=k) / shared.sum()
    size = c_in.sum()
    assert np.all(np.abs(c_in - size * p) < 1.0)
    # the largest such set: one more record would need more of some class than one side has
    h = np.bincount(y_out, minlength=k)
    assert size == min(shared.sum(), int(np.floor(np.min(h[p > 0] / p[p > 0]) + 1e-9)))
    # any label-only score is powerless on them
    assert label_only_auc(y_in[pick_in], y_out[pick_out]) == 0.5


# --- the label-only baseline -------------------------------------------------------------------

def test_label_only_attack_hand_case():
    # f_in = (3/4, 1/4), f_out = (1/4, 3/4): scores log 3 (class 0) and -log 3 (class 1).
    # member class 0 (x3): ties the 1 non-member of class 0, beats the 3 of class 1 -> 3.5 each
    # member class 1 (x1): loses to class 0, ties the 3 of class 1 -> 1.5
    # AUC = (3 * 3.5 + 1.5) / (4 * 4) = 0.75
    y_in, y_out = np.array([0, 0, 0, 1]), np.array([0, 1, 1, 1])
    np.testing.assert_allclose(label_only_scores(np.array([0, 1]), y_in, y_out),
                               [np.log(3), -np.log(3)])
    assert label_only_auc(y_in, y_out) == pytest.approx(0.75)
    # a class on one side only is a certain giveaway: members class 2 are beyond every score
    assert label_only_auc(np.array([2, 2]), np.array([0, 1])) == 1.0


def _label_only_auc_by_counting(y_in, y_out) -> float:
    """Independent route: the likelihood-ratio order compared by cross-multiplied counts,
    m_a h_b > m_b h_a (no logarithms, no zero floors), over every member/non-member pair."""
    k = int(max(y_in.max(), y_out.max())) + 1
    m, h = np.bincount(y_in, minlength=k), np.bincount(y_out, minlength=k)
    total = 0.0
    for a in range(k):
        for b in range(k):
            left, right = m[a] * h[b], m[b] * h[a]
            total += m[a] * h[b] * (1.0 if left > right else 0.5 if left == right else 0.0)
    return total / (len(y_in) * len(y_out))


# --- the evaluate stage on a label-skewed partition ------------------------------------------

@pytest.fixture
def skewed_project(tmp_path, tiny_raw, write_params):
    """digits, prepared and partitioned at Dirichlet alpha 0.1 (the CLI); returns params."""
    raw = tiny_raw(partition={"alphas": [0.1]}, train={"methods": ["dp_sgd"]})
    path = write_params(raw)
    base = ["--params", str(path), "--root", str(tmp_path), "--quiet"]
    assert main([*base, "prepare"]) == 0
    assert main([*base, "partition", "--alpha", "0.1"]) == 0
    return parse_params(raw)


def _write_prior_run(layout: Layout, privacy: dict) -> np.ndarray:
    """A trained-run folder whose model outputs the members' class prior whatever its input
    (head weights 0, head bias log prior); its first layer keeps random weights, so its
    representation still carries the input (and so the label). Returns the prior."""
    meta = read_json(layout.prepared_meta)
    _, y_train, _ = load_split(layout, "target_train")
    members = load_partition(layout, 0.1)["positions"]
    prior = np.bincount(y_train[members], minlength=meta["n_classes"]) / len(members)
    torch.manual_seed(0)
    model = build_model("mlp", tuple(meta["feature_shape"]), meta["n_classes"], [32])
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.copy_(torch.log(torch.as_tensor(prior).clamp_min(1e-12)))
    arch = {"model": "mlp", "feature_shape": meta["feature_shape"],
            "n_classes": meta["n_classes"], "hidden": [32]}
    folder = layout.run_dir(RUN)
    folder.mkdir(parents=True)
    torch.save({"state_dict": model.state_dict(), "architecture": arch}, folder / "model.pt")
    write_json(folder / "record.json", {
        "run": RUN, "dataset": "digits", "method": "dp_sgd", "alpha": 0.1, "seed": 0,
        "privacy": privacy, "device": "cpu", "training": {}})
    write_csv_frame(layout.trace(RUN), pd.DataFrame({"step": [1], "clip_threshold": [1.0]}))
    return prior


def test_a_class_prior_model_shows_no_membership_on_a_skewed_partition(skewed_project, tmp_path,
                                                                        caplog):
    # A model that ignores its input leaks nothing about membership. Scored against the whole
    # (stratified) holdout, its loss is low exactly on the members' frequent classes: the old
    # evaluation gave loss-attack AUC 0.95 and a "PRIVACY BUG" at epsilon 0.5.
    layout = Layout(tmp_path)
    privacy = {"dp_guarantee": True, "epsilon": 0.5, "delta": 1e-5, "target_epsilon": 8.0,
               "noise_multiplier": 1.0}  # no adjacency: an older record, read as add_remove
    prior = _write_prior_run(layout, privacy)
    with caplog.at_level(logging.ERROR):
        metrics = evaluate(skewed_project, "dp_sgd", 8, 0.1, 0, layout)
    assert "PRIVACY BUG" not in caplog.text
    mia = metrics["mia"]
    # identical class counts -> identical multisets of prior losses on both sides
    assert mia["loss"]["auc"] == pytest.approx(0.5, abs=1e-12)
    bound = mia["loss"]["dp_bound"]
    assert bound["checked"] and not bound["violated"] and bound["worst_margin"] < 0
    assert (bound["adjacency"], bound["epsilon_used"]) == ("add_remove", 1.0)
    match = mia["matching"]
    assert match["class_matched"] and match["n_members"] == match["n_nonmembers"] > 0
    # the label-only baseline: 0.5 on the matched sets, the label shift without them
    _, y_train, _ = load_split(layout, "target_train")
    y_in = y_train[load_partition(layout, 0.1)["positions"]]
    _, y_out, _ = load_split(layout, "target_holdout")
    assert mia["label_only"]["auc"] == 0.5
    assert mia["label_only"]["auc_unmatched"] == pytest.approx(
        _label_only_auc_by_counting(y_in, y_out), abs=1e-12)
    assert mia["label_only"]["auc_unmatched"] > 0.9
    # the IR attack on the same matched sets: the first layer encodes the digit, but both sides
    # have the same digits, so no layer separates them (unmatched: AUC about 0.94)
    ir = mia["ir"]
    assert ir["n_each"] == match["n_members"]
    assert ir["peak_auc"] < 0.8
    assert ir["dp_bound"]["checked"] and not ir["dp_bound"]["violated"]
    assert ir["dp_bound"]["layer"] in ir["layers"]
    assert all(v["dp_bound_margin"] <= ir["dp_bound"]["worst_margin"]
               for v in ir["layers"].values())
    # the run's flag ORs 1 + layers checks: each at 1 - 0.05 / checks, 95% for the run
    family = mia["dp_bound_family"]
    assert family["checks"] == 1 + len(ir["layers"]) and family["confidence"] == 0.95
    assert bound["confidence"] == ir["dp_bound"]["confidence"] == pytest.approx(
        1 - 0.05 / family["checks"])
    # utility stays on the whole holdout: the prior's top class is right on its share of it
    assert metrics["utility"]["accuracy"] == pytest.approx(np.mean(y_out == prior.argmax()))
    written = json.loads(layout.metrics(RUN).read_text())
    assert written["mia"]["label_only"] == mia["label_only"]


def test_an_impossible_ir_attack_is_reported_per_layer(tiny_raw, caplog):
    # members and non-members 6 apart on every input coordinate: every layer's representation
    # separates them, far beyond any (0.1, 1e-5) guarantee
    params = parse_params(tiny_raw())
    rng = np.random.default_rng(0)
    x_in = rng.normal(3.0, 1.0, size=(200, 1, 8, 8)).astype(np.float32)
    x_out = rng.normal(-3.0, 1.0, size=(200, 1, 8, 8)).astype(np.float32)
    labels = np.repeat(np.arange(4), 50)
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 4, [16]).eval()
    claim = {"dp_guarantee": True, "epsilon": 0.1, "delta": 1e-5,
             "adjacency": "replace_one_features"}
    with caplog.at_level(logging.ERROR):
        ir = ir_attack(params, model, x_in, labels, x_out, labels, np.random.default_rng(1),
                       claim, "fake-run")
    assert ir["dp_bound"]["violated"] and ir["dp_bound"]["worst_margin"] > 0
    assert ir["dp_bound"]["epsilon_used"] == 0.1
    assert all(v["dp_bound_margin"] > 0 for v in ir["layers"].values())
    assert "PRIVACY BUG in fake-run: the IR (fc1) attack" in caplog.text
    # no DP claim: nothing to check, and the reason is recorded
    free = ir_attack(params, model, x_in, labels, x_out, labels, np.random.default_rng(1),
                     {"dp_guarantee": False, "epsilon": None}, "fake-run")
    assert free["dp_bound"] == {"checked": False, "reason": "non-private: no finite epsilon"}
    assert all(v["dp_bound_margin"] is None for v in free["layers"].values())


def test_the_train_scored_ir_attack_measures_memorisation_and_claims_no_dp_bound(tiny_raw,
                                                                                 caplog):
    # members and non-members from one distribution: nothing to infer, so held-out folds give
    # about a guess, while a boosted-tree classifier scored on its own training records (the
    # LM-DP-SGD paper's protocol) looks far better than a guess; that score bounds nothing, so
    # it is never checked against the run's (tiny) epsilon
    raw = tiny_raw()
    raw["attack"] = {**raw.get("attack", {}), "classifier": "gbdt"}
    params = parse_params(raw)
    rng = np.random.default_rng(0)
    x_in, x_out = (rng.normal(size=(200, 1, 8, 8)).astype(np.float32) for _ in range(2))
    labels = np.repeat(np.arange(4), 50)
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 4, [16]).eval()
    claim = {"dp_guarantee": True, "epsilon": 0.1, "delta": 1e-5, "adjacency": "add_remove"}
    held_out = ir_attack(params, model, x_in, labels, x_out, labels, np.random.default_rng(1),
                         claim, "fake-run")
    with caplog.at_level(logging.ERROR):
        trained = ir_attack(params, model, x_in, labels, x_out, labels,
                            np.random.default_rng(1), claim, "fake-run", evaluation="train")
    assert held_out["evaluation"] == "cv" and trained["evaluation"] == "train"
    assert abs(held_out["peak_accuracy"] - 0.5) < 0.1
    assert trained["peak_accuracy"] > 0.9
    assert trained["n_each"] == held_out["n_each"] == 200
    assert trained["dp_bound"] == {"checked": False,
                                   "reason": "scored on the classifier's own training records"}
    assert "PRIVACY BUG" not in caplog.text


def test_train_scoring_without_the_ir_attack_is_refused(tiny_raw):
    raw = tiny_raw()
    raw["evaluate"] = {"ir_attack": False, "ir_train_scoring": True}
    with pytest.raises(ConfigError, match="ir_train_scoring"):
        parse_params(raw)


def test_train_scoring_attacks_the_same_records_and_changes_nothing_else(skewed_project,
                                                                        tmp_path):
    from dpclip.stages.report import table_row

    layout = Layout(tmp_path)
    _write_prior_run(layout, {"dp_guarantee": True, "epsilon": 0.5, "delta": 1e-5,
                              "target_epsilon": 8.0, "noise_multiplier": 1.0})
    plain = evaluate(skewed_project, "dp_sgd", 8, 0.1, 0, layout)
    raw = skewed_project.to_dict()
    raw["evaluate"]["ir_train_scoring"] = True
    both = evaluate(parse_params(raw), "dp_sgd", 8, 0.1, 0, layout)
    assert "ir_train" not in plain["mia"]
    assert {k: v for k, v in both["mia"].items() if k != "ir_train"} == plain["mia"]
    ir, trained = both["mia"]["ir"], both["mia"]["ir_train"]
    assert trained["n_each"] == ir["n_each"] and list(trained["layers"]) == list(ir["layers"])
    assert table_row(both)["peak_ir_mia_train"] == trained["peak_accuracy"]
    assert table_row(plain)["peak_ir_mia_train"] is None
