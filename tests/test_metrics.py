"""Calibration and attack metrics against numbers worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from dpclip.metrics import attack_metrics, calibration_metrics, dp_bound_check


def test_ece_mce_on_a_crafted_example():
    # Two classes, 4 records, 2 bins ((0, 0.5], (0.5, 1]).
    # Top-label confidences 0.9, 0.8 (bin 2) and 0.5, 0.5 (bin 1: 0.5 is in (0, 0.5]).
    probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.5, 0.5], [0.5, 0.5]])
    labels = np.array([0, 0, 0, 1])
    # bin 2: records 0 (correct) and 1 (wrong): acc 0.5, conf 0.85, gap 0.35, weight 1/2
    # bin 1: argmax of [0.5, 0.5] is class 0: record 2 correct, record 3 wrong:
    #        acc 0.5, conf 0.5, gap 0, weight 1/2
    m = calibration_metrics(probs, labels, n_bins=2)
    assert m["ece"] == pytest.approx(0.5 * 0.35)
    assert m["mce"] == pytest.approx(0.35)
    assert m["accuracy"] == pytest.approx(0.5)
    # Brier: (0.01+0.01) + (0.64+0.64) + (0.25+0.25) + (0.25+0.25) = 2.3, mean 0.575
    assert m["brier"] == pytest.approx(0.575)
    # NLL: -(log 0.9 + log 0.2 + log 0.5 + log 0.5) / 4
    assert m["nll"] == pytest.approx(-(np.log(0.9) + np.log(0.2) + 2 * np.log(0.5)) / 4)


def test_ece_fifteen_bins_hand_case():
    # 0.95 (correct) and 0.95 (wrong) fall in bin (14/15, 1]: acc 0.5, conf 0.95, gap 0.45
    # 0.35 (argmax = first of the tied classes 1 and 2 = class 1, correct) falls in bin
    # (5/15, 6/15]: acc 1, conf 0.35, gap 0.65
    probs = np.array([[0.95, 0.05, 0.0], [0.95, 0.05, 0.0], [0.3, 0.35, 0.35]])
    labels = np.array([0, 1, 1])
    m = calibration_metrics(probs, labels, n_bins=15)
    assert m["ece"] == pytest.approx(2 / 3 * 0.45 + 1 / 3 * 0.65)
    assert m["mce"] == pytest.approx(0.65)


def test_attack_auc_near_half_on_identical_distributions():
    rng = np.random.default_rng(0)
    m = attack_metrics(rng.normal(size=5000), rng.normal(size=5000))
    assert abs(m["auc"] - 0.5) < 0.02
    assert m["balanced_accuracy"] < 0.53


def test_attack_auc_near_one_on_separated_scores():
    rng = np.random.default_rng(0)
    m = attack_metrics(rng.normal(10, 1, size=500), rng.normal(0, 1, size=500))
    assert m["auc"] > 0.999
    assert m["tpr_at_fpr_1pct"] > 0.99
    assert m["balanced_accuracy"] > 0.99


def test_tpr_at_low_fpr_hand_case():
    # members 3, 2, 1; non-members 0, -1 ... thresholds give a perfect split
    m = attack_metrics(np.array([3.0, 2.0, 1.0]), np.array([0.0, -1.0, 2.5]))
    # at FPR 0 the best threshold admits only score 3 -> TPR 1/3
    assert m["tpr_at_fpr_0.1pct"] == pytest.approx(1 / 3)
    # AUC: pairs (member > non-member): 3>all(3), 2>0,-1 (2), 1>0,-1 (2) -> 7/9
    assert m["auc"] == pytest.approx(7 / 9)


def test_dp_bound_flags_an_impossible_attack_and_not_a_weak_one():
    fpr, tpr = np.array([0.0, 0.0, 1.0]), np.array([0.0, 1.0, 1.0])
    strong = dp_bound_check(fpr, tpr, 1000, 1000, epsilon=0.1, delta=1e-5)
    assert strong["violated"]
    weak = dp_bound_check(np.array([0.0, 0.5, 1.0]), np.array([0.0, 0.52, 1.0]), 1000, 1000,
                          epsilon=1.0, delta=1e-5)
    assert not weak["violated"]
