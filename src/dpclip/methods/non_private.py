"""``non_private``: plain SGD/Adam, no clipping, no noise; epsilon = infinity (the ceiling)."""

from __future__ import annotations

import torch

from dpclip.methods.base import Method, register


@register
class NonPrivate(Method):
    name = "non_private"
    private = False
    run_kind = "plain"
    dp_guarantee = False
    adjacency = None  # no DP claim

    def data_use(self) -> dict[str, str]:
        return {"weights": "members, without clipping or noise (no DP)"}

    def scale(self, layer_norms: torch.Tensor) -> torch.Tensor:
        return torch.ones(layer_norms.shape[0], dtype=layer_norms.dtype,
                          device=layer_norms.device)
