"""``loss``: the loss-threshold attack (Yeom et al. 2018), the baseline every run reports.

The score is s(x) = -loss(x) = log p_y(x) from the logits, in float64: scores from float32
probabilities tie on a confident model (docs/attacks.md, "One attack chosen in advance"). It
needs nothing but the target's outputs.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from dpclip.attacks.base import Attack, AttackEvidence, register


def log_true_class_probability(logits: np.ndarray, y: np.ndarray) -> np.ndarray:
    """log p_y of each record from its logits (n, C), in float64, as
    -log1p(sum_{k != y} exp(z_k - z_y)): accurate to float64's relative precision also where
    p_y is within 1e-12 of 1 (z_y - logsumexp(z) would round such a loss to a multiple of
    |z| EPS64, tying again), and finite for finite logits."""
    z = torch.tensor(np.asarray(logits), dtype=torch.float64)  # a copy: evidence is read-only
    rows = torch.arange(len(z))
    labels = torch.tensor(np.asarray(y), dtype=torch.int64)  # a copy: y may be read-only
    gaps = z - z[rows, labels][:, None]
    gaps[rows, labels] = -math.inf  # exp(-inf) = 0: the true class is not among the others
    top = gaps.amax(dim=1, keepdim=True).clamp_min(0)  # exp never overflows
    others = torch.exp(gaps - top).sum(dim=1)
    # log(1 + S) with S = exp(top) * others: log1p where top = 0, else top + log(exp(-top) + others)
    return torch.where(top[:, 0] == 0, -torch.log1p(others),
                       -(top[:, 0] + torch.log(torch.exp(-top[:, 0]) + others))).numpy()


@register
class LossThreshold(Attack):
    name = "loss"
    label = "Loss threshold"
    description = ("the loss-threshold attack (Yeom et al. 2018): a lower loss on the true "
                   "label says member; needs only the target's outputs")
    baseline = True

    def scores(self, evidence: AttackEvidence) -> np.ndarray:
        return log_true_class_probability(evidence.logits, evidence.labels)
