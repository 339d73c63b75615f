"""Seeded stratified splits and Dirichlet label skew (sampling without replacement)."""

from __future__ import annotations

import numpy as np

from dpclip.errors import DpclipError


def largest_remainder(total: int, weights: np.ndarray, caps: np.ndarray | None = None
                      ) -> np.ndarray:
    """Integer counts summing to ``total`` (when caps allow) in proportion to ``weights``.

    c_k = floor(total * w_k) (capped), then the remaining units go to the largest fractional
    parts among entries still below their cap (Hamilton's method), round after round.
    """
    weights = np.asarray(weights, dtype=np.float64)
    weights = weights / weights.sum()
    exact = total * weights
    counts = np.floor(exact + 1e-9).astype(np.int64)
    if caps is not None:
        counts = np.minimum(counts, caps)
    remainder = total - int(counts.sum())
    order = np.argsort(-(exact - counts), kind="stable")
    while remainder > 0:
        open_slots = [k for k in order if caps is None or counts[k] < caps[k]]
        if not open_slots:
            break  # the caps hold fewer than `total` units
        for k in open_slots[:remainder]:
            counts[k] += 1
        remainder = total - int(counts.sum())
    return counts


def stratified_split(y: np.ndarray, fractions: dict[str, float], seed: int
                     ) -> dict[str, np.ndarray]:
    """Split record indices into disjoint named parts, class by class.

    Within each class the indices are shuffled with ``seed`` and cut into consecutive blocks
    whose sizes follow ``fractions`` (largest-remainder rounding), so every part keeps the class
    balance of the whole and no index appears twice.
    """
    names = [n for n, f in fractions.items() if f > 0]
    weights = np.array([fractions[n] for n in names], dtype=np.float64)
    rng = np.random.default_rng(seed)
    parts: dict[str, list[np.ndarray]] = {n: [] for n in fractions}
    for label in np.unique(y):
        members = np.flatnonzero(y == label)
        rng.shuffle(members)
        counts = largest_remainder(len(members), weights)
        start = 0
        for name, count in zip(names, counts):
            parts[name].append(members[start:start + count])
            start += count
    return {n: np.sort(np.concatenate(p)) if p else np.zeros(0, dtype=np.int64)
            for n, p in parts.items()}


def dirichlet_subsample(y: np.ndarray, n_classes: int, alpha: float, seed: int
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Label-skewed subset of the records, following ww-dp-sgd section 5.8.

    Draw class proportions pi ~ Dirichlet(alpha * 1_K) and subsample the records to match pi.
    Sampling is without replacement (a repeated record would silently weaken its per-record
    guarantee), so the subset is the largest one matching pi:
        M = min over k with pi_k > 0 of floor(n_k / pi_k),
    with per-class counts c_k from largest-remainder rounding of M * pi_k, capped at n_k.
    Returns (sorted positions into ``y``, pi).
    """
    if alpha <= 0:
        raise DpclipError(f"partition.alphas: {alpha!r} must be > 0")
    rng = np.random.default_rng(seed)
    pi = rng.dirichlet(np.full(n_classes, float(alpha)))
    available = np.bincount(y, minlength=n_classes)
    positive = pi > 0
    with np.errstate(divide="ignore"):
        limits = np.where(positive, available / np.where(positive, pi, 1.0), np.inf)
    size = int(min(np.floor(limits.min() + 1e-9), len(y)))
    counts = largest_remainder(size, pi, caps=available)
    if counts.sum() == 0:
        raise DpclipError(f"partition.alphas: alpha={alpha:g} drew proportions {np.round(pi, 3)}"
                          f" that the training classes {available.tolist()} cannot match")
    chosen = [rng.choice(np.flatnonzero(y == k), size=c, replace=False)
              for k, c in enumerate(counts) if c > 0]
    return np.sort(np.concatenate(chosen)), pi
