"""``auto_s`` (Bu et al. 2023, automatic clipping / normalised SGD):

    s_i = C / (n_i + gamma),  so ||gbar_i|| = C n_i / (n_i + gamma) < C  (gamma > 0).
"""

from __future__ import annotations

import torch

from dpclip.methods.base import (Method, Option, Tunable, factors_of, register,
                                 total_norms)


@register
class AutoS(Method):
    name = "auto_s"
    # gamma >= 1e-12 keeps every factor (at most C / gamma) finite in float32
    OPTIONS = {"gamma": Option(0.01, low=1e-12,
                               help="stability constant added to every norm (>= 1e-12)")}
    TUNED_OPTIONS = {"gamma": Tunable(0.001, 1.0, log=True)}

    def scale(self, layer_norms: torch.Tensor) -> torch.Tensor:
        totals = total_norms(layer_norms)
        return factors_of(self.clip_threshold, totals.double() + self.options.gamma,
                          totals.dtype)
