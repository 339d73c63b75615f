"""Calibration and membership-inference metrics.

ECE and MCE use equal-width bins on the top-label confidence (Guo et al. 2017):
    ECE = sum_b (|B_b| / n) |acc(B_b) - conf(B_b)|,   MCE = max_b |acc(B_b) - conf(B_b)|
over the non-empty bins b, where bin b holds confidences in ((b-1)/M, b/M] (the first bin also
holds 0). Brier = mean_i sum_k (p_ik - 1[y_i = k])^2, NLL = mean_i -log p_{i, y_i}.
"""

from __future__ import annotations

import math

import numpy as np

from dpclip.errors import DpclipError


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


def classifier_auc(probs: np.ndarray, labels: np.ndarray) -> float | None:
    """The classifier's ROC AUC on labelled records: P(score of a positive > score of a
    negative), ties counted half. Two classes: the positive class's probability; more: the
    unweighted mean of each class against the rest (macro one-vs-rest) over the classes present.
    None when fewer than two classes are present or a probability is not finite."""
    from sklearn.metrics import roc_auc_score

    probs = np.asarray(probs, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.int64)
    present = np.unique(labels)
    if len(present) < 2 or not np.isfinite(probs).all():  # a diverged model: no AUC
        return None
    if probs.shape[1] == 2:
        return float(roc_auc_score(labels, probs[:, 1]))
    return float(np.mean([roc_auc_score(labels == k, probs[:, k]) for k in present]))


def tpr_at_fpr(fpr: np.ndarray, tpr: np.ndarray, level: float) -> float:
    """Largest TPR among ROC points with FPR <= level (no interpolation: a real threshold)."""
    ok = fpr <= level + 1e-12
    return float(tpr[ok].max()) if ok.any() else 0.0


def attack_metrics(member_scores: np.ndarray, nonmember_scores: np.ndarray) -> dict:
    """Threshold attack on scores where higher means 'member'.

    AUC, the best balanced accuracy over thresholds max_t (TPR + 1 - FPR) / 2, TPR at 1% and
    0.1% FPR with their two-sided 95% Clopper-Pearson intervals (``..._ci95``: the members
    above that threshold are binomial given it; the FPR is taken as measured), and the ROC
    curve itself. With fewer than 1 / level non-members, "FPR <= level" means no false
    positive at all.
    """
    scores = np.concatenate([member_scores, nonmember_scores])
    truth = np.concatenate([np.ones(len(member_scores)), np.zeros(len(nonmember_scores))])
    from sklearn.metrics import roc_auc_score  # on use: scikit-learn loads slowly

    fpr, tpr = roc_points(member_scores, nonmember_scores)
    n = len(member_scores)
    result = {"auc": float(roc_auc_score(truth, scores)),
              "balanced_accuracy": float(np.max((tpr + 1.0 - fpr) / 2.0))}
    n_out = len(nonmember_scores)
    for name, level in (("1pct", 0.01), ("0.1pct", 0.001)):
        rate = tpr_at_fpr(fpr, tpr, level)
        lo, hi = clopper_pearson_limits(round(rate * n), n, 0.025)
        result[f"tpr_at_fpr_{name}"] = rate
        result[f"tpr_at_fpr_{name}_ci95"] = [float(lo), float(hi)]
        result[f"tpr_at_fpr_{name}_meaningful"] = meaningful_fpr(level, n_out)
    result["tpr_at_zero_fp"] = tpr_at_fpr(fpr, tpr, 0.0)
    level = low_fpr_level(n_out)
    rate = tpr_at_fpr(fpr, tpr, level)
    lo, hi = clopper_pearson_limits(round(rate * n), n, 0.025)
    result["low_fpr"] = {"fpr": level, "tpr": rate, "tpr_ci95": [float(lo), float(hi)],
                         "false_positives_allowed": int(math.floor(level * n_out + 1e-9))}
    return {**result, "roc": {"fpr": fpr, "tpr": tpr},
            "n_members": int(n), "n_nonmembers": int(n_out)}


# a TPR "at FPR f" means something only where f allows this many false positives; with
# fewer non-members it is the TPR at (almost) no false positive, a property of the few most
# confident non-members
MIN_FALSE_POSITIVES = 10
LOW_FPR = 0.001  # the low-FPR point where the non-members allow it (Carlini et al. 2022)


def meaningful_fpr(level: float, n_nonmembers: int) -> bool:
    """Whether ``level`` allows at least :data:`MIN_FALSE_POSITIVES` false positives."""
    return level * n_nonmembers >= MIN_FALSE_POSITIVES - 1e-9


def low_fpr_level(n_nonmembers: int) -> float:
    """The honest low-FPR point: 0.1% where n_nonmembers >= 10,000, else the smallest FPR that
    allows :data:`MIN_FALSE_POSITIVES` false positives, 10 / n_nonmembers (2.8% for 354)."""
    if n_nonmembers <= 0:
        return 1.0
    return max(LOW_FPR, min(1.0, MIN_FALSE_POSITIVES / n_nonmembers))


def clopper_pearson_limits(successes, trials: int, alpha: float):
    """One-sided exact (Clopper-Pearson) binomial limits at level ``alpha`` each, element-wise:
    lower = Beta^-1(alpha; k, n - k + 1) (0 when k = 0), upper = Beta^-1(1 - alpha; k + 1, n - k)
    (1 when k = n), so P(p < lower) <= alpha and P(p > upper) <= alpha."""
    from scipy.stats import beta as beta_dist  # on use: scipy.stats loads slowly

    k = np.asarray(successes, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        lo = np.where(k <= 0, 0.0, beta_dist.ppf(alpha, np.maximum(k, 1), trials - k + 1))
        hi = np.where(k >= trials, 1.0,
                      beta_dist.ppf(1 - alpha, k + 1, np.maximum(trials - k, 1)))
    return lo, hi


ADJACENCIES = ("add_remove", "replace_one_features")


def membership_game_bound(adjacency: str | None, epsilon: float, delta: float
                          ) -> tuple[float, float]:
    """(eps', delta') that bound the membership game this project plays (fixed-size: non-members
    scored on the same model, so one record replaced) for a run whose (eps, delta) holds under
    ``adjacency``: (eps, delta) for ``replace_one_features``; (2 eps, (1 + e^eps) delta), group
    privacy over two steps, for ``add_remove`` and for None (records from before it was
    recorded). Derivation: docs/api/metrics.md.
    """
    adjacency = adjacency or "add_remove"
    if adjacency == "replace_one_features":
        return float(epsilon), float(delta)
    if adjacency == "add_remove":
        return 2.0 * float(epsilon), (1.0 + math.exp(min(float(epsilon), 700.0))) * float(delta)
    raise DpclipError(f"privacy.adjacency: {adjacency!r} is not one of {list(ADJACENCIES)}")


def dp_bound_check(fpr: np.ndarray, tpr: np.ndarray, n_members: int, n_nonmembers: int,
                   epsilon: float, delta: float, adjacency: str | None = "add_remove",
                   confidence: float = 0.95) -> dict:
    """Certify violations of the DP bound by an attack's empirical ROC, in both directions:
    TPR <= e^eps' FPR + delta' and 1 - FPR <= e^eps' (1 - TPR) + delta', with (eps', delta') =
    :func:`membership_game_bound`. Certified (``worst_margin`` > 0) only beyond one-sided
    Clopper-Pearson limits at level (1 - ``confidence``) / (2m) each, m = n_members +
    n_nonmembers + 1, so a run within its bound is flagged with probability <= 1 - confidence.
    Derivation: docs/api/metrics.md.
    """
    fpr, tpr = np.asarray(fpr, dtype=np.float64), np.asarray(tpr, dtype=np.float64)
    eps_used, delta_used = membership_game_bound(adjacency, epsilon, delta)
    points = int(len(fpr))
    thresholds = int(n_members) + int(n_nonmembers) + 1  # data-independent Bonferroni count
    alpha_each = (1.0 - confidence) / (2 * thresholds)
    tpr_lo, _ = clopper_pearson_limits(np.round(tpr * n_members), n_members, alpha_each)
    _, fpr_hi = clopper_pearson_limits(np.round(fpr * n_nonmembers), n_nonmembers, alpha_each)
    growth = math.exp(min(eps_used, 700.0))
    margins = np.stack([tpr_lo - (growth * fpr_hi + delta_used),
                        (1.0 - fpr_hi) - (growth * (1.0 - tpr_lo) + delta_used)])
    direction, j = np.unravel_index(int(np.argmax(margins)), margins.shape)
    worst = float(margins[direction, j])
    return {"checked": True, "violated": bool(worst > 0), "worst_margin": worst,
            "epsilon_used": eps_used, "delta_used": delta_used,
            "adjacency": adjacency or "add_remove", "confidence": confidence, "points": points,
            "band": "clopper_pearson_bonferroni", "bonferroni_limits": 2 * thresholds,
            "violating_points": int(np.sum(margins.max(axis=0) > 0)),
            "worst_at": {"fpr": float(fpr[j]), "tpr": float(tpr[j]),
                         "direction": ("tpr <= e^eps fpr + delta",
                                       "1 - fpr <= e^eps (1 - tpr) + delta")[direction]}}


RUN_CONFIDENCE = 0.95  # of a run's dp_bound_violated flag, over all its attacks' checks


def family_confidence(checks: int, confidence: float = RUN_CONFIDENCE) -> float:
    """The confidence of each of ``checks`` DP-bound checks so that all hold together with
    ``confidence`` (Bonferroni): 1 - (1 - confidence) / checks."""
    return 1.0 - (1.0 - confidence) / max(int(checks), 1)


def dp_bound_unchecked(privacy: dict) -> dict | None:
    """``{"checked": false, "reason": ...}`` when the run's privacy record makes no DP claim to
    check (non-private, or ``dp_guarantee`` false); None when it does."""
    epsilon = privacy.get("epsilon")
    if epsilon is None or not math.isfinite(float(epsilon)):
        return {"checked": False, "reason": "non-private: no finite epsilon"}
    if not privacy.get("dp_guarantee"):
        return {"checked": False,
                "reason": "dp_guarantee false: the reported epsilon is not a guarantee"}
    return None


def roc_points(member_scores: np.ndarray, nonmember_scores: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """(FPR, TPR) of every threshold on scores where higher means 'member' (ROC corners)."""
    scores = np.concatenate([member_scores, nonmember_scores])
    truth = np.concatenate([np.ones(len(member_scores)), np.zeros(len(nonmember_scores))])
    from sklearn.metrics import roc_curve

    # every threshold: by default scikit-learn drops collinear points, among them a real
    # threshold that reaches a given FPR (ties of members and non-members lie on diagonals)
    fpr, tpr, _ = roc_curve(truth, scores, drop_intermediate=False)
    return fpr, tpr


def strongest_attack(mia: dict) -> tuple[str, dict] | None:
    """The record-level attack (one score per record: loss, LiRA, RMIA) with the highest TPR at
    the honest low FPR (``low_fpr``: 0.1%, or the smallest FPR allowing
    :data:`MIN_FALSE_POSITIVES` false positives on this many non-members), ties broken by AUC;
    None when the run has none. Not by the TPR at 0.1% FPR: with fewer than 10,000
    non-members that is the TPR at (almost) no false positive, and picking the largest of
    several such numbers after the fact favours noise."""
    def low_fpr_tpr(attack: dict) -> float:
        return (attack.get("low_fpr") or {}).get("tpr", attack["tpr_at_fpr_0.1pct"])

    attacks = {name: a for name, a in mia.items() if isinstance(a, dict)
               and a.get("auc") is not None and a.get("tpr_at_fpr_0.1pct") is not None}
    if not attacks:
        return None
    name = max(attacks, key=lambda n: (low_fpr_tpr(attacks[n]), attacks[n]["auc"]))
    return name, attacks[name]
