"""The git-tracked comparison files: each run's summary (DVC's metrics) and the overlay plot
tables (DVC's plots), checked on hand-made metrics, traces and ROC tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dpclip.pipeline.params import parse_params
from dpclip.files import read_json, write_csv_frame, write_json
from dpclip.layout import Layout
from dpclip.run_keys import configured_runs
from dpclip.catalog import BY_NAME
from dpclip.runner import tidy
from dpclip.stages.evaluate import run_summary
from dpclip.reporting.overlays import FILES, thin, thin_log, write_overlays


DATA = "digits-1a2b3c4d"  # the prepared data's identity


def _metrics(epsilon, mia: dict, audit: dict | None = None) -> dict:
    m = {"dataset": "digits", "dataset_id": DATA,
         "privacy": {"epsilon": epsilon, "dp_guarantee": epsilon is not None},
         "utility": {"accuracy": 0.9, "ece": 0.05},
         "mia": mia}
    if audit is not None:
        m["audit"] = audit
    return m


def test_the_summary_takes_the_attack_strongest_at_low_fpr():
    loss = {"auc": 0.60, "tpr_at_fpr_0.1pct": 0.002, "tpr_at_fpr_1pct": 0.02}
    lira = {"auc": 0.55, "tpr_at_fpr_0.1pct": 0.010, "tpr_at_fpr_1pct": 0.03}
    mia = {"loss": loss, "lira": lira, "label_only": {"auc": 0.7},  # no TPR: not an attack
           "ir": {"peak_accuracy": 0.6}, "matching": {"n_members": 10}}
    filed = run_summary(_metrics(7.5, mia, {"blackbox": {"epsilon_lower_bound": 0.4},
                                            "whitebox": {"epsilon_lower_bound": 1.2}}))
    assert list(filed) == [DATA]  # filed under the data's identity: DVC keeps data apart
    summary = filed[DATA]
    assert summary == {"epsilon": 7.5, "dp_guarantee": True, "adjacency_add_remove": True,
                       "accuracy": 0.9, "ece": 0.05, "strongest_auc": 0.55,
                       "strongest_tpr_at_fpr_0.1pct": 0.010,
                       "strongest_tpr_at_fpr_1pct": 0.03,
                       "audit_epsilon_lower_bound": 1.2}
    # equal TPR at 0.1% FPR: the higher AUC wins; no audit, no key
    tied = run_summary(_metrics(None, {"loss": loss, "rmia": {**loss, "auc": 0.7}}))[DATA]
    assert tied["strongest_auc"] == 0.7 and tied["epsilon"] is None
    assert "audit_epsilon_lower_bound" not in tied
    assert all(isinstance(v, (int, float)) or v is None for v in tied.values())  # DVC: numbers


def test_thin_keeps_the_ends_and_at_most_the_limit():
    frame = pd.DataFrame({"step": np.arange(1, 1001)})
    kept = thin(frame, 50)["step"].to_numpy()
    assert len(kept) == 50 and kept[0] == 1 and kept[-1] == 1000
    assert thin(frame.head(30), 50).equals(frame.head(30))


def test_thin_log_drops_zero_fpr_and_keeps_the_low_fpr_detail():
    fpr = np.concatenate([[0.0, 0.0], np.linspace(1e-4, 1, 10_000)])
    kept = thin_log(pd.DataFrame({"fpr": fpr, "tpr": fpr}), "fpr", 100)["fpr"].to_numpy()
    assert (kept > 0).all() and len(kept) <= 101 and kept[-1] == 1.0
    # evenly spaced in log FPR: about 25 points in the decade 1e-3 to 1e-2 (one of four),
    # where an evenly spaced thinning would have kept one
    assert ((kept >= 1e-3) & (kept < 1e-2)).sum() >= 20


@pytest.fixture
def evaluated(tmp_path, tiny_raw):
    """Two configured runs (non_private, dp_sgd) and one no longer configured, as the
    evaluate stage leaves them."""
    params = parse_params(tiny_raw(train={"methods": ["non_private", "dp_sgd"]}))
    layout = Layout(tmp_path)
    runs = configured_runs(params)
    for key, epsilon in zip(runs, (None, 7.9)):
        write_csv_frame(layout.trace(key.name), pd.DataFrame({
            "step": np.arange(1, 1001), "train_loss": 1.0,
            "clip_threshold": np.nan if epsilon is None else np.linspace(1, 2, 1000)}))
        roc = pd.DataFrame({"attack": "loss", "fpr": [0, 0, 0.2, 0.5, 1],
                            "tpr": [0, 0.1, 0, 0.6, 1]})
        if epsilon is not None:  # only the private run has reference models: LiRA rows
            roc = pd.concat([roc, pd.DataFrame({"attack": "lira", "fpr": [0, 0.01, 1],
                                                "tpr": [0.2, 0.3, 1]})])
        write_csv_frame(layout.roc(key.name), roc)
        write_csv_frame(layout.reliability(key.name), pd.DataFrame({
            "confidence": [0.2, 0.5, 0.9], "accuracy": [0.0, 0.4, 0.95], "count": [0, 3, 9]}))
        metrics = _metrics(epsilon, {"loss": {"auc": 0.52, "tpr_at_fpr_0.1pct": 0.0,
                                              "tpr_at_fpr_1pct": 0.01}})
        write_json(layout.metrics(key.name), metrics)
        write_json(layout.summary(key.name), run_summary(metrics))
    write_json(layout.summary("auto_s-eps8-iid-seed0"), {"accuracy": 0.1})  # unconfigured
    return params, layout, runs


def test_overlays_hold_every_configured_run_in_one_table(evaluated):
    params, layout, runs = evaluated
    (layout.overlays / "roc_lira.csv").parent.mkdir(parents=True)
    (layout.overlays / "roc_lira.csv").write_text("an older layout's table")
    tables = write_overlays(layout, runs)
    # one ROC table per attack that ran (no run had RMIA); nothing else stays in the folder
    assert sorted(tables) == sorted([*FILES, "roc/loss.csv", "roc/lira.csv"])
    assert sorted(p.relative_to(layout.overlays).as_posix() for p in
                  layout.overlays.rglob("*.csv")) == sorted(tables)
    names = [f"{k.name} ({DATA})" for k in runs]  # each series names its data
    clip = pd.read_csv(layout.overlays / "clip_threshold.csv")
    assert set(clip["run"]) == {names[1]}  # the non-private run has no C_t
    assert len(clip) <= 400 and clip["step"].iloc[-1] == 1000
    roc = pd.read_csv(layout.overlays / "roc" / "loss.csv")
    assert set(roc["run"]) == set(names) and (roc[["fpr", "tpr"]] > 0).all().all()  # log axes
    assert list(roc[roc["run"] == names[1]]["tpr"]) == [0.6, 1.0]
    lira = pd.read_csv(layout.overlays / "roc" / "lira.csv")
    assert set(lira["run"]) == {names[1]} and list(lira["tpr"]) == [0.3, 1.0]
    assert set(lira["attack"]) == {"lira"}
    reliability = pd.read_csv(layout.overlays / "reliability.csv")
    assert (reliability["count"] > 0).all() and len(reliability) == 4
    utility = pd.read_csv(layout.overlays / "privacy_utility.csv")
    assert list(utility["run"]) == [names[1]]  # a point needs an epsilon
    assert utility.loc[0, "epsilon"] == 7.9 and utility.loc[0, "series"] == f"dp_sgd iid seed0 ({DATA})"
    # why a run has no audited bound, for the claimed-vs-audited plot (no audit ran here)
    assert utility.loc[0, "audit_status"] == "not audited"


def test_a_run_no_longer_configured_loses_its_summary(evaluated):
    params, layout, _ = evaluated
    assert tidy(BY_NAME["evaluate"], params, layout) == ["auto_s-eps8-iid-seed0"]
    assert not layout.summary("auto_s-eps8-iid-seed0").exists()
    assert read_json(layout.summary("dp_sgd-eps8-iid-seed0"))[DATA]["epsilon"] == 7.9


def test_the_seed_bands_hold_the_mean_and_interval_per_method_and_epsilon(tmp_path, tiny_raw):
    params = parse_params(tiny_raw(train={"methods": ["non_private", "dp_sgd"],
                                          "seeds": [0, 1, 2]}))
    layout = Layout(tmp_path)
    runs = configured_runs(params)
    for key in runs:
        epsilon = None if key.method == "non_private" else 7.9
        write_json(layout.summary(key.name), {
            "epsilon": epsilon, "accuracy": 0.9 + 0.01 * key.seed, "ece": 0.05,
            "attack_tpr_at_low_fpr": 0.02 * key.seed})
    from dpclip.reporting.overlays import privacy_utility_seeds_table

    table = privacy_utility_seeds_table(layout, runs)
    assert len(table) == 1  # dp_sgd at eps 8 (non_private has no epsilon to sit on)
    row = table.iloc[0]
    assert (row["method"], row["seeds"]) == ("dp_sgd", 3) and row["epsilon"] == pytest.approx(7.9)
    # 0.90, 0.91, 0.92: mean 0.91, sd 0.01, t(0.975, 2) = 4.302653: half-width 0.024841
    assert row["accuracy"] == pytest.approx(0.91)
    assert (row["accuracy_low"], row["accuracy_high"]) == pytest.approx(
        (0.91 - 0.0248414, 0.91 + 0.0248414), abs=1e-6)
    assert (row["ece_low"], row["ece_high"]) == pytest.approx((0.05, 0.05))  # no spread
    assert row["attack_tpr_at_low_fpr"] == pytest.approx(0.02)  # the headline attack's
