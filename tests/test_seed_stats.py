"""Statistics over seeds: the t interval, Holm's adjustment, the exact sign-flip test and its
interval, the seeds needed, and the paired verdicts, against numbers worked out by hand, a
brute-force enumeration of sign patterns, G*Power's sample sizes and scipy's paired t-test."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import itertools

from dpclip.reporting.seed_stats import (EXACT_UP_TO, holm, mean_interval, minimum_exact_seeds,
                                         paired_comparison,
                                         paired_test, seed_summary, seeds_needed, sign_flip_test,
                                         verdict)


def test_the_t_interval_by_hand():
    # 1, 2, 3: mean 2, sd 1, t(0.975, 2) = 4.302653: 2 +- 4.302653 / sqrt 3
    mean, low, high = mean_interval([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert (low, high) == pytest.approx((2 - 2.484138, 2 + 2.484138), abs=1e-6)
    assert mean_interval([0.5]) == (0.5, None, None)  # one seed: no interval
    assert mean_interval([0.5, 0.5]) == (0.5, 0.5, 0.5)
    assert mean_interval([1.0, None, 3.0])[0] == 2.0  # missing values are left out


def test_an_interval_stays_inside_the_metrics_range():
    """What a user saw: ECE [-0.0695, 0.263]. ECE 0, 0 and 0.3 over three seeds: mean 0.1, sd
    0.1732, t(0.975, 2) 4.302653: 0.1 +- 0.4303, cut to [0, 0.5303]."""
    mean, low, high = mean_interval([0.0, 0.0, 0.3], bounds=(0.0, 1.0))
    assert (mean, low) == (pytest.approx(0.1), 0.0)
    assert high == pytest.approx(0.1 + 4.302653 * 0.1732051 / 3 ** 0.5, abs=1e-5)
    rows = [[f"m-{s}", "m", 8.0, "iid", s, 0.99 + 0.01 * (s == 0), e, 0.5, 0.0, None, None]
            for s, e in enumerate([0.0, 0.0, 0.3])]
    summary = seed_summary(_table(rows)).iloc[0]
    assert summary["ece_low"] == 0.0 and summary["accuracy_high"] == 1.0
    assert summary["attack_tpr_at_low_fpr_low"] == 0.0


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04 (m = 3): 3 x 0.01 = 0.03, 2 x 0.03 = 0.06, max(0.06, 1 x 0.04)
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    adjusted = holm([0.02, math.nan])  # a missing p is not in the family
    assert adjusted[0] == pytest.approx(0.02) and math.isnan(adjusted[1])


def _table(rows):
    return pd.DataFrame(rows, columns=["run", "method", "target_epsilon", "alpha", "seed",
                                       "accuracy", "ece", "attack_auc",
                                       "attack_tpr_at_low_fpr", "audit_whitebox",
                                       "audit_blackbox"])


def _runs(method, accuracies, ece=0.05, audit=1.0):
    return [[f"{method}-{s}", method, 8.0, "iid", s, a, ece, 0.55, 0.01, audit, None]
            for s, a in enumerate(accuracies)]


@pytest.fixture
def table():
    base = [0.90, 0.92, 0.91, 0.93, 0.89]
    better = [a + d for a, d in zip(base, [0.031, 0.029, 0.030, 0.032, 0.028])]
    noisy = [a + d for a, d in zip(base, [0.02, -0.03, 0.01, -0.01, 0.005])]
    return _table(_runs("dp_sgd", base) + _runs("auto_s", better) + _runs("dc_sgd_p", noisy)
                  + _runs("ww_dp_sgd", base))


def test_paired_verdicts_follow_the_seeds(table):
    # 5 seeds: the exact sign-flip test. auto_s gains on every seed: p = 2 / 2^5 = 0.0625,
    # not below 5% (no 5-seed comparison can be); Holm over three is capped at 1 - 0.0625 x 3
    paired = paired_comparison(table).set_index(["method", "metric"])
    better = paired.loc[("auto_s", "accuracy")]
    assert better["seeds"] == 5 and better["difference"] == pytest.approx(0.03)
    assert better["p"] == pytest.approx(0.0625)
    assert better["p_holm"] == pytest.approx(3 * 0.0625)
    assert better["verdict"] == "not distinguishable"
    identical = paired.loc[("ww_dp_sgd", "accuracy")]
    assert identical["p"] == 1.0 and identical["verdict"] == "not distinguishable"
    assert paired.loc[("auto_s", "ece")]["verdict"] == "not distinguishable"  # equal ECE
    assert "audit_epsilon" not in paired.reset_index()["metric"].tolist()  # not judged


def test_beyond_sixteen_seeds_the_paired_t_test():
    from scipy import stats

    rng = np.random.default_rng(3)
    base = rng.uniform(0.85, 0.95, 20)
    gains = rng.normal(0.01, 0.004, 20)
    rows = _runs("dp_sgd", base) + _runs("auto_s", base + gains)
    row = paired_comparison(_table(rows)).set_index(["method", "metric"]).loc[
        ("auto_s", "accuracy")]
    d = (base + gains) - base
    assert row["p"] == pytest.approx(max(stats.ttest_1samp(d, 0).pvalue, 2.0 ** -19))
    assert row["verdict"] == "better"
    interval = stats.t.interval(0.95, 19, d.mean(), stats.sem(d))
    assert (row["difference_low"], row["difference_high"]) == pytest.approx(interval)


def _brute_force_p(d):
    """The two-sided sign-flip p by enumerating the 2^n sign patterns of the sum."""
    observed = sum(d)
    sums = [sum(s * v for s, v in zip(signs, d))
            for signs in itertools.product((1, -1), repeat=len(d))]
    up = sum(t >= observed - 1e-12 for t in sums) / len(sums)
    down = sum(t <= observed + 1e-12 for t in sums) / len(sums)
    return min(1.0, 2 * min(up, down))


def test_the_sign_flip_test_by_hand_and_by_enumeration():
    # two seeds: p = 0.5 for any two same-sign differences (the three cases), no bound
    for d in ([0.020, 0.021], [0.02, 0.02], [0.01, 0.0100001]):
        assert sign_flip_test(d) == (0.5, -math.inf, math.inf)
    assert sign_flip_test([0.0, 0.0])[0] == 1.0
    assert sign_flip_test([0.01, 0.02, 0.03])[0] == 0.25  # three seeds: 2 / 8
    # 1..6: p = 2 / 64; k = floor(0.05 x 32) = 1: [smallest, largest] subset mean = [1, 6]
    assert sign_flip_test([1, 2, 3, 4, 5, 6]) == (pytest.approx(2 / 64), 1.0, 6.0)
    # 1..7: k = floor(0.05 x 64) = 3; subset means from below: 1 ({1}), 1.5 ({1,2}), 2 ({2}
    # and {1,2,3}): M_(3) = 2, and 6 from above by symmetry about 4; p = 2 / 128
    assert sign_flip_test([1, 2, 3, 4, 5, 6, 7]) == (pytest.approx(2 / 128), 2.0, 6.0)
    rng = np.random.default_rng(0)
    for n in (3, 6, 8, 11):
        d = rng.normal(0.3, 1.0, n)
        p, low, high = sign_flip_test(d)
        assert p == pytest.approx(_brute_force_p(d))
        # the interval is the set of shifts the test does not reject at 5%
        for shift in np.linspace(d.min() - 1, d.max() + 1, 41):
            inside = (low < shift < high) if math.isfinite(low) else True
            if not np.isclose(shift, [low, high]).any():
                assert inside == (_brute_force_p(d - shift) > 0.05)
    with pytest.raises(ValueError, match="1 to 16"):
        sign_flip_test(np.zeros(EXACT_UP_TO + 1))


def test_paired_test_never_goes_below_the_exact_floor():
    # the df = 1 t-test gave p = 0.0155 and 3e-6 for two of these; the exact floor is 0.5
    assert paired_test([0.020, 0.021])[3] == 0.5
    assert paired_test([0.01, 0.0100001])[3] == 0.5
    assert math.isnan(paired_test([0.01])[3])


def test_seeds_needed_matches_g_power():
    # paired t-test, two-sided 5%, power 80% (G*Power: d = 1 -> 10, d = 0.5 -> 34); up to 16
    # seeds the exact sign-flip test's own power decides, which at d = 1 also reaches 80% at 10
    assert seeds_needed(spread=1.0, effect=1.0) == 10
    assert seeds_needed(spread=2.0, effect=-1.0) == 34
    assert seeds_needed(spread=0.1, effect=5.0) == 6  # never below the exact test's minimum
    assert seeds_needed(spread=0.0, effect=0.1) == 6
    assert seeds_needed(spread=1.0, effect=0.0) is None
    assert seeds_needed(spread=1.0, effect=0.01) is None  # more than 1000


def test_lower_is_better_for_ece_and_attacks():
    assert verdict(-0.01, 0.001, 5, higher_is_better=False) == "better"
    assert verdict(0.01, 0.001, 5, higher_is_better=False) == "worse"
    assert verdict(0.01, 0.2, 5, higher_is_better=True) == "not distinguishable"
    assert verdict(0.01, math.nan, 1, higher_is_better=True).startswith("not tested")


def test_seed_summary_has_a_mean_and_interval_per_configuration(table):
    summary = seed_summary(table).set_index("method")
    assert summary.loc["dp_sgd", "seeds"] == 5
    assert summary.loc["dp_sgd", "accuracy"] == pytest.approx(0.91)
    low, high = summary.loc["dp_sgd", ["accuracy_low", "accuracy_high"]]
    assert low < 0.91 < high
    # the audited bounds: the per-seed range (each run's larger kind), never a mean
    assert summary.loc["dp_sgd", "audit_epsilon_min"] == 1.0
    assert "audit_epsilon" not in summary.columns
    spread = table.assign(audit_whitebox=[0.5, 2.0, 1.0, 1.5, 0.7] * 4)
    ranged = seed_summary(spread).set_index("method")
    assert ranged.loc["dp_sgd", ["audit_epsilon_min", "audit_epsilon_max"]].tolist() == [0.5, 2.0]
    one = seed_summary(table[table.seed == 0])
    assert one["accuracy_low"].isna().all() and (one["seeds"] == 1).all()
    assert np.isnan(paired_comparison(table[table.seed == 0])["p"]).all()


def test_a_constant_difference_is_not_certainty():
    # the same +0.01 on every seed (up to float rounding: 0.1 + 0.01 - 0.1 is not 0.01):
    # t is undefined; the exact sign-flip p is 2^(1 - n)
    base = [0.1, 0.2, 0.3, 0.7, 0.9, 0.55]
    assert len({a + 0.01 - a for a in base}) > 1
    rows = _runs("dp_sgd", base) + _runs("auto_s", [a + 0.01 for a in base])
    two = paired_comparison(_table([r for r in rows if r[4] < 2])).set_index("metric")
    assert two.loc["accuracy", "p"] == pytest.approx(0.5)
    assert two.loc["accuracy", "verdict"] == "not distinguishable"
    six = paired_comparison(_table(rows)).set_index("metric")
    assert six.loc["accuracy", "p"] == pytest.approx(2 ** -5)
    # significant by its p, but the interval [0.01, 0.01] has no width: it decides nothing
    assert six.loc["accuracy", "difference_low"] == pytest.approx(0.01)
    assert six.loc["accuracy", "verdict"] == "not distinguishable (no spread over seeds)"
    varied = rows[:6] + _runs("auto_s", [a + 0.01 + 0.001 * i for i, a in enumerate(base)])
    assert paired_comparison(_table(varied)).set_index("metric").loc[
        "accuracy", "verdict"] == "better"


def test_the_exact_tests_power_is_below_the_t_tests_at_small_n():
    """Checked against an independent simulation calling the test itself: at d = 1.5 the
    t-test reaches 80% at 6 seeds (G*Power: 0.82), the exact sign-flip test only at 7, because
    at 6 seeds it rejects only when every sign agrees (p = 2/64)."""
    from scipy import stats

    from dpclip.reporting.seed_stats import sign_flip_power

    def simulated(n, ratio, draws=600):
        rng = np.random.default_rng(99)
        return np.mean([sign_flip_test(rng.normal(ratio, 1.0, n))[0] <= 0.05
                        for _ in range(draws)])

    for n in (6, 7, 10):  # within about 3 standard errors of the 600-draw check
        assert abs(sign_flip_power(n, 1.5) - simulated(n, 1.5)) < 0.06
    # at 6 seeds: P(all six positive) + P(all negative) for N(1.5, 1) draws
    every_sign = stats.norm.cdf(1.5) ** 6 + stats.norm.cdf(-1.5) ** 6
    assert sign_flip_power(6, 1.5) == pytest.approx(every_sign, abs=0.03)
    assert every_sign < 0.8 and sign_flip_power(7, 1.5) >= 0.8
    assert seeds_needed(spread=1.0, effect=1.5) == 7


@pytest.mark.parametrize("family, least", [(1, 6), (2, 7), (3, 7), (4, 8), (6, 8), (7, 9)])
def test_seeds_needed_counts_the_correction_over_configurations(family, least):
    """m 2^(1-n) <= 0.05, worked out by hand: n >= 1 + log2(20 m); a huge effect needs just
    that many seeds, never fewer."""
    assert minimum_exact_seeds(family=family) == least
    assert seeds_needed(spread=0.001, effect=1.0, family=family) == least
