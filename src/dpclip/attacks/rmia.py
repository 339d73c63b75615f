"""``rmia``: the relative membership-inference attack (Zarifzadeh et al. 2024, "Low-cost
high-power membership inference attacks"), calibrated with reference models and a population:
a record's likelihood ratio LR(x) = p_y(x | target) / P(x) ranked against those of population
records z (non-members), ties broken by LR(x) itself. P(x) comes from the reference models
(offline with the paper's linear correction), P(z) is their plain mean (z is IN for half of
them). Formulas: docs/attacks.md, "The scores".
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
from pydantic import Field

from dpclip.attacks.base import Attack, AttackEvidence, register
from dpclip.attacks.common.signals import true_class_probability
from dpclip.param_types import NUMBER, Section


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
    from scipy.stats import rankdata  # on use: scipy.stats loads slowly (every stage validates)

    order = rankdata(ratio_x) / (len(ratio_x) + 1)  # in (0, 1)
    return fraction + order / (2 * len(ratio_z))


@register
class RMIA(Attack):
    name = "rmia"
    label = "RMIA"
    description = ("RMIA (Zarifzadeh et al. 2024): the target's likelihood ratio against the "
                   "reference models, ranked against those of population records")
    needs_references = True

    class Options(Section):
        offline_a: Annotated[float, Field(ge=0, le=1), NUMBER] = 0.3  # P(x) from OUT models
        gamma: Annotated[float, Field(gt=0), NUMBER] = 1.0  # LR(x) / LR(z) > gamma

    def scores(self, evidence: AttackEvidence) -> np.ndarray:
        ref = evidence.references
        return rmia_scores(true_class_probability(evidence.logits, evidence.labels),
                           true_class_probability(ref.logits, evidence.labels),
                           true_class_probability(ref.population_logits, ref.population_labels),
                           true_class_probability(ref.population_reference_logits,
                                                  ref.population_labels),
                           a=self.options.offline_a, gamma=self.options.gamma,
                           reference_in=ref.inside)
