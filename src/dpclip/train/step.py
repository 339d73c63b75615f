"""The one DP-SGD step shared by every gradient method (METHODS.md, "The common DP-SGD step").

    gbar_i^(l) = s_i^(l) g_i^(l)                    (method's scaling rule, ||gbar_i|| <= C_t)
    G          = ( sum_i gbar_i + N(0, sigma_T^2 C_t^2 I) ) / B      (B = q N, the expected
                                                                      batch size, not |L_t|)
    theta     <- optimizer(theta, G)
    state     <- controller(released quantities)

Per-sample gradient norms come from Opacus (``GradSampleModuleFastGradientClipping``: exact
"ghost" norms for Linear layers, materialised per-sample gradients for the others), so the
per-sample gradients of a Linear layer are never built: the clipped sum is a second backward
pass of sum_i s_i loss_i (one per layer when the factors differ by layer). A "layer" is one
module that owns parameters (its weight and bias together).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from torch import nn

from dpclip.methods.base import Method, StepRelease

# Opacus's backward hooks warn that the input needs no gradient: expected, and once per step
warnings.filterwarnings("ignore", message="Full backward hook is firing")


@dataclass
class LayerGroups:
    """Parameters grouped by the module that owns them, in model order."""

    names: list[str]
    params: list[list[nn.Parameter]]

    @classmethod
    def of(cls, model: nn.Module) -> "LayerGroups":
        names, params = [], []
        for name, module in model.named_modules():
            own = [p for p in module.parameters(recurse=False) if p.requires_grad]
            if own:
                names.append(name.removeprefix("_module."))
                params.append(own)
        return cls(names, params)

    def flat(self) -> list[nn.Parameter]:
        return [p for group in self.params for p in group]


def wrap_for_dp(model: nn.Module) -> GradSampleModuleFastGradientClipping:
    """Attach Opacus's per-sample norm hooks (losses are summed, batch first)."""
    return GradSampleModuleFastGradientClipping(model, batch_first=True, loss_reduction="sum",
                                                use_ghost_clipping=True)


def per_layer_norms(groups: LayerGroups) -> torch.Tensor:
    """n_i^(l) = ||g_i^(l)||, shape (B, L), from the per-parameter norms Opacus attached.

    Each norm is read once and removed, so a missing hook can never reuse a stale norm.
    """
    columns = []
    for group in groups.params:
        squares = 0.0
        for p in group:
            norm = getattr(p, "_norm_sample", None)
            if norm is None:
                raise RuntimeError("Opacus computed no per-sample norm for a parameter")
            squares = squares + norm ** 2
            p._norm_sample = None
        columns.append(squares.sqrt())
    return torch.stack(columns, dim=1)


def scaled_sum(model: GradSampleModuleFastGradientClipping, groups: LayerGroups,
               losses: torch.Tensor, factors: torch.Tensor) -> list[torch.Tensor]:
    """sum_i s_i^(l) g_i^(l) for every parameter, in ``groups.flat()`` order.

    g_i is the gradient of loss_i, so sum_i s_i g_i is the gradient of sum_i s_i loss_i with
    the factors held constant: one extra backward pass (one per layer for per-layer factors).
    """
    factors = factors.detach()
    model.disable_hooks()
    try:
        if factors.dim() == 1:
            return list(torch.autograd.grad((factors * losses).sum(), groups.flat()))
        sums = []
        for layer, group in enumerate(groups.params):
            sums += torch.autograd.grad((factors[:, layer] * losses).sum(), group,
                                        retain_graph=True)
        return sums
    finally:
        model.enable_hooks()


def dp_step(model: nn.Module, groups: LayerGroups, loss_fn, x: torch.Tensor, y: torch.Tensor,
            method: Method, sigma_train: float, expected_batch: float,
            optimizer: torch.optim.Optimizer, noise_gen: torch.Generator, step: int
            ) -> tuple[float, StepRelease]:
    """One DP step on a non-empty Poisson batch; returns (mean batch loss, the release)."""
    clip = method.clip_threshold
    optimizer.zero_grad(set_to_none=True)
    losses = loss_fn(model(x), y)  # per-sample losses, reduction="none"
    losses.sum().backward(retain_graph=True)  # the hooks record per-sample norms
    layer_norms = per_layer_norms(groups)
    factors = method.scale(layer_norms)
    extras = method.release_extras(layer_norms, noise_gen)
    noisy = []
    for p, total in zip(groups.flat(), scaled_sum(model, groups, losses, factors)):
        noise = torch.normal(0.0, sigma_train * clip, size=total.shape, generator=noise_gen,
                             device=total.device)
        p.grad = (total + noise) / expected_batch
        noisy.append(p.grad.detach())
    optimizer.step()
    release = StepRelease(step=step, noisy_grad=noisy, extras=extras)
    method.update(release)
    return float(losses.mean().detach()), release


def plain_step(model: nn.Module, loss_fn, x, y, optimizer) -> float:
    """Non-private step: mean loss, plain gradient."""
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y).mean()
    loss.backward()
    optimizer.step()
    return float(loss.detach())
