"""The one DP-SGD step shared by every gradient method (METHODS.md, "The common DP-SGD step").

    gbar_i^(l) = s_i^(l) g_i^(l)                    (method's scaling rule, ||gbar_i|| <= C_t)
    G          = ( sum_i gbar_i + N(0, sigma_T^2 C_t^2 I) ) / B      (B = q N, the expected
                                                                      batch size, not |L_t|)
    theta     <- optimizer(theta, G)
    state     <- controller(released quantities)

Per-sample gradient norms come from Opacus (``GradSampleModuleFastGradientClipping``: exact
"ghost" norms for Linear layers, as row sums of squares here, materialised per-sample gradients
for the others), so the
per-sample gradients of a Linear layer are never built. The one backward pass also keeps each
layer's activations a_i and output gradients delta_i (Opacus's hooks capture them anyway), and
the scaled sum is formed from them directly, for per-sample and per-layer factors alike:
    Linear:  sum_i s_i^(l) g_i^(l) = (s^(l) * delta)^T a   (weight),  sum_i s_i^(l) delta_i  (bias)
    Conv:    the ordinary weight gradient of the weighted output gradients s^(l) * delta
             (one backward convolution, no per-sample tensors)
    others:  Opacus's per-sample gradient of the layer, summed with weights s_i^(l).
No second backward pass is needed. A "layer" is one module that owns parameters (its weight and
bias together).
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass

import torch
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from opacus.grad_sample.functorch import ft_compute_per_sample_gradient
from torch import nn

from dpclip.methods.base import Method, StepRelease
from dpclip.randomness import NoiseSources

# Opacus's backward hooks warn that the input needs no gradient: expected, and once per step
warnings.filterwarnings("ignore", message="Full backward hook is firing")


@dataclass
class LayerGroups:
    """Parameters grouped by the module that owns them, in model order."""

    names: list[str]
    params: list[list[nn.Parameter]]
    modules: list[nn.Module]

    @classmethod
    def of(cls, model: nn.Module) -> "LayerGroups":
        names, params, modules = [], [], []
        for name, module in model.named_modules():
            own = [p for p in module.parameters(recurse=False) if p.requires_grad]
            if own:
                names.append(name.removeprefix("_module."))
                params.append(own)
                modules.append(module)
        return cls(names, params, modules)

    def flat(self) -> list[nn.Parameter]:
        return [p for group in self.params for p in group]


def linear_norms(layer: nn.Linear, activations: list[torch.Tensor], backprops: torch.Tensor
                 ) -> dict:
    """Per-sample gradient norms of a Linear layer: ||g_i|| = ||delta_i|| ||a_i|| for the
    weight (the per-sample gradient is the outer product delta_i a_i^T) and ||delta_i|| for the
    bias. Opacus's norm sampler, with row sums of squares instead of its batched einsum (a
    B-fold bmm of 1 x d by d x 1 products, the largest single cost of the MLP's DP step).
    Sequence inputs (3-D) keep Opacus's Gram form."""
    if backprops.dim() != 2:
        return OPACUS_LINEAR_NORMS(layer, activations, backprops)
    a = activations[0].to(backprops.dtype)
    delta_sq = backprops.square().sum(dim=1)
    out = {}
    if layer.weight.requires_grad:
        out[layer.weight] = (delta_sq * a.square().sum(dim=1)).sqrt()
    if layer.bias is not None and layer.bias.requires_grad:
        out[layer.bias] = delta_sq.sqrt()
    return out


OPACUS_LINEAR_NORMS = GradSampleModuleFastGradientClipping.NORM_SAMPLERS[nn.Linear]


class NormsAndSums(GradSampleModuleFastGradientClipping):
    """Opacus's ghost-norm module that also keeps, per layer, the (activations, output
    gradients) its hooks captured in the backward pass, for :func:`scaled_sum`."""

    NORM_SAMPLERS = {**GradSampleModuleFastGradientClipping.NORM_SAMPLERS,
                     nn.Linear: linear_norms}

    def rearrange_grad_samples(self, *, module, backprops, loss_reduction, batch_first):
        activations, backprops = super().rearrange_grad_samples(
            module=module, backprops=backprops, loss_reduction=loss_reduction,
            batch_first=batch_first)
        if self.hooks_enabled:
            module._dpclip_captured = getattr(module, "_dpclip_captured", [])
            module._dpclip_captured.append((activations, backprops))
        return activations, backprops


def wrap_for_dp(model: nn.Module) -> NormsAndSums:
    """Attach Opacus's per-sample norm hooks (losses are summed, batch first)."""
    return NormsAndSums(model, batch_first=True, loss_reduction="sum", use_ghost_clipping=True)


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


def scaled_sum(model: NormsAndSums, groups: LayerGroups, factors: torch.Tensor
               ) -> list[torch.Tensor]:
    """sum_i s_i^(l) g_i^(l) for every parameter, in ``groups.flat()`` order, from the
    activations and output gradients captured in the backward pass (each read once)."""
    factors = factors.detach()
    sums = []
    for layer, (module, group) in enumerate(zip(groups.modules, groups.params)):
        captured = getattr(module, "_dpclip_captured", None)
        if not captured:
            raise RuntimeError(f"no activations were captured for layer {groups.names[layer]}")
        del module._dpclip_captured
        weights = factors if factors.dim() == 1 else factors[:, layer]
        totals: dict[int, torch.Tensor] = {}
        for activations, backprops in captured:  # one entry per use of the module
            for param, total in _layer_sum(model, module, activations, backprops,
                                           weights).items():
                totals[id(param)] = total if id(param) not in totals else \
                    totals[id(param)] + total
        sums += [totals[id(p)] if id(p) in totals else torch.zeros_like(p) for p in group]
    return sums


def _layer_sum(model: NormsAndSums, module: nn.Module, activations, backprops,
               weights: torch.Tensor) -> dict:
    """{parameter: sum_i w_i g_i} for one use of one layer."""
    shape = (-1,) + (1,) * (backprops.dim() - 1)
    weighted = backprops * weights.to(backprops.dtype).reshape(shape)
    if type(module) is nn.Linear:
        # batch and any sequence dimensions are summed: (w delta)^T a, never per sample
        a = activations[0].to(weighted.dtype)
        # a plain matrix product (einsum runs it as a batched one of batch size 1, slower)
        out = {module.weight: weighted.reshape(-1, weighted.shape[-1]).T @
               a.reshape(-1, a.shape[-1])}
        if module.bias is not None:
            out[module.bias] = weighted.reshape(-1, weighted.shape[-1]).sum(dim=0)
        return {p: g for p, g in out.items() if p.requires_grad}
    if type(module) in CONV_WEIGHT_GRADS and isinstance(module.padding, tuple) and \
            module.padding_mode == "zeros":
        # a convolution's gradient is linear in its output gradient: the weighted sum of the
        # per-sample gradients is the ordinary weight gradient of the weighted output
        # gradient, at the cost of one backward convolution (no per-sample tensors)
        out = {module.weight: CONV_WEIGHT_GRADS[type(module)](
            activations[0].to(weighted.dtype), module.weight.shape, weighted, module.stride,
            module.padding, module.dilation, module.groups)}
        if module.bias is not None:
            out[module.bias] = weighted.sum(dim=[0, *range(2, weighted.dim())])
        return {p: g for p, g in out.items() if p.requires_grad}
    # other layers: Opacus's per-sample gradients (linear in the output gradient), summed
    sampler = model.GRAD_SAMPLERS.get(type(module), ft_compute_per_sample_gradient)
    return {p: g.sum(dim=0) for p, g in sampler(module, activations, weighted).items()
            if p.requires_grad}


CONV_WEIGHT_GRADS = {nn.Conv1d: torch.nn.grad.conv1d_weight,
                     nn.Conv2d: torch.nn.grad.conv2d_weight,
                     nn.Conv3d: torch.nn.grad.conv3d_weight}


def dp_step(model: nn.Module, groups: LayerGroups, loss_fn, x: torch.Tensor, y: torch.Tensor,
            method: Method, sigma_train: float, expected_batch: float,
            optimizer: torch.optim.Optimizer, rng: NoiseSources, step: int
            ) -> tuple[float, StepRelease]:
    """One DP step on Poisson batch (x, y); returns (mean batch loss, the release).

    An empty batch is a full step, as the accountant models it and as Opacus does: the clipped
    sum is zero, so the update is the noise alone, the extra queries release their noise, and
    the controller reads those releases as usual (skipping the step would reveal that the batch
    was empty). Its loss is NaN. Noise comes from ``rng.noise``, extra answers from the method.
    """
    clip = method.clip_threshold
    optimizer.zero_grad(set_to_none=True)
    for module in groups.modules:  # nothing captured by an earlier, interrupted step
        module.__dict__.pop("_dpclip_captured", None)
    if len(x) == 0:
        loss = float("nan")
        layer_norms = torch.zeros((0, len(groups.names)), device=x.device)
        method.scale(layer_norms)  # a rule with state sees the (empty) batch as always
        sums = [torch.zeros_like(p) for p in groups.flat()]
    else:
        losses = loss_fn(model(x), y)  # per-sample losses, reduction="none"
        losses.sum().backward()  # the hooks record per-sample norms, activations, gradients
        loss = float(losses.mean().detach())
        layer_norms = per_layer_norms(groups)
        sums = scaled_sum(model, groups, method.scale(layer_norms))
    extras = method.release_extras(layer_norms, rng)
    noisy = []
    for p, total in zip(groups.flat(), sums):
        noise = torch.normal(0.0, sigma_train * clip, size=total.shape, generator=rng.noise,
                             device=total.device)
        p.grad = noise.add_(total).div_(expected_batch)  # (sum + noise) / B, in place
        noisy.append(p.grad.detach())
    optimizer.step()
    release = StepRelease(step=step, noisy_grad=noisy, extras=extras)
    method.update(release)
    return loss, release


def plain_step(model: nn.Module, loss_fn, x, y, optimizer) -> float:
    """Non-private step: mean loss, plain gradient."""
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y).mean()
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def layer_norms_of(model: nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor,
                   batch: int = 512) -> torch.Tensor:
    """n_i^(l) for every record (N x L) under ``model``'s current weights, with the same Opacus
    norms as the DP step. Works on a copy: ``model`` keeps no hooks."""
    private_copy = copy.deepcopy(model).train()  # Opacus captures in training mode only
    groups = LayerGroups.of(private_copy)
    wrapped = wrap_for_dp(private_copy)
    out = []
    for start in range(0, len(x), batch):
        losses = loss_fn(wrapped(x[start:start + batch]), y[start:start + batch])
        losses.sum().backward()
        out.append(per_layer_norms(groups).detach())
        for module in groups.modules:
            module.__dict__.pop("_dpclip_captured", None)
        wrapped.zero_grad(set_to_none=True)
    return torch.cat(out)

