"""``dp_sgd`` (Abadi et al. 2016): s_i = min(1, C / n_i), C constant."""

from __future__ import annotations

import torch

from dpclip.methods.base import Method, clip_factors, register


@register
class DPSGD(Method):
    name = "dp_sgd"

    def scale(self, layer_norms: torch.Tensor) -> torch.Tensor:
        return clip_factors(layer_norms, self.clip_threshold)
