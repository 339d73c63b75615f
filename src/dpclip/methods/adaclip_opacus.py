"""``adaclip_opacus``: Opacus's ``AdaClipDPOptimizer`` as it is, the literal variant beside the
sound ``adaclip``; runs are flagged ``dp_guarantee: false`` (it accounts its raw count as
sensitivity 1/2 and divides by the actual batch size). It brings its own optimizer
(``run_kind = "opacus_optimizer"``). docs/methods.md, "AdaClip: the sound form, and Opacus's".
"""

from __future__ import annotations

import torch

from dpclip.methods.base import Method, clip_factors, register
from dpclip.methods.common.adaclip import ADACLIP_OPTIONS, ADACLIP_TUNED, check_clip_range
from dpclip.privacy import ExtraQuery


@register
class AdaClipOpacus(Method):
    name = "adaclip_opacus"
    dp_guarantee = False
    controller_data = ("Opacus's noisy count of unclipped gradients over the actual batch size "
                       "(under-accounted: no DP)")
    run_kind = "opacus_optimizer"
    OPTIONS = ADACLIP_OPTIONS  # the same knobs as the sound adaclip, in its own section
    TUNED_OPTIONS = ADACLIP_TUNED

    @classmethod
    def check_options(cls, values, prefix: str, layer_names: list[str]) -> list[str]:
        return check_clip_range(values, prefix)

    @property
    def count_std(self) -> float:
        return self.options.count_noise_fraction * self.context.expected_batch

    def extra_queries(self, sigma_eff: float) -> list[ExtraQuery]:
        # Opacus's own split: the count taken to have sensitivity 1/2 (see the module note)
        return [ExtraQuery("unclipped", 0.5, self.count_std,
                           option=f"methods.{self.name}.count_noise_fraction")]

    def scale(self, layer_norms: torch.Tensor) -> torch.Tensor:
        # Opacus clips inside its optimizer; this is the same rule, for the clip-bound tests
        return clip_factors(layer_norms, self.clip_threshold)

    def attach(self, model, optimizer, noise_gen):
        from opacus import GradSampleModule  # on use: opacus loads slowly
        from opacus.optimizers import AdaClipDPOptimizer

        wrapped = GradSampleModule(model, batch_first=True, loss_reduction="mean")
        dp_optimizer = AdaClipDPOptimizer(
            optimizer, noise_multiplier=self.sigma_eff,
            target_unclipped_quantile=self.options.target_quantile,
            clipbound_learning_rate=self.options.clip_lr,
            max_clipbound=self.options.c_max, min_clipbound=self.options.c_min,
            unclipped_num_std=self.count_std, max_grad_norm=self.clip_threshold,
            expected_batch_size=self.context.expected_batch, loss_reduction="mean",
            generator=noise_gen)
        return wrapped, dp_optimizer

    def opacus_step(self, model, loss_fn, x, y, optimizer) -> float:
        optimizer.zero_grad(set_to_none=True)
        if len(x) == 0:
            return self._empty_step(model, optimizer)
        loss = loss_fn(model(x), y).mean()
        loss.backward()
        optimizer.step()
        self.clip_threshold = float(optimizer.max_grad_norm)
        return float(loss.detach())

    def _empty_step(self, model, optimizer) -> float:
        """An empty Poisson batch: the noise-only step Opacus's DPOptimizer takes, through the
        same noise and scaling calls. (AdaClipDPOptimizer itself fails on an empty batch, and
        its C update divides by the actual batch size, 0 here: C stays as it is.)"""
        for p in optimizer.params:
            p.grad_sample = torch.zeros((0, *p.shape), device=p.device)
            p.summed_grad = torch.zeros_like(p)
        optimizer.unclipped_num = torch.zeros((), device=optimizer.params[0].device)
        optimizer.add_noise()
        optimizer.scale_grad()
        optimizer.original_optimizer.step()
        return float("nan")
