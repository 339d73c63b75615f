"""One layer's per-sample gradient norms and weighted gradient sum, from what the DP step's
single backward pass leaves: the layer's input activations a_i and its output gradients
delta_i = dL/dz_i (book-keeping, Bu et al. 2023). Each record's gradient of a layer is linear
in delta_i, so no second backward pass is needed.

Per layer type (B records; a convolution has T output positions, p = out channels and
d = in channels / groups x kernel size per position):

* ``Linear``: the "ghost" norm ||g_i|| = ||delta_i|| ||a_i|| (g_i = delta_i a_i^T), and the
  weighted sum (w * delta)^T a as one matrix product. Sequence inputs take Opacus's norm
  sampler (its Gram form); inputs of more dimensions, Opacus's per-sample gradients.
* Convolutions (zero padding): the mixed rule of Bu, Mao & Xu (2022) picks, by the layer's
  dimensions, the cheaper way to the norm. The ghost norm ``||g_i||^2 = <A_i^T A_i,
  D_i^T D_i>`` (A_i: the unfolded input, d x T; D_i: delta_i, p x T) costs B T^2 (p + d) time and
  B T^2 memory; instantiating the per-sample gradients costs B T p d time and B p d memory. The
  ghost norm is taken iff 2 T^2 < p d, and computed in float64: its sum over pairs of positions
  can cancel, and a norm rounded low would let a record past the clip. Instantiated gradients are kept and give the weighted
  sum as sum_i w_i g_i (B p d, no convolution); a ghost-norm layer's weighted sum is the
  ordinary weight gradient of w * delta (one backward convolution).
* Other layers: Opacus's per-sample gradients (its registered grad samplers, else functorch),
  kept for the weighted sum in the same way.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

CONV_WEIGHT_GRADS = {nn.Conv1d: torch.nn.grad.conv1d_weight,
                     nn.Conv2d: torch.nn.grad.conv2d_weight,
                     nn.Conv3d: torch.nn.grad.conv3d_weight}


@dataclass
class LayerTerms:
    """One layer's use in a DP step's forward pass: the module, its input activations, its
    output gradients dL/dz, and (once :meth:`norms` instantiated them) its per-sample
    gradients {parameter: (B, *parameter.shape)}."""

    module: nn.Module
    activations: list[torch.Tensor]
    backprops: torch.Tensor | None
    per_sample: dict | None = None

    def norms(self) -> dict:
        """{parameter: ||g_i||, shape (B,)} for the layer's trainable parameters."""
        module, backprops = self.module, self.backprops
        if type(module) is nn.Linear and backprops.dim() == 2:
            return _linear_norms(module, self.activations[0].to(backprops.dtype), backprops)
        if type(module) is nn.Linear and backprops.dim() == 3:
            return opacus_samplers()[0][nn.Linear](module, self.activations, backprops)
        if _plain_conv(module) and conv_uses_ghost_norm(module, backprops):
            return _conv_ghost_norms(module, self.activations[0].to(backprops.dtype),
                                     backprops)
        if _plain_conv(module):
            grads = _conv_per_sample(module, self.activations[0].to(backprops.dtype),
                                     backprops)
        else:
            grads = grad_sampler(module)(module, self.activations, backprops)
        self.per_sample = {p: g for p, g in grads.items() if p.requires_grad}
        # the weighted sum needs only the per-sample gradients now: free the layer's inputs
        # and output gradients before the next layer's are expanded (the step's peak memory)
        self.activations, self.backprops = [], None
        return {p: g.reshape(len(g), -1).norm(2, dim=1) for p, g in self.per_sample.items()}

    def weighted_sum(self, weights: torch.Tensor) -> dict:
        """{parameter: sum_i w_i g_i} for the layer's trainable parameters. Lets go of the
        output gradients (they are not needed after the sum)."""
        module = self.module
        if self.per_sample is not None:
            return {p: torch.tensordot(weights.to(g.dtype), g, dims=1)
                    for p, g in self.per_sample.items()}
        shape = (-1,) + (1,) * (self.backprops.dim() - 1)
        # not in place: autograd may hand one gradient tensor to several layers (a(x) + b(x))
        weighted = self.backprops * weights.to(self.backprops.dtype).reshape(shape)
        self.backprops = None
        a = self.activations[0].to(weighted.dtype)
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


def _linear_norms(layer: nn.Linear, a: torch.Tensor, backprops: torch.Tensor) -> dict:
    """||g_i|| = ||delta_i|| ||a_i|| (weight) and ||delta_i|| (bias), as row sums of squares
    (Opacus's norm sampler runs a B-fold batched einsum of 1 x d by d x 1 products instead)."""
    delta_sq = row_squares(backprops)
    out = {}
    if layer.weight.requires_grad:
        out[layer.weight] = (delta_sq * row_squares(a)).sqrt()
    if layer.bias is not None and layer.bias.requires_grad:
        out[layer.bias] = delta_sq.sqrt()
    return out


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


def conv_uses_ghost_norm(layer: nn.Module, backprops: torch.Tensor) -> bool:
    """Bu, Mao & Xu's layerwise rule: the ghost norm iff 2 T^2 < p d (T output positions, p
    output channels, d = in channels x kernel size). Grouped convolutions instantiate."""
    positions = backprops[0, 0].numel()
    d = layer.in_channels * math.prod(layer.kernel_size)
    return layer.groups == 1 and 2 * positions ** 2 < layer.out_channels * d


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


def _conv_ghost_norms(layer: nn.Module, a: torch.Tensor, backprops: torch.Tensor) -> dict:
    """``||g_i||^2 = <A_i^T A_i, D_i^T D_i>`` (weight) and ||sum_t delta_i,t||^2 (bias), without
    forming g_i."""
    deltas = backprops.reshape(len(backprops), layer.out_channels, -1)  # (B, p, T)
    out = {}
    if layer.weight.requires_grad:
        # in float64: the sum over position pairs can cancel (alike patches, output gradients
        # of alternating sign), and a norm rounded low would clip a record above C
        # (B, T, d) and (B, T, p), rows contiguous: the faster layout for the batched products
        patches = _unfold(layer, a).transpose(1, 2).to(torch.float64,
                                                       memory_format=torch.contiguous_format)
        outputs = deltas.transpose(1, 2).to(torch.float64, memory_format=torch.contiguous_format)
        grams = (patches @ patches.transpose(1, 2)) * (outputs @ outputs.transpose(1, 2))
        out[layer.weight] = grams.sum(dim=(1, 2)).clamp_min(0).sqrt().to(backprops.dtype)
    if layer.bias is not None and layer.bias.requires_grad:
        out[layer.bias] = deltas.sum(dim=2).norm(2, dim=1)
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
def opacus_samplers() -> tuple[dict, dict]:
    """Opacus's registries (norm samplers, grad samplers), imported on first use: importing
    Opacus loads about a second of modules that the stages without a DP step do not need."""
    from opacus.grad_sample import GradSampleModuleFastGradientClipping as Registry

    return Registry.NORM_SAMPLERS, Registry.GRAD_SAMPLERS


def grad_sampler(layer: nn.Module):
    """Opacus's per-sample gradient function for a layer: its registered grad sampler, else
    functorch's (which runs the layer's own forward per record). A convolution padded other
    than with zeros takes functorch's: Opacus's convolution sampler pads with zeros."""
    from opacus.grad_sample.functorch import ft_compute_per_sample_gradient

    if type(layer) in CONV_WEIGHT_GRADS and layer.padding_mode != "zeros":
        return ft_compute_per_sample_gradient
    return opacus_samplers()[1].get(type(layer), ft_compute_per_sample_gradient)
