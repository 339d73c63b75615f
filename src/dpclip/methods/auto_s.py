"""``auto_s`` (Bu et al. 2023, automatic clipping / normalised SGD):

    s_i = C / (n_i + gamma),  so ||gbar_i|| = C n_i / (n_i + gamma) < C  (gamma > 0).
"""

from __future__ import annotations

import torch

from dpclip.methods.base import Method, Option, Tunable, register, total_norms


@register
class AutoS(Method):
    name = "auto_s"
    OPTIONS = {"gamma": Option(0.01, low=0.0, low_open=True,
                               help="stability constant added to every norm")}
    TUNED_OPTIONS = {"gamma": Tunable(0.001, 1.0, log=True)}

    def scale(self, layer_norms: torch.Tensor) -> torch.Tensor:
        return self.clip_threshold / (total_norms(layer_norms) + self.options.gamma)
