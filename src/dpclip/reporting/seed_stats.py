"""Statistics over training seeds: a mean with its confidence interval per configuration, and a
paired comparison of every method with a baseline (``dp_sgd``), corrected for the number of
methods compared: up to :data:`EXACT_UP_TO` paired seeds the exact sign-flip test and the
interval that inverts it, beyond them the paired t-test; Holm's step-down correction; the
verdicts; and :func:`seeds_needed`, the seeds a claim needs at 80% power. The formulas:
docs/statistics.md, "How the tests are computed".
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd

CONFIDENCE = 0.95
POWER = 0.80
EXACT_UP_TO = 16  # seeds: the sign-flip test enumerates 2^n patterns (65,536 at 16)
MAX_SEEDS = 1000  # seeds_needed says "more than this" beyond it
BASELINE = "dp_sgd"
# headline metric (a comparison-table column) -> True when higher is better; None: reported
# with its interval but not judged (a larger audited lower bound is neither better nor worse)
HEADLINE = {"accuracy": True, "ece": False, "attack_auc": False,
            "attack_tpr_at_low_fpr": False, "audit_epsilon": None}
CONFIGURATION = ["target_epsilon", "alpha", "method"]
# the values a headline metric can take: its mean's interval is cut to them (an interval of
# the mean of values in [0, 1] that reaches below 0 says nothing more than one that stops at
# 0, and it reads as a negative ECE)
RANGES = {"accuracy": (0.0, 1.0), "ece": (0.0, 1.0), "attack_auc": (0.0, 1.0),
          "attack_tpr_at_low_fpr": (0.0, 1.0)}


def mean_interval(values, confidence: float = CONFIDENCE,
                  bounds: tuple[float, float] | None = None) -> tuple[float, float | None,
                                                                      float | None]:
    """(mean, lower, upper) of the Student t interval of the mean; no interval for fewer than
    two values, and a zero-width one when they are all equal. With ``bounds`` (the values'
    range), the interval is intersected with it: the mean lies in the range, so the coverage
    is unchanged."""
    from scipy import stats

    values = np.asarray([v for v in values if v is not None and not pd.isna(v)], dtype=float)
    if len(values) == 0:
        return math.nan, None, None
    mean = float(values.mean())
    if len(values) < 2:
        return mean, None, None
    half = float(stats.t.ppf(0.5 + confidence / 2, len(values) - 1) * values.std(ddof=1)
                 / math.sqrt(len(values)))
    low, high = mean - half, mean + half
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return mean, low, high


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values (docs/statistics.md); NaN stays NaN and is not counted
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
    """The comparison table with ``audit_epsilon``: the larger audited lower bound of a run
    (and empty headline columns a table of an older dpclip lacks)."""
    table = table.assign(**{c: math.nan for c in [*HEADLINE, "audit_whitebox", "audit_blackbox"]
                            if c not in table and c != "audit_epsilon"})
    audit = table[["audit_whitebox", "audit_blackbox"]].astype(float).max(axis=1)
    return table.assign(audit_epsilon=audit)


def seed_summary(table: pd.DataFrame, confidence: float = CONFIDENCE) -> pd.DataFrame:
    """Per (target epsilon, alpha, method): the number of seeds and, per headline metric, its
    mean and interval (``<metric>``, ``<metric>_low``, ``<metric>_high``); for the audited
    epsilon, a lower bound per seed, the smallest and largest (``audit_epsilon_min``,
    ``audit_epsilon_max``) instead, since a mean of lower bounds is not a bound."""
    table = with_headline(table)
    rows = []
    for key, group in table.groupby(CONFIGURATION, sort=False, dropna=False):
        row = dict(zip(CONFIGURATION, key), seeds=int(group["seed"].nunique()))
        for metric, judged in HEADLINE.items():
            if judged is None:  # a lower bound per seed: their mean is no bound, so the range
                values = group[metric].astype(float).dropna()
                row[f"{metric}_min"] = float(values.min()) if len(values) else math.nan
                row[f"{metric}_max"] = float(values.max()) if len(values) else math.nan
                continue
            row[metric], row[f"{metric}_low"], row[f"{metric}_high"] = mean_interval(
                group[metric], confidence, RANGES.get(metric))
        rows.append(row)
    return pd.DataFrame(rows)


def paired_comparison(table: pd.DataFrame, baseline: str = BASELINE,
                      confidence: float = CONFIDENCE) -> pd.DataFrame:
    """One row per (target epsilon, alpha, method other than ``baseline``, judged metric): the
    paired seeds, the mean difference (method - baseline) with its interval, the paired t-test's
    p, Holm's adjusted p over the methods, and the verdict (docs/statistics.md)."""

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
                                1 - confidence, (r.difference_low, r.difference_high))
                        for r in frame.itertuples()]
    return frame


def sign_flip_test(d, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(p, lower, upper): the exact two-sided sign-flip test of "no shift" and the interval it
    inverts to (docs/statistics.md), for n = len(d) <= :data:`EXACT_UP_TO` differences. The
    bounds are -inf / +inf when n is too small for any bound at this confidence."""
    d = np.asarray(d, dtype=float)
    n = len(d)
    if not 1 <= n <= EXACT_UP_TO:
        raise ValueError(f"the exact sign-flip test takes 1 to {EXACT_UP_TO} values, not {n}")
    subsets = (np.arange(2 ** n)[:, None] >> np.arange(n)) & 1  # row j: the subset j
    sums = subsets @ d
    tolerance = 1e-12 * max(1.0, float(np.abs(d).sum()))  # sums of floats: equal up to rounding
    p_up = float(np.count_nonzero(sums <= tolerance)) / 2 ** n
    p_down = float(np.count_nonzero(sums >= -tolerance)) / 2 ** n
    p = min(1.0, 2 * min(p_up, p_down))
    means = np.sort(sums[1:] / subsets[1:].sum(axis=1))  # the 2^n - 1 non-empty subsets
    k = math.floor((1 - confidence) * 2 ** (n - 1) + 1e-9)
    if k == 0:
        return p, -math.inf, math.inf
    return p, float(means[k - 1]), float(means[len(means) - k])


def paired_test(d, confidence: float = CONFIDENCE) -> tuple[float, float | None,
                                                              float | None, float]:
    """(mean, lower, upper, p) of paired differences ``d``: up to :data:`EXACT_UP_TO` of them
    the exact sign-flip test and its interval (bounds may be infinite), beyond that the paired
    t-test and its interval with p floored at 2^(1-n); no interval and p NaN below two
    pairs."""
    from scipy import stats

    d = np.asarray([v for v in d if v is not None and not pd.isna(v)], dtype=float)
    if len(d) < 2:
        return (float(d.mean()) if len(d) else math.nan), None, None, math.nan
    mean = float(d.mean())
    if len(d) <= EXACT_UP_TO:
        p, low, high = sign_flip_test(d, confidence)
        return mean, low, high, p
    _, low, high = mean_interval(d, confidence)
    if np.allclose(d, d[0], rtol=1e-9, atol=1e-12):  # t is 0/0 or infinite: sign flips
        p = 1.0 if abs(d[0]) <= 1e-12 else 2.0 ** (1 - len(d))
    else:
        p = max(float(stats.ttest_1samp(d, 0.0).pvalue), 2.0 ** (1 - len(d)))
    return mean, low, high, p


def degenerate(low, high) -> bool:
    """An interval that cannot decide anything: missing, or of zero width (no spread over
    seeds, or a tie of the subset means) up to rounding."""
    if low is None or high is None or pd.isna(low) or pd.isna(high):
        return True
    return math.isfinite(low) and math.isfinite(high) and \
        high - low <= 1e-12 * max(1.0, abs(low), abs(high))


def minimum_exact_seeds(confidence: float = CONFIDENCE, family: int = 1) -> int:
    """The fewest paired seeds at which the sign-flip test can reach significance after Holm's
    correction over ``family`` methods: m 2^(1-n) <= 1 - confidence (6 for one method at 95%,
    9 for eight)."""
    return math.ceil(1 + math.log2(max(1, family) / (1 - confidence)) - 1e-12)


def seeds_needed(spread: float, effect: float, confidence: float = CONFIDENCE,
                 power: float = POWER, family: int = 1) -> int | None:
    """The smallest n >= :func:`minimum_exact_seeds` at which the verdicts' test (sign-flip up to
    :data:`EXACT_UP_TO` seeds, :func:`sign_flip_power`; paired t beyond) rejects "no difference" at
    level (1 - confidence) / ``family`` with probability ``power``, for a true mean difference
    ``effect`` of standard deviation ``spread``. None when the effect is 0 or more than
    :data:`MAX_SEEDS` seeds would be needed; the exact minimum when the spread is 0.
    docs/statistics.md, "How many seeds a claim needs"."""
    from scipy import stats

    confidence = 1 - (1 - confidence) / max(1, family)  # the level each configuration gets
    least = minimum_exact_seeds(confidence)
    if effect == 0 or pd.isna(effect) or pd.isna(spread):
        return None
    if spread <= 0:
        return least
    ratio = round(abs(effect) / spread, 3)  # rounded: the simulated powers are cached
    for n in range(least, EXACT_UP_TO + 1):
        if sign_flip_power(n, ratio, confidence) >= power:
            return n
    alpha = 1 - confidence
    for n in range(EXACT_UP_TO + 1, MAX_SEEDS + 1):
        critical = stats.t.ppf(1 - alpha / 2, n - 1)
        shift = ratio * math.sqrt(n)
        achieved = stats.nct.sf(critical, n - 1, shift) + stats.nct.cdf(-critical, n - 1, shift)
        if achieved >= power:
            return n
    return None


POWER_DRAWS = 2000  # simulated experiments per power estimate (standard error about 0.009)


@functools.lru_cache(maxsize=4096)
def sign_flip_power(n: int, ratio: float, confidence: float = CONFIDENCE) -> float:
    """The power of the two-sided exact sign-flip test at level 1 - confidence with n paired
    differences drawn from N(ratio, 1) (the effect over the spread), by simulation: the
    fraction of :data:`POWER_DRAWS` seeded draws whose p-value (:func:`sign_flip_test`'s, all
    2^n sign patterns) is at most the level. Deterministic for given arguments."""
    rng = np.random.default_rng(12345 + n)
    subsets = ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1).astype(float)
    rejected = 0
    for start in range(0, POWER_DRAWS, 200):  # 200 draws at a time: 2^n x 200 sums in memory
        d = rng.normal(ratio, 1.0, size=(n, min(200, POWER_DRAWS - start)))
        sums = subsets @ d
        tolerance = 1e-12 * np.maximum(1.0, np.abs(d).sum(axis=0))
        p_up = np.count_nonzero(sums <= tolerance, axis=0) / 2 ** n
        p_down = np.count_nonzero(sums >= -tolerance, axis=0) / 2 ** n
        p = np.minimum(1.0, 2 * np.minimum(p_up, p_down))
        rejected += int(np.count_nonzero(p <= 1 - confidence + 1e-12))
    return rejected / POWER_DRAWS


def verdict(difference: float, p_adjusted: float, seeds: int, higher_is_better: bool,
            alpha: float = 1 - CONFIDENCE, interval: tuple | None = None) -> str:
    """better / worse / not distinguishable at ``alpha``; a zero-width ``interval`` (the same
    difference on every seed) decides nothing."""
    if seeds < 2 or pd.isna(p_adjusted):
        return "not tested (fewer than two paired seeds)"
    if interval is not None and degenerate(*interval):
        return "not distinguishable (no spread over seeds)"
    if p_adjusted > alpha:
        return "not distinguishable"
    return "better" if (difference > 0) == higher_is_better else "worse"
