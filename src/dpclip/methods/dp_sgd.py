"""``dp_sgd`` (Abadi et al. 2016): s_i = min(1, C / n_i), C constant."""

from __future__ import annotations

import torch

from dpclip.methods.base import Method, register, total_norms


@register
class DPSGD(Method):
    name = "dp_sgd"

    def scale(self, layer_norms: torch.Tensor) -> torch.Tensor:
        norms = total_norms(layer_norms)
        # n_i = 0 gives factor 1 (a zero gradient needs no clipping); clamp avoids 0/0
        return (self.clip_threshold / norms.clamp_min(1e-12)).clamp(max=1.0)
