"""Statistics over seeds: the t interval, Holm's adjustment and the paired verdicts, against
numbers worked out by hand and scipy's paired t-test."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dpclip.seed_stats import holm, mean_interval, paired_comparison, seed_summary, verdict


def test_the_t_interval_by_hand():
    # 1, 2, 3: mean 2, sd 1, t(0.975, 2) = 4.302653: 2 +- 4.302653 / sqrt 3
    mean, low, high = mean_interval([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert (low, high) == pytest.approx((2 - 2.484138, 2 + 2.484138), abs=1e-6)
    assert mean_interval([0.5]) == (0.5, None, None)  # one seed: no interval
    assert mean_interval([0.5, 0.5]) == (0.5, 0.5, 0.5)
    assert mean_interval([1.0, None, 3.0])[0] == 2.0  # missing values are left out


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04 (m = 3): 3 x 0.01 = 0.03, 2 x 0.03 = 0.06, max(0.06, 1 x 0.04)
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    adjusted = holm([0.02, math.nan])  # a missing p is not in the family
    assert adjusted[0] == pytest.approx(0.02) and math.isnan(adjusted[1])


def _table(rows):
    return pd.DataFrame(rows, columns=["run", "method", "target_epsilon", "alpha", "seed",
                                       "accuracy", "ece", "strongest_auc",
                                       "strongest_tpr_at_fpr_0.1pct", "audit_whitebox",
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
    from scipy import stats

    paired = paired_comparison(table).set_index(["method", "metric"])
    better = paired.loc[("auto_s", "accuracy")]
    assert better["seeds"] == 5 and better["difference"] == pytest.approx(0.03)
    d = table[table.method == "auto_s"].accuracy.to_numpy() - \
        table[table.method == "dp_sgd"].accuracy.to_numpy()
    assert better["p"] == pytest.approx(stats.ttest_rel(
        table[table.method == "auto_s"].accuracy, table[table.method == "dp_sgd"].accuracy
    ).pvalue)
    assert better["p_holm"] == pytest.approx(min(1, 3 * better["p"]))  # the smallest of three
    assert better["verdict"] == "better" and d.mean() == pytest.approx(0.03)
    assert paired.loc[("dc_sgd_p", "accuracy")]["verdict"] == "not distinguishable"
    identical = paired.loc[("ww_dp_sgd", "accuracy")]
    assert identical["p"] == 1.0 and identical["verdict"] == "not distinguishable"
    assert paired.loc[("auto_s", "ece")]["verdict"] == "not distinguishable"  # equal ECE
    assert "audit_epsilon" not in paired.reset_index()["metric"].tolist()  # not judged


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
    assert summary.loc["dp_sgd", "audit_epsilon"] == 1.0  # the larger of the two kinds
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
    assert six.loc["accuracy", "verdict"] == "better"
