"""Calibration and attack metrics against numbers worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpclip.errors import DpclipError
from dpclip.metrics import (attack_metrics, calibration_metrics, clopper_pearson_limits,
                            dp_bound_check,
                            dp_bound_unchecked, family_confidence, membership_game_bound,
                            roc_points)


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


def test_tpr_at_low_fpr_keeps_thresholds_on_a_straight_stretch_of_the_roc():
    # of 300 each, a member and a non-member tie at scores 4, 3, 2 and 1: the ROC points k/300
    # (k = 1..4) lie on one line, and the threshold 2 reaches FPR 3/300 = 1% exactly (scikit-
    # learn's default drops it as collinear: the TPR at 1% FPR would read 2/300)
    members = np.r_[4.0, 3.0, 2.0, 1.0, np.full(296, -10.0)]
    nonmembers = np.r_[4.0, 3.0, 2.0, 1.0, np.full(296, -5.0)]
    assert attack_metrics(members, nonmembers)["tpr_at_fpr_1pct"] == pytest.approx(0.01)


def test_tpr_at_low_fpr_comes_with_its_exact_binomial_interval():
    from scipy.stats import binomtest

    # 40 members, 12 of them above every non-member: TPR 0.3 at FPR 0
    members = np.r_[np.full(12, 10.0), np.zeros(28)]
    m = attack_metrics(members, np.arange(1.0, 201.0) / 1000)
    assert m["tpr_at_fpr_0.1pct"] == pytest.approx(0.3)
    exact = binomtest(12, 40).proportion_ci(0.95, method="exact")  # scipy's Clopper-Pearson
    assert m["tpr_at_fpr_0.1pct_ci95"] == pytest.approx([exact.low, exact.high])
    assert m["tpr_at_fpr_1pct_ci95"] == pytest.approx([exact.low, exact.high])  # 2 of 200 > 1%
    # no member found: the interval still says how many could hide, [0, 1 - 0.025^(1/40)]
    none = attack_metrics(np.zeros(40), np.ones(200))
    assert none["tpr_at_fpr_0.1pct_ci95"] == pytest.approx([0.0, 1 - 0.025 ** (1 / 40)])


def test_dp_bound_flags_an_impossible_attack_and_not_a_weak_one():
    fpr, tpr = np.array([0.0, 0.0, 1.0]), np.array([0.0, 1.0, 1.0])
    strong = dp_bound_check(fpr, tpr, 1000, 1000, epsilon=0.1, delta=1e-5)
    assert strong["violated"]
    weak = dp_bound_check(np.array([0.0, 0.5, 1.0]), np.array([0.0, 0.52, 1.0]), 1000, 1000,
                          epsilon=1.0, delta=1e-5)
    assert not weak["violated"]


# --- the DP-bound check (items 8/9) ----------------------------------------------------------


def test_game_bound_per_adjacency_hand_values():
    # replace-one is the game's own neighbouring notion: the run's (eps, delta) as is
    assert membership_game_bound("replace_one_features", 1.0, 1e-5) == (1.0, 1e-5)
    # add/remove: two steps, group privacy (2 eps, (1 + e^eps) delta);
    # e^1 = 2.718281828459045 -> delta' = 3.718281828459045e-5
    eps, delta = membership_game_bound("add_remove", 1.0, 1e-5)
    assert eps == 2.0 and delta == pytest.approx(3.718281828459045e-5, rel=1e-12)
    # e^0.5 = 1.6487212707001282 -> delta' = 2.6487212707001282e-6
    assert membership_game_bound("add_remove", 0.5, 1e-6) == \
        pytest.approx((1.0, 2.6487212707001282e-6), rel=1e-12)
    # a record without adjacency (written before it existed) is read as add_remove
    assert membership_game_bound(None, 0.5, 1e-6) == membership_game_bound("add_remove", 0.5, 1e-6)
    with pytest.raises(DpclipError, match="privacy.adjacency"):
        membership_game_bound("replace_one", 1.0, 1e-5)


@pytest.mark.parametrize("adjacency, eps_used", [("replace_one_features", 1.0),
                                                 ("add_remove", 2.0)])
def test_perfect_attack_margin_from_closed_form_limits(adjacency, eps_used):
    # ROC (0,0), (0,1), (1,1) of a perfect attack on 100 members and 100 non-members.
    # 100 + 100 + 1 possible thresholds x 2 one-sided limits -> each at level a = 0.05 / 402.
    # Exact limits for a count of n of n and 0 of n: TPR_lo = a^(1/n), FPR_hi = 1 - a^(1/n).
    # At (0, 1) both directions give the same margin: lo - (e^eps' (1 - lo) + delta') (here
    # lo = 0.914003...).
    lo = (0.05 / 402) ** (1 / 100)
    _, delta_used = membership_game_bound(adjacency, 1.0, 1e-5)
    check = dp_bound_check(np.array([0.0, 0.0, 1.0]), np.array([0.0, 1.0, 1.0]), 100, 100,
                           epsilon=1.0, delta=1e-5, adjacency=adjacency)
    assert lo == pytest.approx(0.914003, abs=1e-6)
    assert check["worst_margin"] == pytest.approx(lo - (np.exp(eps_used) * (1 - lo) + delta_used),
                                                  rel=1e-9)
    assert check["violated"] and check["points"] == 3 and check["checked"]
    assert (check["epsilon_used"], check["adjacency"]) == (eps_used, adjacency)
    assert (check["worst_at"]["fpr"], check["worst_at"]["tpr"]) == (0.0, 1.0)


def test_the_second_direction_catches_what_the_first_misses():
    # At (FPR, TPR) = (0.5, 0.99), eps' = 1: direction 1 holds (0.99 <= e * 0.5 = 1.36), but
    # 1 - FPR = 0.5 > e * (1 - TPR) = 0.027: an attack that almost never misses a member while
    # clearing half the non-members is impossible under the bound.
    check = dp_bound_check(np.array([0.0, 0.5, 1.0]), np.array([0.0, 0.99, 1.0]), 1000, 1000,
                           epsilon=1.0, delta=1e-5, adjacency="replace_one_features")
    assert check["violated"]
    assert check["worst_at"]["direction"].startswith("1 - fpr")
    assert 0.3 < check["worst_margin"] < 0.5  # about 0.45 - e * 0.02 with sampling margins


def _laplace_attack(rng, n, scale):
    """Scores of n members ~ Laplace(1, scale) and n non-members ~ Laplace(0, scale). With
    scale = 1/eps the ROC lies exactly on both eps-DP lines: for thresholds t >= 1,
    TPR = e^(-(t-1) eps) / 2 = e^eps FPR; for t <= 0, 1 - FPR = e^eps (1 - TPR)."""
    return roc_points(rng.laplace(1.0, scale, n), rng.laplace(0.0, scale, n))


def test_an_attack_exactly_at_the_bound_rarely_cries_wolf_and_pointwise_would():
    rng = np.random.default_rng(0)
    n, trials, eps = 1000, 150, 1.0
    alarms, pointwise = 0, 0
    for _ in range(trials):
        fpr, tpr = _laplace_attack(rng, n, 1.0 / eps)
        alarms += dp_bound_check(fpr, tpr, n, n, eps, 0.0, "replace_one_features")["violated"]
        # the same margins from per-point 95% intervals (no simultaneity)
        tpr_lo, _ = clopper_pearson_limits(np.round(tpr * n), n, 0.025)
        _, fpr_hi = clopper_pearson_limits(np.round(fpr * n), n, 0.025)
        margins = np.maximum(tpr_lo - np.exp(eps) * fpr_hi,
                             (1 - fpr_hi) - np.exp(eps) * (1 - tpr_lo))
        pointwise += bool(margins.max() > 0)
    assert alarms / trials <= 0.05
    assert pointwise / trials > 0.05  # chance crossings of single points: why the band


@pytest.mark.parametrize("true_eps", [2.0, 3.0])
def test_a_real_violation_is_found(true_eps):
    # a mechanism with true epsilon 2 or 3 claiming 1 (replace-one), 1000 records a side
    fpr, tpr = _laplace_attack(np.random.default_rng(1), 1000, 1.0 / true_eps)
    check = dp_bound_check(fpr, tpr, 1000, 1000, 1.0, 1e-5, "replace_one_features")
    assert check["violated"] and check["worst_margin"] > 0.1
    # the same ROC under add_remove (eps' = 2): true eps 3 still breaks it, true eps 2 does not
    loose = dp_bound_check(fpr, tpr, 1000, 1000, 1.0, 1e-5, "add_remove")
    assert loose["violated"] == (true_eps > 2.0)


def test_unchecked_runs_say_why():
    assert dp_bound_unchecked({"epsilon": None, "dp_guarantee": False})["reason"].startswith(
        "non-private")
    assert "dp_guarantee false" in dp_bound_unchecked({"epsilon": 3.0, "dp_guarantee": False})[
        "reason"]
    assert dp_bound_unchecked({"epsilon": 3.0, "dp_guarantee": True}) is None


def test_dp_bound_band_does_not_depend_on_how_many_points_the_roc_shows():
    """The Bonferroni count is fixed by the set sizes (n_in + n_out + 1 thresholds), so adding
    collinear points to the same ROC leaves every limit, and the worst margin, unchanged."""
    corners = dp_bound_check(np.array([0.0, 0.01, 1.0]), np.array([0.0, 0.3, 1.0]), 500, 400,
                             epsilon=1.0, delta=1e-5)
    dense = dp_bound_check(np.array([0.0, 0.01, 0.5, 0.75, 1.0]),
                           np.array([0.0, 0.3, 0.65, 0.825, 1.0]), 500, 400,
                           epsilon=1.0, delta=1e-5)
    assert dense["worst_margin"] == corners["worst_margin"]
    assert corners["bonferroni_limits"] == dense["bonferroni_limits"] == 2 * (500 + 400 + 1)


def test_dp_bound_limits_at_the_corners_by_hand():
    """The ROC (0, 0) - (1, 1) of a useless attack, 500 members and 400 non-members, alpha
    0.05 split over 2 (500 + 400 + 1) = 1802 one-sided limits. At (0, 0): 0 of 400 non-members
    gives the upper FPR limit 1 - (alpha / 1802)^(1/400). At (1, 1): 500 of 500 members gives
    the lower TPR limit (alpha / 1802)^(1/500), so direction (2) has the margin
    0 - (e^2 (1 - (alpha / 1802)^(1/500)) + (1 + e) 1e-5) at eps' = 2 (add_remove, eps 1),
    the larger of the two corners' margins (500 > 400)."""
    check = dp_bound_check(np.array([0.0, 1.0]), np.array([0.0, 1.0]), 500, 400,
                           epsilon=1.0, delta=1e-5)
    delta_used = (1 + math.e) * 1e-5
    at_origin = -(math.exp(2.0) * (1 - (0.05 / 1802) ** (1 / 400)) + delta_used)
    at_top = -(math.exp(2.0) * (1 - (0.05 / 1802) ** (1 / 500)) + delta_used)
    assert at_top > at_origin
    assert check["worst_margin"] == pytest.approx(at_top, rel=1e-9)
    assert check["worst_at"]["fpr"] == 1.0 and check["worst_at"]["direction"].startswith("1 -")


def test_family_confidence_splits_the_run_level_error():
    assert family_confidence(1) == pytest.approx(0.95)
    assert family_confidence(5) == pytest.approx(0.99)


def test_classifier_auc_by_hand():
    from dpclip.metrics import classifier_auc

    # positives 0.35, 0.8 against negatives 0.1, 0.4: 3 of the 4 pairs ordered -> 0.75
    probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.65, 0.35], [0.2, 0.8]])
    assert classifier_auc(probs, np.array([0, 0, 1, 1])) == pytest.approx(0.75)
    # three classes, each ranked perfectly against the rest but class 2, ranked 0.5 (a tie)
    probs = np.array([[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.45, 0.45, 0.1], [0.45, 0.45, 0.1]])
    labels = np.array([0, 1, 2, 2])
    # class 0: 0.8 vs 0.1, 0.45, 0.45 -> 1; class 1 likewise -> 1; class 2: 0.1 vs 0.1 ties -> 0.5
    assert classifier_auc(probs, labels) == pytest.approx((1 + 1 + 0.5) / 3)
    assert classifier_auc(probs[:2], np.array([0, 0])) is None


def test_classifier_auc_of_a_diverged_model_is_none():
    from dpclip.metrics import classifier_auc

    probs = np.array([[np.nan, np.nan], [0.5, 0.5]])
    assert classifier_auc(probs, np.array([0, 1])) is None


def test_low_fpr_is_reported_only_where_the_non_members_allow_ten_false_positives():
    from dpclip.metrics import low_fpr_level, meaningful_fpr

    # 354 non-members (the default): 0.1% allows 0.35 false positives, 1% 3.54; the honest
    # low-FPR point is 10 / 354 = 2.82%; 10,000 non-members allow 10 at 0.1%
    assert not meaningful_fpr(0.001, 354) and not meaningful_fpr(0.01, 354)
    assert meaningful_fpr(0.01, 1000) and meaningful_fpr(0.001, 10_000)
    assert low_fpr_level(354) == pytest.approx(10 / 354)
    assert low_fpr_level(1000) == pytest.approx(0.01)
    assert low_fpr_level(50_000) == 0.001
    rng = np.random.default_rng(0)
    members, nonmembers = rng.normal(1.0, 1.0, 354), rng.normal(0.0, 1.0, 354)
    result = attack_metrics(members, nonmembers)
    low = result["low_fpr"]
    assert low["fpr"] == pytest.approx(10 / 354) and low["false_positives_allowed"] == 10
    # by hand: the members above the 11th highest non-member score (10 false positives)
    threshold = np.sort(nonmembers)[-11]
    assert low["tpr"] == pytest.approx(np.mean(members > threshold))
    assert result["tpr_at_zero_fp"] == pytest.approx(np.mean(members > nonmembers.max()))
    assert result["tpr_at_fpr_0.1pct"] == result["tpr_at_zero_fp"]  # the same thing here
    assert result["tpr_at_fpr_0.1pct_meaningful"] is False


def test_the_strongest_attack_is_picked_at_the_honest_low_fpr_not_at_zero_false_positives():
    """With 354 non-members the TPR at 0.1% FPR is a TPR at no false positive: the audit saw
    the "strongest attack" picked by it. The TPR at the honest low FPR decides."""
    from dpclip.metrics import strongest_attack

    mia = {"loss": {"auc": 0.55, "tpr_at_fpr_0.1pct": 0.02, "low_fpr": {"tpr": 0.03}},
           "lira": {"auc": 0.58, "tpr_at_fpr_0.1pct": 0.00, "low_fpr": {"tpr": 0.06}}}
    assert strongest_attack(mia)[0] == "lira"
