"""Per-record statistics of a model's outputs that attacks calibrate against reference models.

With p_y(x) the softmax probability of the true label y of record x:

* the logit-scaled confidence phi(x) = log p_y(x) - log(1 - p_y(x)) (LiRA's statistic, close to
  Gaussian over reference models), computed stably from the logits;
* the true-class probability p_y(x) (RMIA's P(x | theta));
* how confident models are on records they did not train on (:func:`unseen_fit`), which shows
  whether reference models are as strong as the target.
"""

from __future__ import annotations

import math

import numpy as np


def logit_confidence(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """phi = log p_y - log(1 - p_y) from raw logits, stably: the true class's logit minus the
    log-sum-exp of the others. ``logits`` (..., n, C), ``labels`` (n,)."""
    from scipy.special import logsumexp  # on use: every stage validates the attack registry

    logits = np.asarray(logits, dtype=np.float64)
    rows = np.arange(logits.shape[-2])
    true = logits[..., rows, labels]
    others = logits.copy()
    others[..., rows, labels] = -np.inf
    return true - logsumexp(others, axis=-1)


def true_class_probability(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """p_y = softmax(logits)_y, ``logits`` (..., n, C)."""
    from scipy.special import logsumexp  # on use, as above

    logits = np.asarray(logits, dtype=np.float64)
    rows = np.arange(logits.shape[-2])
    return np.exp(logits[..., rows, labels] - logsumexp(logits, axis=-1))


def mean_pairwise_correlation(rows: np.ndarray) -> float:
    """The mean Pearson correlation over all pairs of ``rows`` (K, n), every sum exactly
    rounded (``math.fsum``): the same bits on every machine. ``np.corrcoef`` takes its products
    from BLAS, whose kernels (chosen by CPU: OpenBLAS's Haswell, SkylakeX, Zen, ...) add in
    different orders, so the committed results differed in the 15th digit between machines."""
    n = rows.shape[1]
    centred = [row - math.fsum(row) / n for row in np.asarray(rows, dtype=np.float64)]
    spreads = [math.sqrt(math.fsum(c * c)) for c in centred]
    pairs = [math.fsum(centred[i] * centred[j]) / (spreads[i] * spreads[j])
             for i in range(len(centred)) for j in range(i + 1, len(centred))]
    return math.fsum(pairs) / len(pairs)


def unseen_fit(logits: np.ndarray, labels: np.ndarray, seen: np.ndarray | None = None
               ) -> dict:
    """How confident models are on records they did not train on: per model (``logits``
    (K, n, C), or one model's (n, C)), the accuracy and mean logit-confidence phi over the
    records ``seen`` (K, n) marks False; the means over the models, and the mean pairwise
    correlation of the models' phi on the records none of them saw (None for one model).
    A reference model much less confident than the target makes LiRA and RMIA weaker."""
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim == 2:
        logits = logits[None]
    seen = np.zeros(logits.shape[:2], bool) if seen is None else np.asarray(seen, bool)
    phi = logit_confidence(logits, labels)
    right = logits.argmax(axis=-1) == labels
    accuracy = [float(right[k][~seen[k]].mean()) for k in range(len(logits))]
    confidence = [float(phi[k][~seen[k]].mean()) for k in range(len(logits))]
    common = ~seen.any(axis=0)
    correlation = None
    if len(logits) > 1 and common.sum() > 2:
        correlation = mean_pairwise_correlation(phi[:, common])
    return {"accuracy": float(np.mean(accuracy)), "mean_phi": float(np.mean(confidence)),
            "phi_correlation": correlation}
