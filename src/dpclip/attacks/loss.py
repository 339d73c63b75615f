"""``loss``: the loss-threshold attack (Yeom et al. 2018), the baseline every run reports.

A model fits its training records better than others, so a low loss says "member": with
p_y(x) the softmax probability of the true label, the score is

    s(x) = -loss(x) = log max(p_y(x), 1e-12)

(the floor keeps a record the model is sure is wrong finite). It needs nothing but the
target's outputs.
"""

from __future__ import annotations

import numpy as np
import torch

from dpclip.attacks.base import Attack, AttackEvidence, register


def per_sample_loss(probs: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The cross-entropy -log p_y of each record from class probabilities (n, C)."""
    return -np.log(np.clip(probs[np.arange(len(y)), y], 1e-12, 1.0))


@register
class LossThreshold(Attack):
    name = "loss"
    label = "Loss threshold"
    description = ("the loss-threshold attack (Yeom et al. 2018): a lower loss on the true "
                   "label says member; needs only the target's outputs")
    baseline = True

    def scores(self, evidence: AttackEvidence) -> np.ndarray:
        probs = torch.softmax(torch.tensor(evidence.logits), dim=1).double().numpy()  # a copy
        return -per_sample_loss(probs, evidence.labels)
