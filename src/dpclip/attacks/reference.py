"""Membership attacks calibrated per record with reference models: LiRA and RMIA.

Both compare the target model's output on a record with the outputs of reference models
trained the same way on data that did (IN) or did not (OUT) contain it. Inputs are arrays of
per-record statistics, so the functions do not care how the reference models were trained.

**LiRA** (Carlini et al. 2022, "Membership inference attacks from first principles"). The
statistic is the logit-scaled confidence in the true label,
    phi(x) = log p_y(x) - log(1 - p_y(x)),
whose distribution over reference models is close to Gaussian. Offline (OUT models only): the
score is the one-sided z of the target's phi against N(mu_out(x), sigma_out(x)^2),
    s(x) = (phi_target(x) - mu_out(x)) / sigma_out(x)
(a monotone transform of Carlini et al.'s 1 - Phi(-z): the same ROC). Online (IN and OUT
models): the log likelihood ratio
    s(x) = log N(phi; mu_in, sigma_in^2) - log N(phi; mu_out, sigma_out^2).
With ``fixed_variance`` the sigma of every record is the pooled one (the paper's choice for few
reference models).

**RMIA** (Zarifzadeh et al. 2024, "Low-cost high-power membership inference attacks"). With
P(x | theta) = p_y(x), the likelihood ratio of a record against the population,
    LR(x) = P(x | theta_target) / P(x),   P(x) = mean over reference models of P(x | theta_ref),
and the score is the fraction of population records z (non-members) it beats:
    s(x) = #{z : LR(x) / LR(z) > gamma} / #z,
with ties (records between the same two population ratios) broken by LR(x) itself.
Offline, the reference models are all OUT for x, so P(x) is estimated from them with the
paper's linear correction for the missing IN half: P(x) = ((1 + a) P_out(x) + (1 - a)) / 2;
online, P(x) = (P_in(x) + P_out(x)) / 2, the means over the IN and the OUT models. The
population records z must be IN for half of the reference models (the reference stage's
complementary halves), so P(z) is the plain mean over all of them in both modes.
"""

from __future__ import annotations

import numpy as np
from scipy import special, stats

MIN_SIGMA = 1e-6  # a record on which every reference model agrees exactly


def logit_confidence(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """phi = log p_y - log(1 - p_y) from raw logits, stably: the true class's logit minus the
    log-sum-exp of the others. ``logits`` (..., n, C), ``labels`` (n,)."""
    logits = np.asarray(logits, dtype=np.float64)
    rows = np.arange(logits.shape[-2])
    true = logits[..., rows, labels]
    others = logits.copy()
    others[..., rows, labels] = -np.inf
    return true - special.logsumexp(others, axis=-1)


def true_class_probability(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """p_y = softmax(logits)_y, ``logits`` (..., n, C)."""
    logits = np.asarray(logits, dtype=np.float64)
    rows = np.arange(logits.shape[-2])
    return np.exp(logits[..., rows, labels] - special.logsumexp(logits, axis=-1))


def _gaussian(phi: np.ndarray, mask: np.ndarray, fixed_variance: bool
              ) -> tuple[np.ndarray, np.ndarray]:
    """Per-record mean and standard deviation of ``phi`` (K, n) over the models in ``mask``.
    A per-record variance needs two models of the kind; the fixed variance pools the records
    that have them."""
    count = mask.sum(axis=0)
    if (count == 0).any():
        raise ValueError("LiRA: a record has no reference model of the kind needed")
    mean = np.where(mask, phi, 0.0).sum(axis=0) / count
    var = np.where(mask, (phi - mean) ** 2, 0.0).sum(axis=0) / np.maximum(count - 1, 1)
    if fixed_variance:
        if not (count >= 2).any():
            raise ValueError("LiRA: the fixed variance needs a record with two reference models")
        var = np.full_like(var, var[count >= 2].mean())
    elif (count < 2).any():
        raise ValueError("LiRA: a per-record variance needs two reference models of the kind "
                         "for every record (or fixed_variance)")
    return mean, np.maximum(np.sqrt(var), MIN_SIGMA)


def lira_scores(target_phi: np.ndarray, reference_phi: np.ndarray,
                reference_in: np.ndarray | None = None, fixed_variance: bool = False
                ) -> np.ndarray:
    """LiRA membership scores (higher = member) of n records: ``target_phi`` (n,), the
    reference models' ``reference_phi`` (K, n) and whether each trained on each record
    ``reference_in`` (K, n; None = offline, every reference model OUT)."""
    target_phi, reference_phi = np.asarray(target_phi, float), np.asarray(reference_phi, float)
    out = np.ones_like(reference_phi, bool) if reference_in is None else ~reference_in
    mu_out, sd_out = _gaussian(reference_phi, out, fixed_variance)
    if reference_in is None:
        return (target_phi - mu_out) / sd_out
    mu_in, sd_in = _gaussian(reference_phi, reference_in, fixed_variance)
    log_in = -0.5 * ((target_phi - mu_in) / sd_in) ** 2 - np.log(sd_in)
    log_out = -0.5 * ((target_phi - mu_out) / sd_out) ** 2 - np.log(sd_out)
    return log_in - log_out


def rmia_scores(target_p: np.ndarray, reference_p: np.ndarray, population_p: np.ndarray,
                population_reference_p: np.ndarray, a: float = 0.3, gamma: float = 1.0,
                reference_in: np.ndarray | None = None) -> np.ndarray:
    """RMIA membership scores in [0, 1] of n records against p population records:
    ``target_p`` (n,) and ``population_p`` (p,) are the target model's true-class
    probabilities, ``reference_p`` (K, n) and ``population_reference_p`` (K, p) the reference
    models'. Offline (``reference_in`` None): P(x) with the linear correction ``a``; online:
    (P_in(x) + P_out(x)) / 2. P(z): the mean over all reference models."""
    reference_p = np.asarray(reference_p, float)
    if reference_in is None:
        p_x = 0.5 * ((1 + a) * reference_p.mean(axis=0) + (1 - a))
    else:  # the paper's P(x) = (P_in(x) + P_out(x)) / 2
        inside = np.asarray(reference_in, bool)
        if not (inside.any(axis=0) & (~inside).any(axis=0)).all():
            raise ValueError("RMIA online: every record needs an IN and an OUT reference model")
        p_in = np.where(inside, reference_p, 0.0).sum(axis=0) / inside.sum(axis=0)
        p_out = np.where(~inside, reference_p, 0.0).sum(axis=0) / (~inside).sum(axis=0)
        p_x = (p_in + p_out) / 2
    p_z = np.asarray(population_reference_p, float).mean(axis=0)  # z: IN for half the models
    ratio_x = np.asarray(target_p, float) / np.maximum(p_x, 1e-300)
    ratio_z = np.sort(np.asarray(population_p, float) / np.maximum(p_z, 1e-300))
    # LR(x) / LR(z) > gamma  <=>  LR(z) < LR(x) / gamma: count population ratios below it
    fraction = np.searchsorted(ratio_z, ratio_x / gamma, side="left") / len(ratio_z)
    # the fraction takes |Z| + 1 values, so members and non-members between two population
    # ratios tie; break the ties by LR(x) itself, within less than one population step (the
    # order of different fractions is kept), or a threshold could not separate them
    order = stats.rankdata(ratio_x) / (len(ratio_x) + 1)  # in (0, 1)
    return fraction + order / (2 * len(ratio_z))


def calibrated_scores(target_logits: np.ndarray, reference_logits: np.ndarray,
                      labels: np.ndarray, reference_in: np.ndarray | None,
                      population_logits: np.ndarray, population_reference_logits: np.ndarray,
                      population_labels: np.ndarray, *, fixed_variance: bool = True,
                      a: float = 0.3, gamma: float = 1.0) -> dict[str, np.ndarray]:
    """LiRA and RMIA scores of n attacked records from logits: the target model's (n, C) and
    the K reference models' (K, n, C), with ``reference_in`` (K, n; None offline); RMIA's
    population from the target's (p, C) and the reference models' (K, p, C) logits."""
    lira = lira_scores(logit_confidence(target_logits, labels),
                       logit_confidence(reference_logits, labels), reference_in, fixed_variance)
    rmia = rmia_scores(true_class_probability(target_logits, labels),
                       true_class_probability(reference_logits, labels),
                       true_class_probability(population_logits, population_labels),
                       true_class_probability(population_reference_logits, population_labels),
                       a=a, gamma=gamma, reference_in=reference_in)
    return {"lira": lira, "rmia": rmia}


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
        matrix = np.corrcoef(phi[:, common])
        correlation = float(matrix[np.triu_indices(len(logits), 1)].mean())
    return {"accuracy": float(np.mean(accuracy)), "mean_phi": float(np.mean(confidence)),
            "phi_correlation": correlation}
