"""``adaclip`` (Andrew et al. 2021, quantile-based adaptive clipping), in its sound form for
Poisson sampling.

DP-SGD clipping; each step also releases the noisy centred count of unclipped records over the
expected batch B (sensitivity 1/2, the paper's Theorem 1 split), and
C_{t+1} = C_t exp(-eta_C (b~ - gamma)), clamped. Why not Opacus's ``AdaClipDPOptimizer``:
docs/methods.md, "AdaClip: the sound form, and Opacus's".
"""

from __future__ import annotations

import math

import torch

from dpclip.methods.base import Method, StepRelease, clip_factors, register
from dpclip.methods.common.adaclip import ADACLIP_OPTIONS, ADACLIP_TUNED, check_clip_range
from dpclip.privacy import ExtraQuery
from dpclip.randomness import NoiseSources


@register
class AdaClip(Method):
    name = "adaclip"
    controller_data = "the noisy centred count of members' unclipped gradients (accounted)"
    OPTIONS = ADACLIP_OPTIONS
    TUNED_OPTIONS = ADACLIP_TUNED

    @classmethod
    def check_options(cls, values, prefix: str, layer_names: list[str]) -> list[str]:
        return check_clip_range(values, prefix)

    @property
    def count_std(self) -> float:
        return self.options.count_noise_fraction * self.context.expected_batch

    def extra_queries(self, sigma_eff: float) -> list[ExtraQuery]:
        return [ExtraQuery("unclipped", 0.5, self.count_std,
                           option=f"methods.{self.name}.count_noise_fraction")]

    def scale(self, layer_norms: torch.Tensor) -> torch.Tensor:
        return clip_factors(layer_norms, self.clip_threshold, self.total_norms(layer_norms))

    def release_extras(self, layer_norms: torch.Tensor, rng: NoiseSources) -> dict:
        """b~ = (sum_i (1[n_i <= C] - 1/2) + N(0, sigma_b^2)) / B + 1/2."""
        totals = self.total_norms(layer_norms)
        centred = int((totals <= self.clip_threshold).sum()) - 0.5 * len(totals)
        noise = float(torch.normal(0.0, self.count_std, size=(1,), dtype=torch.float64,
                                   generator=rng.extras))
        return {"unclipped_fraction": (centred + noise) / self.context.expected_batch + 0.5}


    def __init__(self, context):
        super().__init__(context)
        self._fraction = math.nan

    def update(self, release: StepRelease) -> None:
        fraction = release.extras["unclipped_fraction"]
        opts = self.options
        c = self.clip_threshold * math.exp(-opts.clip_lr * (fraction - opts.target_quantile))
        self.clip_threshold = min(max(c, opts.c_min), opts.c_max)
        self._fraction = fraction

    def trace_row(self) -> dict:
        return {"adaclip_unclipped_fraction": self._fraction}
