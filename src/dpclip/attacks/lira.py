"""``lira``: the likelihood-ratio attack (Carlini et al. 2022, "Membership inference attacks from
first principles"), calibrated per record with reference models: the target's logit-scaled
confidence phi = log p_y - log(1 - p_y) against Gaussians fitted to the reference models' phi
on the same record (offline a z-score against the OUT models, online the log likelihood ratio
of the IN and OUT Gaussians). Formulas: docs/attacks.md, "The scores".
"""

from __future__ import annotations

import numpy as np
from pydantic import StrictBool

from dpclip.attacks.base import Attack, AttackEvidence, register
from dpclip.attacks.common.signals import logit_confidence
from dpclip.errors import bad_value
from dpclip.param_types import Section

MIN_SIGMA = 1e-6  # a record on which every reference model agrees exactly


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


@register
class LiRA(Attack):
    name = "lira"
    label = "LiRA"
    description = ("LiRA (Carlini et al. 2022): the target's logit-scaled confidence phi "
                   "against a Gaussian fitted to the reference models' phi on the same record")
    needs_references = True

    class Options(Section):
        fixed_variance: StrictBool = True  # one pooled variance (the paper's, few models)

    @classmethod
    def check_options(cls, options, references: int, mode: str) -> list[str]:
        if not options.fixed_variance and 0 < references < 4:
            return [bad_value("attack.references", references, "is too few for "
                              "attack.lira.fixed_variance false: a per-record variance "
                              "needs 4 or more")]
        return []

    def scores(self, evidence: AttackEvidence) -> np.ndarray:
        ref = evidence.references
        return lira_scores(logit_confidence(evidence.logits, evidence.labels),
                           logit_confidence(ref.logits, evidence.labels), ref.inside,
                           self.options.fixed_variance)
