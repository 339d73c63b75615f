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
    device = x.device  # the model's: the step's weights must sit beside its gradients
    groups = LayerGroups.of(twin)
    wrapped = BookKeeping(twin, groups)
    names = {id(p): name for name, p in twin.named_parameters()}
    x = x[:records].to(torch.float64) if x.is_floating_point() else x[:records]
    y = y[:records]
    alone = []
    try:
        for i in range(len(x)):
            record, label = x[i:i + 1], y[i:i + 1]
            steps = step_gradients(wrapped, groups, loss_fn, record, label,
                                   torch.ones(1, dtype=torch.float64, device=device))
            truth = torch.autograd.grad(loss_fn(twin(record), label).sum(), groups.flat(),
                                        allow_unused=True)
            alone.append(steps)
            _refuse_if_apart(groups, names, steps, truth, lambda name: (
                f"the DP step's per-sample gradient of parameter {name!r} differs from "
                f"autograd's", "the parameter is used outside its layer's call (e.g. "
                "F.linear(x, layer.weight)), or the layer's forward is one its per-sample "
                "path does not reproduce"))
        # what the step adds for record i in a batch of all of them (factor 1 for i, 0 for
        # the others) must equal what it added for i alone
        for i in range(len(x) if len(x) > 1 else 0):
            together = step_gradients(wrapped, groups, loss_fn, x, y,
                                      torch.eye(len(x), dtype=torch.float64, device=device)[i])
            _refuse_if_apart(groups, names, together, alone[i], lambda name: (
                f"records of one batch change each other's gradients (parameter {name!r}, in "
                f"a batch against alone)", "an operation across the batch, such as "
                "x - x.mean(0) or a functional batch norm, makes the clipped sum's "
                "sensitivity exceed C"))
    finally:
        for handle in wrapped._handles:
            handle.remove()


def step_gradients(wrapped, groups, loss_fn, x, y, factors) -> list[torch.Tensor]:
    """The DP step's weighted sum sum_i factors_i g_i on the records (x, y), per parameter in
    ``groups.flat()`` order, without noise."""
    out, uses = wrapped.forward_keeping(x)
    kept = backward_keeping(wrapped, loss_fn(out, y), uses)
    per_layer_norms(groups, kept)
    return scaled_sum(groups, kept, factors)


def _refuse_if_apart(groups, names, got, expected, say) -> None:
    """Raise :class:`DpclipError` for the first parameter whose ``got`` and ``expected``
    gradients differ by more than 1e-6 of the expected norm (+ 1e-12); ``say(name)`` gives
    what differs and why."""
    for p, mine, theirs in zip(groups.flat(), got, expected):
        theirs = torch.zeros_like(p) if theirs is None else theirs
        if float((mine - theirs).norm()) > RELATIVE_TOLERANCE * float(theirs.norm()) + 1e-12:
            what, why = say(names[id(p)])
            raise DpclipError(f"{what}: norm {float(mine.norm()):.4g} against "
                              f"{float(theirs.norm()):.4g}; {why}; the model is refused")
