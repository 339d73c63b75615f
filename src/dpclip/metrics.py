"""Calibration and membership-inference metrics.

ECE and MCE use equal-width bins on the top-label confidence (Guo et al. 2017):
    ECE = sum_b (|B_b| / n) |acc(B_b) - conf(B_b)|,   MCE = max_b |acc(B_b) - conf(B_b)|
over the non-empty bins b, where bin b holds confidences in ((b-1)/M, b/M] (the first bin also
holds 0). Brier = mean_i sum_k (p_ik - 1[y_i = k])^2, NLL = mean_i -log p_{i, y_i}.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import beta as beta_dist
from sklearn.metrics import roc_auc_score, roc_curve


def reliability_bins(confidence: np.ndarray, correct: np.ndarray, n_bins: int = 15) -> dict:
    """Per-bin count, mean confidence and accuracy (empty bins have NaN means)."""
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    # bin b holds (edges[b], edges[b+1]]; confidence 0 goes to the first bin
    which = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, n_bins - 1)
    counts = np.bincount(which, minlength=n_bins)
    conf_sum = np.bincount(which, weights=confidence, minlength=n_bins)
    acc_sum = np.bincount(which, weights=correct.astype(np.float64), minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"lower": edges[:-1], "upper": edges[1:], "count": counts,
                "confidence": conf_sum / counts, "accuracy": acc_sum / counts}


def calibration_metrics(probs: np.ndarray, labels: np.ndarray, n_bins: int = 15) -> dict:
    """Accuracy, ECE, MCE, Brier and NLL of predicted class probabilities."""
    probs = np.asarray(probs, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.int64)
    confidence = probs.max(axis=1)
    correct = probs.argmax(axis=1) == labels
    bins = reliability_bins(confidence, correct, n_bins)
    filled = bins["count"] > 0
    gaps = np.abs(bins["accuracy"][filled] - bins["confidence"][filled])
    onehot = np.eye(probs.shape[1])[labels]
    p_true = np.clip(probs[np.arange(len(labels)), labels], 1e-12, 1.0)
    return {"accuracy": float(correct.mean()),
            "ece": float(np.sum(bins["count"][filled] / len(labels) * gaps)),
            "mce": float(gaps.max()) if gaps.size else 0.0,
            "brier": float(np.mean(np.sum((probs - onehot) ** 2, axis=1))),
            "nll": float(np.mean(-np.log(p_true)))}


def tpr_at_fpr(fpr: np.ndarray, tpr: np.ndarray, level: float) -> float:
    """Largest TPR among ROC points with FPR <= level (no interpolation: a real threshold)."""
    ok = fpr <= level + 1e-12
    return float(tpr[ok].max()) if ok.any() else 0.0


def attack_metrics(member_scores: np.ndarray, nonmember_scores: np.ndarray) -> dict:
    """Threshold attack on scores where higher means 'member'.

    AUC, the best balanced accuracy over thresholds max_t (TPR + 1 - FPR) / 2, and TPR at 1%
    and 0.1% FPR, with the ROC curve itself.
    """
    scores = np.concatenate([member_scores, nonmember_scores])
    truth = np.concatenate([np.ones(len(member_scores)), np.zeros(len(nonmember_scores))])
    fpr, tpr, _ = roc_curve(truth, scores)
    return {"auc": float(roc_auc_score(truth, scores)),
            "balanced_accuracy": float(np.max((tpr + 1.0 - fpr) / 2.0)),
            "tpr_at_fpr_1pct": tpr_at_fpr(fpr, tpr, 0.01),
            "tpr_at_fpr_0.1pct": tpr_at_fpr(fpr, tpr, 0.001),
            "roc": {"fpr": fpr, "tpr": tpr},
            "n_members": int(len(member_scores)), "n_nonmembers": int(len(nonmember_scores))}


def clopper_pearson(successes, trials: int, confidence: float = 0.95):
    """Exact two-sided binomial confidence limits (element-wise over ``successes``)."""
    k = np.asarray(successes, dtype=np.float64)
    a = (1 - confidence) / 2
    with np.errstate(invalid="ignore"):
        lo = np.where(k == 0, 0.0, beta_dist.ppf(a, k, trials - k + 1))
        hi = np.where(k == trials, 1.0, beta_dist.ppf(1 - a, k + 1, trials - k))
    return lo, hi


def dp_bound_check(fpr: np.ndarray, tpr: np.ndarray, n_members: int, n_nonmembers: int,
                   epsilon: float, delta: float, confidence: float = 0.95) -> dict:
    """Check TPR <= e^eps * FPR + delta at every ROC point, allowing for sampling error.

    A point violates the bound only when even the lower confidence limit of its TPR exceeds
    e^eps times the upper limit of its FPR plus delta (Clopper-Pearson intervals), so a flagged
    violation is evidence of a privacy bug, not noise.
    """
    tpr_lo, _ = clopper_pearson(np.round(np.asarray(tpr) * n_members), n_members, confidence)
    _, fpr_hi = clopper_pearson(np.round(np.asarray(fpr) * n_nonmembers), n_nonmembers,
                                confidence)
    excess = tpr_lo - (math.exp(min(epsilon, 700.0)) * fpr_hi + delta)
    return {"violated": bool((excess > 0).any()), "violating_points": int((excess > 0).sum()),
            "max_excess": float(excess.max()), "confidence": confidence}
