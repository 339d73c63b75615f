"""``dp_psac`` (Xia et al. 2023, per-sample adaptive clipping):

    s_i = C / (n_i + r / (n_i + r)),  so ||gbar_i|| = C n_i / (n_i + r / (n_i + r)) < C  (r > 0).
"""

from __future__ import annotations

import torch

from dpclip.methods.base import (Method, Option, Tunable, factors_of, register,
                                 total_norms)


@register
class DPPSAC(Method):
    name = "dp_psac"
    OPTIONS = {"r": Option(0.1, low=0.0, low_open=True, help="the paper's r (default 0.1)")}
    TUNED_OPTIONS = {"r": Tunable(0.01, 1.0, log=True)}

    def scale(self, layer_norms: torch.Tensor) -> torch.Tensor:
        norms = total_norms(layer_norms)
        wide, r = norms.double(), self.options.r
        return factors_of(self.clip_threshold, wide + r / (wide + r), norms.dtype)
