"""Before a private run trains: the DP step's per-sample gradients of the model, checked
against float64 autograd, so that a model the step would get wrong is refused with the layer
named instead of being trained on wrong (or unclipped) gradients.

For a few records x_i, on a float64 copy of the model in eval mode (no dropout, no random
number drawn):

1. one at a time, the step's gradient of each parameter (its per-sample paths, weighted sum at
   weight 1) must equal autograd's gradient of the record's loss, ||g_step - g_autograd|| <=
   1e-6 ||g_autograd|| (+ 1e-12). Autograd sees every use of a parameter; the step sees its
   layer's calls. This catches what no layer-local rule can: a weight also used directly
   (``F.linear(x, layer.weight)``), a layer whose output is changed by a hook, a custom layer
   whose functorch gradient differs;
2. all together in one batch, what the step adds for each record must be what it added for
   the record alone: an operation across the batch (``x - x.mean(0)``, a functional batch
   norm) makes a record's clipped gradient depend on the others, and the sum's sensitivity
   is then no longer C.

The records stay on the data owner's machine: the check releases nothing but "refused" with
the layer's name.
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
    twin = copy.deepcopy(model).to(torch.float64).eval()
    groups = LayerGroups.of(twin)
    wrapped = BookKeeping(twin, groups)
    names = {id(p): name for name, p in twin.named_parameters()}
    x = x[:records].to(torch.float64) if x.is_floating_point() else x[:records]
    y = y[:records]
    alone = []
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
            alone.append(steps)
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
        _check_batch_independence(wrapped, groups, loss_fn, x, y, alone, names)
    finally:
        for handle in wrapped._handles:
            handle.remove()


def _check_batch_independence(wrapped, groups, loss_fn, x, y, alone, names) -> None:
    """What the step adds for record i in a batch of all the checked records (factor 1 for i,
    0 for the others) must equal what it added for i alone."""
    for i in range(len(x) if len(x) > 1 else 0):
        out, uses = wrapped.forward_keeping(x)
        kept = backward_keeping(wrapped, loss_fn(out, y), uses)
        per_layer_norms(groups, kept)
        together = scaled_sum(groups, kept, torch.eye(len(x), dtype=torch.float64)[i])
        for p, with_others, by_itself in zip(groups.flat(), together, alone[i]):
            error = float((with_others - by_itself).norm())
            if error > RELATIVE_TOLERANCE * float(by_itself.norm()) + 1e-12:
                raise DpclipError(
                    f"records of one batch change each other's gradients (parameter "
                    f"{names[id(p)]!r}: norm {float(with_others.norm()):.4g} in a batch "
                    f"against {float(by_itself.norm()):.4g} alone): an operation across the "
                    f"batch, such as x - x.mean(0) or a functional batch norm, makes the "
                    f"clipped sum's sensitivity exceed C; the model is refused")
