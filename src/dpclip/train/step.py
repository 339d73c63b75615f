"""The one DP-SGD step shared by every gradient method (METHODS.md, "The common DP-SGD step").

    gbar_i^(l) = s_i^(l) g_i^(l)                    (method's scaling rule, ||gbar_i|| <= C_t)
    G          = ( sum_i gbar_i + N(0, sigma_T^2 C_t^2 I) ) / B      (B = q N, the expected
                                                                      batch size, not |L_t|)
    theta     <- optimizer(theta, G)
    state     <- controller(released quantities)

Per-sample gradients come from Opacus's GradSampleModule; a "layer" is one module that owns
parameters (its weight and bias together).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import nn

from dpclip.methods.base import Method, StepRelease


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


def per_layer_norms(groups: LayerGroups) -> torch.Tensor:
    """n_i^(l) = ||g_i^(l)||, shape (B, L), from the ``grad_sample`` Opacus attached."""
    columns = []
    for group in groups.params:
        sq = sum(p.grad_sample.reshape(p.grad_sample.shape[0], -1).pow(2).sum(dim=1)
                 for p in group)
        columns.append(sq.sqrt())
    return torch.stack(columns, dim=1)


def as_layer_factors(factors: torch.Tensor, n_layers: int) -> torch.Tensor:
    """Broadcast per-sample factors (B,) to per-layer factors (B, L)."""
    if factors.dim() == 1:
        return factors[:, None].expand(-1, n_layers)
    return factors


def scaled_sum(groups: LayerGroups, factors: torch.Tensor) -> list[torch.Tensor]:
    """sum_i s_i^(l) g_i^(l) for every parameter, in ``groups.flat()`` order."""
    sums = []
    for l, group in enumerate(groups.params):
        for p in group:
            sums.append(torch.einsum("b,b...->...", factors[:, l], p.grad_sample))
    return sums


def dp_step(model: nn.Module, groups: LayerGroups, loss_fn, x: torch.Tensor, y: torch.Tensor,
            method: Method, sigma_train: float, expected_batch: float,
            optimizer: torch.optim.Optimizer, noise_gen: torch.Generator, step: int
            ) -> tuple[float, StepRelease]:
    """One DP step on a non-empty Poisson batch; returns (mean batch loss, the release)."""
    clip = method.clip_threshold
    optimizer.zero_grad(set_to_none=True)
    losses = loss_fn(model(x), y)  # per-sample losses, reduction="none"
    with warnings.catch_warnings():
        # Opacus's hooks warn that the input needs no gradient; that is expected here
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        losses.sum().backward()
    layer_norms = per_layer_norms(groups)
    factors = as_layer_factors(method.scale(layer_norms), len(groups.names))
    extras = method.release_extras(layer_norms, noise_gen)
    noisy = []
    for p, total in zip(groups.flat(), scaled_sum(groups, factors)):
        noise = torch.normal(0.0, sigma_train * clip, size=total.shape, generator=noise_gen,
                             device=total.device)
        p.grad = (total + noise) / expected_batch
        p.grad_sample = None
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
