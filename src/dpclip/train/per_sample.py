"""One layer's per-sample gradient norms and weighted gradient sum, from what the DP step's
single backward pass leaves: the layer's input activations a_i and its output gradients
delta_i = dL/dz_i (book-keeping). The contract every path keeps: for each record i, what the
weighted sum adds for it, ``weighted_sum(e_i)``, has a norm of at most the norm ``norms()``
returned for it (up to float32 rounding of that vector, a relative 1e-7), so a clip factor
s_i <= C / n_i bounds the record's contribution by C. How each layer kind's norm is computed
and why it bounds (``tests/train/test_contribution_bound.py`` checks it), and what
:func:`refusal` turns away: docs/privacy.md, "The contribution bound, for any model".
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from dpclip.errors import DpclipError

CONV_WEIGHT_GRADS = {nn.Conv1d: torch.nn.grad.conv1d_weight,
                     nn.Conv2d: torch.nn.grad.conv2d_weight,
                     nn.Conv3d: torch.nn.grad.conv3d_weight}
EPS64 = torch.finfo(torch.float64).eps  # 2^-52, twice float64's unit roundoff


@dataclass
class LayerTerms:
    """One layer's use in a DP step's forward pass: the module, its input activations, its
    output gradients dL/dz, and (once :meth:`norms` instantiated them) its per-sample
    gradients {parameter: (B, *parameter.shape)}. Every weighted sum is taken in float64."""

    module: nn.Module
    activations: list[torch.Tensor]
    backprops: torch.Tensor | None
    per_sample: dict | None = None

    def norms(self) -> dict:
        """{parameter: n_i, shape (B,)} for the layer's trainable parameters, each n_i at least
        the norm of what :meth:`weighted_sum` adds for record i per unit weight (module
        docstring)."""
        norms = self._norms()
        return self._drop_nonfinite(norms)

    def _drop_nonfinite(self, norms: dict) -> dict:
        """A record whose gradient overflowed (a norm of inf or NaN) contributes nothing: its
        rows of the inputs and output gradients (or its per-sample gradients) are set to 0 and
        its norms to inf, which every rule scales by 0 (0 * inf would make the sum NaN)."""
        bad = None
        for n in norms.values():
            bad = ~torch.isfinite(n) if bad is None else bad | ~torch.isfinite(n)
        if bad is None or not bool(bad.any()):
            return norms
        if self.per_sample is not None:
            self.per_sample = {p: torch.where(_rows(bad, g), 0, g)
                               for p, g in self.per_sample.items()}
        else:
            self.activations = [torch.where(_rows(bad, a), 0, a) if len(a) == len(bad) else a
                                for a in self.activations]
            self.backprops = torch.where(_rows(bad, self.backprops), 0, self.backprops)
        return {p: torch.where(bad, math.inf, n) for p, n in norms.items()}

    def _norms(self) -> dict:
        if self.per_sample is None:  # not yet summed over several calls (over_calls)
            analytic = self._norms_without_instantiating()
            if analytic is not None:
                return analytic
            self.per_sample = self.per_sample_gradients()
        # the weighted sum needs only the per-sample gradients now: free the layer's inputs
        # and output gradients before the next layer's are expanded (the step's peak memory)
        self.activations, self.backprops = [], None
        return {p: exact_norm_upward(g) for p, g in self.per_sample.items()}

    def _norms_without_instantiating(self) -> dict | None:
        """The norms of a Linear on vectors, and the ghost norm where the layer's shape
        prefers it (module docstring); None where per-sample gradients are instantiated."""
        module, backprops = self.module, self.backprops
        if type(module) is nn.Linear and backprops.dim() == 2:
            return _linear_norms(module, self.activations[0].to(backprops.dtype), backprops)
        if type(module) is nn.Linear:  # on (B, ..., d): applied at every position
            patches, outputs = positions(module, self.activations[0].to(backprops.dtype),
                                         backprops)
            if uses_ghost_norm(module, patches.shape[1], outputs.shape[2], patches.shape[2],
                               len(patches)):
                return _ghost_norms(module, patches, outputs, backprops.dtype)
        elif _plain_conv(module) and conv_uses_ghost_norm(module, backprops):
            a = self.activations[0].to(backprops.dtype)
            return _ghost_norms(module, *positions(module, a, backprops), backprops.dtype)
        return None

    def per_sample_gradients(self) -> dict:
        """{parameter: (B, *parameter.shape)} for the layer's own trainable parameters,
        instantiated whatever path :meth:`norms` would take."""
        module, backprops = self.module, self.backprops
        if type(module) is nn.Linear:
            grads = _linear_per_sample(module, *positions(
                module, self.activations[0].to(backprops.dtype), backprops))
        elif _plain_conv(module):
            grads = _conv_per_sample(module, self.activations[0].to(backprops.dtype),
                                     backprops)
        else:
            if len(self.activations) != 1:
                raise DpclipError(f"{type(module).__name__} layer called with "
                                  f"{len(self.activations)} tensor inputs: its per-sample "
                                  f"gradients (Opacus's samplers, functorch) take one")
            try:
                grads = grad_sampler(module)(module, self.activations, backprops)
            except (AttributeError, RuntimeError, ValueError, NotImplementedError) as exc:
                hint = "; a layer that owns parameters must not draw random numbers (put " \
                    "its Dropout in a module of its own)" if "random" in str(exc) else ""
                raise DpclipError(f"{type(module).__name__} layer: its per-sample gradients "
                                  f"failed ({type(exc).__name__}: {exc}){hint}; the model is "
                                  f"refused") from exc
            if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                grads[module.weight][:, module.padding_idx] = 0  # as autograd: no gradient
        own = {id(p) for p in module.parameters(recurse=False)}
        return {p: g for p, g in grads.items() if p.requires_grad and id(p) in own}

    @classmethod
    def over_calls(cls, calls: list["LayerTerms"]) -> "LayerTerms":
        """One layer called several times in a forward pass (a recurrent cell at every time
        step, a block applied twice): a record's gradient is the sum over the calls, so each
        call's per-sample gradients are instantiated and summed, and the norm and weighted sum
        are both taken of that sum (the exact-norm path)."""
        if len(calls) == 1:
            return calls[0]
        total: dict = {}
        for call in calls:
            for p, g in call.per_sample_gradients().items():
                total[p] = g if p not in total else total[p] + g
            call.activations, call.backprops = [], None
        return cls(calls[0].module, [], None, total)

    def weighted_sum(self, weights: torch.Tensor) -> dict:
        """{parameter: sum_i w_i g_i} for the layer's trainable parameters, accumulated and
        returned in float64 whatever the model's dtype (docs/privacy.md; the step's noise covers
        its rounding: :func:`dpclip.train.step.rounding_slack`). Lets go of the output gradients."""
        module = self.module
        if self.per_sample is not None:
            return {p: torch.tensordot(weights.to(torch.float64), g.to(torch.float64), dims=1)
                    for p, g in self.per_sample.items()}
        compute = torch.float64
        shape = (-1,) + (1,) * (self.backprops.dim() - 1)
        # not in place: autograd may hand one gradient tensor to several layers (a(x) + b(x))
        weighted = self.backprops.to(compute) * weights.to(compute).reshape(shape)
        self.backprops = None
        a = self.activations[0].to(compute)
        if type(module) is nn.Linear:
            # batch and any sequence dimensions are summed: (w delta)^T a, never per sample; a
            # plain matrix product (einsum runs it as a batched one of batch size 1, slower)
            flat = weighted.reshape(-1, weighted.shape[-1])
            out = {module.weight: flat.T @ a.reshape(-1, a.shape[-1])}
            if module.bias is not None:
                out[module.bias] = flat.sum(dim=0)
        elif _plain_conv(module):
            # a convolution's gradient is linear in its output gradient: the weighted sum of
            # the per-sample gradients is the ordinary weight gradient of w * delta
            out = {module.weight: CONV_WEIGHT_GRADS[type(module)](
                a, module.weight.shape, weighted, module.stride, module.padding,
                module.dilation, module.groups)}
            if module.bias is not None:
                out[module.bias] = weighted.sum(dim=[0, *range(2, weighted.dim())])
        else:
            raise RuntimeError(f"{type(module).__name__}: no per-sample gradients kept for "
                               f"its weighted sum (norms() was not called)")
        return {p: g for p, g in out.items() if p.requires_grad}


def _rows(mask: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """A per-record mask (B,) shaped to broadcast over ``t`` (B, ...)."""
    return mask.reshape((-1,) + (1,) * (t.dim() - 1))


def round_upward(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A ``dtype`` number >= x for each x >= 0 (x in float64, or already in ``dtype``, then
    returned as it is), 0 only where x is: x (1 + 2 eps) + the smallest subnormal, rounded to
    nearest (half a unit in the last place is at most x eps / 2 for normal numbers, half the
    smallest subnormal below them)."""
    if dtype == x.dtype:
        return x
    info = torch.finfo(dtype)
    return (x * (1 + 2 * info.eps) + info.smallest_normal * info.eps).to(dtype) * (x > 0)


def combined_norm(norms: list[torch.Tensor]) -> torch.Tensor:
    """sqrt(sum_k n_k^2) of a layer's parameters' norms, never below the true value: in their
    dtype times (1 + (k + 4) eps) where no square can underflow or overflow (see
    :data:`UNDERFLOW_RISK`), else in float64 and rounded upwards (a float32 square of a norm
    below 1e-19 is 0: a nonzero block would be clipped as a zero one)."""
    if len(norms) == 1:
        return norms[0]
    stacked = torch.stack(norms, dim=1)
    low, high = torch.aminmax(stacked)
    if stacked.dtype != torch.float64 and \
            UNDERFLOW_RISK <= float(low) and float(high) <= 1 / UNDERFLOW_RISK:
        eps = torch.finfo(stacked.dtype).eps
        return stacked.square().sum(dim=1).sqrt() * (1 + (len(norms) + 4) * eps)
    return round_upward(stacked.to(torch.float64).square().sum(dim=1).sqrt() *
                        (1 + (len(norms) + 4) * EPS64), stacked.dtype)


def exact_norm_upward(g: torch.Tensor) -> torch.Tensor:
    """||g_i|| of per-sample gradients (B, ...): squares summed in float64 (each square of a
    float32 is exact there), the sum's worst-case rounding (k EPS64 for k terms) added, then
    rounded upwards to g's dtype."""
    flat = g.reshape(len(g), -1)
    norms = torch.linalg.vector_norm(flat, dim=1, dtype=torch.float64)
    return round_upward(norms * (1 + (flat.shape[1] + 2) * EPS64), g.dtype)


def _linear_norms(layer: nn.Linear, a: torch.Tensor, backprops: torch.Tensor) -> dict:
    """||g_i|| = ||delta_i|| ||a_i|| (weight) and ||delta_i|| (bias) from row sums of squares,
    times (1 + (p + d + 10) eps) to bound every rounding (eps: the dtype's machine epsilon);
    where a row's sum is below :data:`UNDERFLOW_RISK` or above its inverse, in float64 and
    rounded upwards instead (docs/privacy.md, "The contribution bound, for any model")."""
    delta_sq, a_sq = row_squares(backprops), row_squares(a)
    low, high = torch.aminmax(torch.cat([delta_sq, a_sq]))
    if backprops.dtype != torch.float64 and \
            UNDERFLOW_RISK <= float(low) and float(high) <= 1 / UNDERFLOW_RISK:
        weight = (delta_sq * a_sq).sqrt()
        bias = delta_sq.sqrt()
        bound = 1 + (backprops.shape[1] + a.shape[1] + 10) * torch.finfo(backprops.dtype).eps
    else:
        delta_sq = backprops.to(torch.float64).square().sum(dim=1)
        a_sq = a.to(torch.float64).square().sum(dim=1)
        weight, bias = (delta_sq * a_sq).sqrt(), delta_sq.sqrt()
        bound = 1 + (backprops.shape[1] + a.shape[1] + 10) * EPS64
    out = {}
    if layer.weight.requires_grad:
        out[layer.weight] = round_upward(weight * bound, backprops.dtype)
    if layer.bias is not None and layer.bias.requires_grad:
        out[layer.bias] = round_upward(bias * bound, backprops.dtype)
    return out


# below this (or above its inverse) a float32 sum of squares may have lost squares to underflow
# (numbers under 2^-63 square to 0 or a subnormal) or overflowed: float64 is used instead
UNDERFLOW_RISK = 2.0 ** -60


ROW_CHUNK = 1 << 16  # elements squared at a time


def row_squares(t: torch.Tensor) -> torch.Tensor:
    """sum_j t_ij^2 for each row of a 2-D tensor: the numbers of ``t.square().sum(dim=1)``
    (each row is reduced alone, so in the same order), without a temporary of t's size: a
    layer's input can be the largest tensor of the step."""
    rows = max(1, ROW_CHUNK // max(1, t.shape[1]))
    if rows >= len(t):
        return t.square().sum(dim=1)
    return torch.cat([t[i:i + rows].square().sum(dim=1) for i in range(0, len(t), rows)])


def _plain_conv(module: nn.Module) -> bool:
    """A convolution whose padding torch's weight-gradient functions reproduce: numeric
    padding with zeros ('same', 'valid' and reflect or circular padding take the general
    path)."""
    return type(module) in CONV_WEIGHT_GRADS and isinstance(module.padding, tuple) and \
        module.padding_mode == "zeros"


# per-sample gradients of at most this many numbers (B p d) are instantiated even where the
# ghost norm takes fewer operations: a grouped convolution beats the float64 ghost norm and
# weighted sum there (docs/measurements.md), and holds less memory than the float64 patches
# the ghost norm needs (B T d)
INSTANTIATION_BUDGET = 1 << 24


def uses_ghost_norm(layer: nn.Module, positions: int, p: int, d: int, batch: int) -> bool:
    """The ghost norm iff Bu, Mao & Xu's layerwise rule prefers it (2 T^2 < p d: T positions,
    p output channels or features, d = inputs per position) and the per-sample gradients
    would exceed :data:`INSTANTIATION_BUDGET` numbers. Grouped convolutions instantiate."""
    return getattr(layer, "groups", 1) == 1 and 2 * positions ** 2 < p * d and \
        batch * p * d > INSTANTIATION_BUDGET


def conv_uses_ghost_norm(layer: nn.Module, backprops: torch.Tensor) -> bool:
    """:func:`uses_ghost_norm` for a convolution and its output gradients."""
    d = layer.in_channels // layer.groups * math.prod(layer.kernel_size)
    return uses_ghost_norm(layer, backprops[0, 0].numel(), layer.out_channels, d,
                           len(backprops))


def positions(layer: nn.Module, a: torch.Tensor, backprops: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's inputs (B, T, d) and output gradients (B, T, p) per position: a Linear's
    leading dimensions after the batch, a convolution's unfolded patches."""
    if type(layer) is nn.Linear:
        return a.reshape(len(a), -1, a.shape[-1]), \
            backprops.reshape(len(backprops), -1, backprops.shape[-1])
    return _unfold(layer, a).transpose(1, 2), \
        backprops.reshape(len(backprops), layer.out_channels, -1).transpose(1, 2)


def _unfold(layer: nn.Module, a: torch.Tensor) -> torch.Tensor:
    """The layer's input as (B, d, T) patches, one column per output position."""
    if type(layer) is nn.Conv1d:
        return F.unfold(a.unsqueeze(2), (1, layer.kernel_size[0]),
                        dilation=(1, layer.dilation[0]), padding=(0, layer.padding[0]),
                        stride=(1, layer.stride[0]))
    if type(layer) is nn.Conv2d:
        return F.unfold(a, layer.kernel_size, dilation=layer.dilation, padding=layer.padding,
                        stride=layer.stride)
    from opacus.utils.tensor_utils import unfold3d

    return unfold3d(a, kernel_size=layer.kernel_size, padding=layer.padding,
                    stride=layer.stride, dilation=layer.dilation)


def ghost_norm_upper_bound(patches: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
    """An upper bound on ||g_i|| = ||D_i^T A_i||_F (float64, shape (B,)) from A_i (T x d) and
    D_i (T x p) without forming g_i: the float64 sum_{t,s} <a_t, a_s> <delta_t, delta_s> plus
    its worst-case rounding (d + p + T^2 + 2) EPS64 M_i^2 under the root, and (T + 2) EPS64 M_i for
    the float64 weighted sum, M_i = sum_t ||a_t|| ||delta_t|| (docs/privacy.md derives it)."""
    a = patches.to(torch.float64, memory_format=torch.contiguous_format)
    d = outputs.to(torch.float64, memory_format=torch.contiguous_format)
    positions, width, features = a.shape[1], a.shape[2], d.shape[2]
    squared = ((a @ a.transpose(1, 2)) * (d @ d.transpose(1, 2))).sum(dim=(1, 2))
    spread = (a.norm(dim=2) * d.norm(dim=2)).sum(dim=1)  # M_i
    error = (width + features + positions ** 2 + 2) * EPS64 * spread.square()
    return (squared.clamp_min(0) + error).sqrt() + (positions + 2) * EPS64 * spread


def _ghost_norms(layer: nn.Module, patches: torch.Tensor, outputs: torch.Tensor,
                 dtype: torch.dtype) -> dict:
    """Weight: :func:`ghost_norm_upper_bound`. Bias: ||sum_t delta_t|| in float64 plus the
    sum's rounding bound (T + 2) EPS64 sum_t ||delta_t||. Both rounded upwards to ``dtype``."""
    out = {}
    if layer.weight.requires_grad:
        out[layer.weight] = round_upward(ghost_norm_upper_bound(patches, outputs), dtype)
    if layer.bias is not None and layer.bias.requires_grad:
        deltas = outputs.to(torch.float64)
        bound = deltas.sum(dim=1).norm(dim=1) + \
            (deltas.shape[1] + 2) * EPS64 * deltas.norm(dim=2).sum(dim=1)
        out[layer.bias] = round_upward(bound, dtype)
    return out


def _linear_per_sample(layer: nn.Linear, patches: torch.Tensor, outputs: torch.Tensor
                       ) -> dict:
    """Per-sample gradients of a Linear applied at T positions: D_i^T A_i, one batched matrix
    product (B, p, d), and the bias's sum_t delta_t."""
    out = {layer.weight: outputs.transpose(1, 2) @ patches}
    if layer.bias is not None:
        out[layer.bias] = outputs.sum(dim=1)
    return out


def _conv_per_sample(layer: nn.Module, a: torch.Tensor, backprops: torch.Tensor) -> dict:
    """Per-sample gradients of a convolution: torch's weight gradient mapped over the records
    (``torch.func.vmap``, which runs it as one grouped convolution)."""
    weight_grad = CONV_WEIGHT_GRADS[type(layer)]

    def one_record(a_i, delta_i):
        return weight_grad(a_i[None], layer.weight.shape, delta_i[None], layer.stride,
                           layer.padding, layer.dilation, layer.groups)

    out = {layer.weight: torch.func.vmap(one_record)(a, backprops)}
    if layer.bias is not None:
        out[layer.bias] = backprops.sum(dim=list(range(2, backprops.dim())))
    return out


@functools.cache
def opacus_samplers() -> dict:
    """Opacus's grad samplers, imported on first use: importing Opacus loads about a second
    of modules that the stages without a DP step do not need."""
    from opacus.grad_sample import GradSampleModuleFastGradientClipping as Registry

    return Registry.GRAD_SAMPLERS


def grad_sampler(layer: nn.Module):
    """Opacus's per-sample gradient function for a layer: its registered grad sampler, else
    functorch's (which runs the layer's own forward per record). A convolution padded other
    than with zeros takes functorch's: Opacus's convolution sampler pads with zeros."""
    from opacus.grad_sample.functorch import ft_compute_per_sample_gradient

    if type(layer) in CONV_WEIGHT_GRADS and layer.padding_mode != "zeros":
        return ft_compute_per_sample_gradient
    return opacus_samplers().get(type(layer), ft_compute_per_sample_gradient)


def refusal(module: nn.Module) -> str | None:
    """Why the DP step cannot give this module's per-sample gradients exactly (None: it can):
    a parametrized or weight-normed weight, a layer type with a fast path whose trainable
    parameters are not its own ``weight`` and ``bias``, and the others docs/privacy.md lists."""
    from torch.nn.utils import parametrize
    from torch.nn.utils.weight_norm import WeightNorm

    if parametrize.is_parametrized(module):
        return ("its weight is parametrized (torch.nn.utils.parametrize, e.g. "
                "parametrizations.weight_norm), which the per-sample gradient paths do not "
                "differentiate through")
    if any(isinstance(hook, WeightNorm) for hook in module._forward_pre_hooks.values()):
        return ("it has torch.nn.utils.weight_norm: its trained parameters weight_g and "
                "weight_v are not the weight the per-sample gradient paths differentiate")
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.max_norm is not None:
        return ("it has max_norm set: its forward pass renormalises the rows of the tokens in "
                "the batch in place, which moves the released weights with no clipping and no "
                "noise (leave max_norm=None)")
    if isinstance(module, nn.Embedding) and module.scale_grad_by_freq:
        return ("it has scale_grad_by_freq=True: Opacus's per-sample gradient ignores the "
                "frequency scaling")
    odd = sorted({str(p.dtype) for p in module.parameters(recurse=False)} -
                 {"torch.float32", "torch.float64", "torch.bfloat16"})
    if odd:
        return (f"its parameters are {', '.join(odd)}: the norm bounds are for float32, "
                f"float64 and bfloat16 (float16's range underflows them)")
    own = {name for name, p in module.named_parameters(recurse=False) if p.requires_grad}
    fast = type(module) is nn.Linear or type(module) in CONV_WEIGHT_GRADS or \
        type(module) in opacus_samplers()
    if fast and not own <= {"weight", "bias"}:
        return (f"its trainable parameters {sorted(own)} are not the {type(module).__name__}'s "
                f"own weight and bias, which its per-sample gradient path assumes")
    return None
