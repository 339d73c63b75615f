"""Statistics over training seeds: a mean with its confidence interval per configuration, and a
paired comparison of every method with a baseline (``dp_sgd``), corrected for the number of
methods compared.

Runs of one (target epsilon, alpha) that share a training seed share the partition and, where
the method allows it, the initialisation and the Poisson draws, so a method and the baseline are
compared seed by seed (paired). For each headline metric and method, with d_s = metric(method,
seed s) - metric(baseline, seed s) over the n seeds both ran:

    mean  d = (1/n) sum d_s,   sd  s_d = sqrt( sum (d_s - d)^2 / (n - 1) ),
    interval  d +- t_{0.975, n-1} s_d / sqrt(n),   p = 2 P(T_{n-1} > |d| sqrt(n) / s_d)

(the paired t-test: a one-sample t-test of the differences, ``scipy.stats.ttest_1samp``).
Differences without spread leave t undefined: zero everywhere (identical runs) has p = 1, and
the same non-zero value everywhere gets the exact sign-flip test's p = 2^(1 - n) (all n signs
agree; 0.5 for two seeds): no spread is not certainty, and TPRs on a few hundred records are
coarse enough to tie. The p-values of the methods compared with the
baseline on one metric and (epsilon, alpha) form a family, adjusted by Holm's step-down rule:
with the m p-values sorted, p_(1) <= ... <= p_(m), the adjusted p_(i) is
max_{j <= i} min(1, (m - j + 1) p_(j)). The verdict is "better" or "worse" (by the metric's
direction) when the adjusted p is below 0.05, else "not distinguishable"; with fewer than two
paired seeds nothing is tested.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

CONFIDENCE = 0.95
BASELINE = "dp_sgd"
# headline metric (a comparison-table column) -> True when higher is better; None: reported
# with its interval but not judged (a larger audited lower bound is neither better nor worse)
HEADLINE = {"accuracy": True, "ece": False, "strongest_auc": False,
            "strongest_tpr_at_fpr_0.1pct": False, "audit_epsilon": None}
CONFIGURATION = ["target_epsilon", "alpha", "method"]


def mean_interval(values, confidence: float = CONFIDENCE) -> tuple[float, float | None,
                                                                   float | None]:
    """(mean, lower, upper) of the Student t interval of the mean; no interval for fewer than
    two values, and a zero-width one when they are all equal."""
    from scipy import stats

    values = np.asarray([v for v in values if v is not None and not pd.isna(v)], dtype=float)
    if len(values) == 0:
        return math.nan, None, None
    mean = float(values.mean())
    if len(values) < 2:
        return mean, None, None
    half = float(stats.t.ppf(0.5 + confidence / 2, len(values) - 1) * values.std(ddof=1)
                 / math.sqrt(len(values)))
    return mean, mean - half, mean + half


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values (module docstring); NaN stays NaN and is not counted
    in the family."""
    p = np.asarray(pvalues, dtype=float)
    adjusted = np.full_like(p, np.nan)
    valid = np.flatnonzero(~np.isnan(p))
    order = valid[np.argsort(p[valid], kind="stable")]
    m, running = len(order), 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[index]))
        adjusted[index] = running
    return adjusted


def with_headline(table: pd.DataFrame) -> pd.DataFrame:
    """The comparison table with ``audit_epsilon``: the larger audited lower bound of a run."""
    audit = table[["audit_whitebox", "audit_blackbox"]].astype(float).max(axis=1)
    return table.assign(audit_epsilon=audit)


def seed_summary(table: pd.DataFrame, confidence: float = CONFIDENCE) -> pd.DataFrame:
    """Per (target epsilon, alpha, method): the number of seeds and, per headline metric, its
    mean and interval (``<metric>``, ``<metric>_low``, ``<metric>_high``)."""
    table = with_headline(table)
    rows = []
    for key, group in table.groupby(CONFIGURATION, sort=False, dropna=False):
        row = dict(zip(CONFIGURATION, key), seeds=int(group["seed"].nunique()))
        for metric in HEADLINE:
            row[metric], row[f"{metric}_low"], row[f"{metric}_high"] = mean_interval(
                group[metric], confidence)
        rows.append(row)
    return pd.DataFrame(rows)


def paired_comparison(table: pd.DataFrame, baseline: str = BASELINE,
                      confidence: float = CONFIDENCE) -> pd.DataFrame:
    """One row per (target epsilon, alpha, method other than ``baseline``, judged metric): the
    paired seeds, the mean difference (method - baseline) with its interval, the paired t-test's
    p, Holm's adjusted p over the methods, and the verdict (module docstring)."""

    table = with_headline(table)
    rows = []
    for (epsilon, alpha), group in table.groupby(["target_epsilon", "alpha"], sort=False,
                                                 dropna=False):
        base = group[group["method"] == baseline].set_index("seed")
        for method in (m for m in group["method"].unique() if m != baseline):
            mine = group[group["method"] == method].set_index("seed")
            seeds = sorted(set(mine.index) & set(base.index))
            for metric, higher_better in HEADLINE.items():
                if higher_better is None:
                    continue
                d = (mine.loc[seeds, metric].astype(float)
                     - base.loc[seeds, metric].astype(float)).dropna().to_numpy()
                mean, low, high, p = paired_test(d, confidence)
                rows.append({"target_epsilon": epsilon, "alpha": alpha, "method": method,
                             "baseline": baseline, "metric": metric, "seeds": int(len(d)),
                             "difference": mean, "difference_low": low,
                             "difference_high": high, "p": p, "higher_is_better": higher_better})
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    frame["p_holm"] = np.nan
    for _, family in frame.groupby(["target_epsilon", "alpha", "metric"], sort=False,
                                   dropna=False):
        frame.loc[family.index, "p_holm"] = holm(family["p"])
    frame["verdict"] = [verdict(r.difference, r.p_holm, r.seeds, r.higher_is_better,
                                1 - confidence) for r in frame.itertuples()]
    return frame


def paired_test(d, confidence: float = CONFIDENCE) -> tuple[float, float | None,
                                                              float | None, float]:
    """(mean, lower, upper, p) of paired differences ``d``: the t interval of the mean and the
    paired t-test's two-sided p (NaN below two pairs). Differences with no spread make t 0/0 or
    infinite: p is then 1 for zero differences, else the exact sign-flip test's 2^(1-n)."""
    from scipy import stats

    d = np.asarray(d, dtype=float)
    mean, low, high = mean_interval(d, confidence)
    p = math.nan
    # no spread, up to rounding (a difference of rates is a difference of floats)
    if len(d) >= 2 and np.allclose(d, d[0], rtol=1e-9, atol=1e-12):
        p = 1.0 if abs(d[0]) <= 1e-12 else 2.0 ** (1 - len(d))
    elif len(d) >= 2:
        p = float(stats.ttest_1samp(d, 0.0).pvalue)
    return mean, low, high, p


def verdict(difference: float, p_adjusted: float, seeds: int, higher_is_better: bool,
            alpha: float = 1 - CONFIDENCE) -> str:
    if seeds < 2 or pd.isna(p_adjusted):
        return "not tested (fewer than two paired seeds)"
    if p_adjusted >= alpha:
        return "not distinguishable"
    return "better" if (difference > 0) == higher_is_better else "worse"
