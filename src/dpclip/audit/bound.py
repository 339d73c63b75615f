"""The one-run audit's lower bound on epsilon (Steinke, Nasr and Jagielski 2023, "Privacy
auditing with one (1) training run", Theorem 3.1 and its delta > 0 form, Proposition 5.2):
from r guesses of which canaries were included, v of them right, the largest epsilon whose
p-value (:func:`p_value`) is below 1 - confidence. The guess sizes are fixed before the run
(:data:`GUESS_FRACTIONS`, Bonferroni over them). The game and the p-value: docs/api/audit.md.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

GUESS_FRACTIONS = (0.1, 0.2, 0.5, 1.0)  # r / m: the guess sizes tried (Bonferroni over them)


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P[at least v of r guesses correct] under (epsilon, delta)-DP, m canaries (the bound of
    docs/api/audit.md, capped at 1)."""
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    q = 1.0 / (1.0 + math.exp(-epsilon))
    beta = float(stats.binom.sf(v - 1, r, q))
    if delta == 0 or v == 0:
        return min(1.0, beta)
    # P[v - i <= Bin < v] = cdf(v - 1) - cdf(v - 1 - i), for i = 1..v
    cdf = stats.binom.cdf(np.arange(-1, v), r, q)  # cdf[j + 1] = P[Bin <= j], j = -1..v-1
    window = cdf[v] - cdf[v - np.arange(1, v + 1)]
    alpha = float(np.max(window / np.arange(1, v + 1)))
    return min(1.0, beta + 2 * m * delta * alpha)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, confidence: float = 0.95,
                        tolerance: float = 1e-6) -> float:
    """The largest epsilon the guesses refute at ``confidence`` (0 when they refute none):
    bisection on the p-value, which grows with epsilon."""
    level = 1.0 - confidence
    if r == 0 or p_value(m, r, v, 0.0, delta) >= level:
        return 0.0
    low, high = 0.0, 1.0
    while p_value(m, r, v, high, delta) < level:  # ends: q -> 1 makes the p-value 1
        low, high = high, 2 * high
    while high - low > tolerance:
        middle = (low + high) / 2
        if p_value(m, r, v, middle, delta) < level:
            low = middle
        else:
            high = middle
    return low


def guesses(scores: np.ndarray, included: np.ndarray, r: int) -> tuple[int, int]:
    """(r, v): guess IN for the r/2 highest scores and OUT for the r/2 lowest (one more IN when
    r is odd); v counts the correct guesses. Ties are broken by canary index, fixed before."""
    order = np.argsort(scores, kind="stable")
    k_out = r // 2
    k_in = r - k_out
    correct = int(included[order[len(order) - k_in:]].sum()) + \
        int((~included[order[:k_out]]).sum())
    return r, correct


def audit(scores: np.ndarray, included: np.ndarray, delta: float, confidence: float = 0.95,
          fractions: tuple[float, ...] = GUESS_FRACTIONS) -> dict:
    """The audit of one training run from its canaries' scores (higher = more likely IN) and
    their inclusion: the best lower bound over the guess sizes ``fractions`` of m, each at
    confidence 1 - (1 - ``confidence``) / len(fractions)."""
    scores, included = np.asarray(scores, dtype=float), np.asarray(included, dtype=bool)
    m = len(scores)
    each = 1.0 - (1.0 - confidence) / len(fractions)
    tried = []
    for fraction in fractions:
        r, v = guesses(scores, included, max(1, min(m, round(fraction * m))))
        tried.append({"guesses": r, "correct": v,
                      "epsilon_lower_bound": epsilon_lower_bound(m, r, v, delta, each)})
    best = max(tried, key=lambda t: t["epsilon_lower_bound"])
    return {"epsilon_lower_bound": best["epsilon_lower_bound"], "canaries": m,
            "included": int(included.sum()), "guesses": best["guesses"],
            "correct": best["correct"], "confidence": confidence, "confidence_each": each,
            "tried": tried}
