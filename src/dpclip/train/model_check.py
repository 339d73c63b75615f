"""Before a private run trains: the DP step's per-sample gradients of the model, checked
against float64 autograd, so that a model the step would get wrong is refused with the layer
named instead of being trained on wrong (or unclipped) gradients.

For a few records x_i, one at a time, on a float64 copy of the model: the step's gradient of
each parameter (its per-sample paths, weighted sum at weight 1) must equal autograd's gradient
of the record's loss, ||g_step - g_autograd|| <= 1e-6 ||g_autograd|| (+ 1e-12). Autograd sees
every use of a parameter; the step sees its layer's calls. The check catches what no layer-local
rule can: a weight also used directly (``F.linear(x, layer.weight)``), a layer whose output is
changed by a hook, a custom layer whose functorch gradient differs. The records stay on the
data owner's machine: the check releases nothing but "refused" with the layer's name.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from dpclip.errors import DpclipError
from dpclip.train.step import (BookKeeping, LayerGroups, backward_keeping, per_layer_norms,
                               scaled_sum)

RECORDS_CHECKED = 4
RELATIVE_TOLERANCE = 1e-6


def check_model(model: nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor,
                records: int = RECORDS_CHECKED) -> None:
    """Raise :class:`DpclipError` naming the first parameter whose per-sample gradient from
    the DP step differs from float64 autograd's on one of the first ``records`` records.
    ``model`` is not changed (a float64 copy is checked); no random number is drawn."""
    twin = copy.deepcopy(model).to(torch.float64)
    groups = LayerGroups.of(twin)
    wrapped = BookKeeping(twin, groups)
    names = {id(p): name for name, p in twin.named_parameters()}
    x = x[:records].to(torch.float64) if x.is_floating_point() else x[:records]
    try:
        for i in range(len(x)):
            record, label = x[i:i + 1], y[i:i + 1]
            out, uses = wrapped.forward_keeping(record)
            kept = backward_keeping(wrapped, loss_fn(out, label), uses)
            per_layer_norms(groups, kept)
            steps = scaled_sum(groups, kept, torch.ones(1, dtype=torch.float64))
            params = groups.flat()
            truth = torch.autograd.grad(loss_fn(twin(record), label).sum(), params,
                                        allow_unused=True)
            for p, step, true in zip(params, steps, truth):
                true = torch.zeros_like(p) if true is None else true
                error = float((step - true).norm())
                if error > RELATIVE_TOLERANCE * float(true.norm()) + 1e-12:
                    raise DpclipError(
                        f"the DP step's per-sample gradient of parameter {names[id(p)]!r} "
                        f"differs from autograd's (norm {float(step.norm()):.4g} against "
                        f"{float(true.norm()):.4g}): the parameter is used outside its layer's "
                        f"call (e.g. F.linear(x, layer.weight)), or the layer's forward is one "
                        f"its per-sample path does not reproduce; the model is refused")
    finally:
        for handle in wrapped._handles:
            handle.remove()
