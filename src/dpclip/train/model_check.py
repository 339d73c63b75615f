"""Before a private run trains: the DP step's per-sample gradients of the model, checked so
that a model the step would get wrong (or leave unclipped) is refused with the layer named.
Eval mode, on a float64 copy: each record alone against float64 autograd, then each record's
part of a batch against its part alone. Training mode, as the step runs it: each followed
record's part must not change when the other records of its batch change or one more joins,
and the passes must leave the model's parameters and buffers as they were. What each check
catches and its tolerances: docs/privacy.md, "Models that are refused". A refusal names the
layer, parameter or buffer and prints nothing computed from the records.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from dpclip.errors import DpclipError
from dpclip.train.book_keeping import (BookKeeping, LayerGroups, StateBeforeStep,
                                       backward_keeping, per_layer_norms, scaled_sum)

RECORDS_CHECKED = 4
RELATIVE_TOLERANCE = 1e-6
# the training-mode check compares the step's own arithmetic run twice on identical inputs
# for the record: any change is the other records' doing. On the CPU the same shapes run the
# same kernels, so the record's numbers must be the same bits; a GPU's kernels may split a
# reduction differently from call to call, hence a tolerance there
TRAIN_MODE_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 1e-2}
LARGEST_BATCH_CHECKED = 512
# the forward pass's random draws (dropout masks) replayed from each seed in turn: a mixing
# that one draw leaves off, another turns on
REPLAY_SEEDS = (20261129, 7, 123456789)
# the other records of a real-valued batch are also scaled by these (adversarial records; the
# last overflows most models' activations, which amplifies any cross-record term)
PROBE_SCALES = (1e3, 1e6, 1e30)
TRAIN_MODE_RECORDS = 2  # the smallest batch checked in training mode holds 2 more than this


def check_model(model: nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor,
                records: int = RECORDS_CHECKED, batch_size: int | None = None) -> None:
    """Raise :class:`DpclipError` naming the first parameter whose per-sample gradient from
    the DP step differs from float64 autograd's on one of the first ``records`` records, or
    the layer, parameter or buffer through which records of one batch (of ``batch_size``, the
    step's expected batch; default ``records``) reach each other or the released state in
    training mode. ``model`` is not changed (copies are checked), and the caller's random
    streams are left as they were."""
    check_in_eval_mode(model, loss_fn, x, y, records)
    check_in_train_mode(model, loss_fn, x, y, batch_size or records)


def check_in_eval_mode(model: nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor,
                       records: int = RECORDS_CHECKED) -> None:
    """The eval-mode checks, on a float64 copy: each record's step gradient against autograd's,
    then each record's part of a batch against its part alone."""
    twin = copy.deepcopy(model).to(torch.float64).eval()
    device = x.device  # the model's: the step's weights must sit beside its gradients
    groups = LayerGroups.of(twin)
    wrapped = BookKeeping(twin, groups)
    names = {id(p): name for name, p in twin.named_parameters()}
    x = x[:records].to(torch.float64) if x.is_floating_point() else x[:records]
    y = y[:records]
    alone = []
    try:
        _refuse_fixed_dtypes(twin, x)
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


def _refuse_fixed_dtypes(twin: nn.Module, x: torch.Tensor) -> None:
    """The check differentiates a float64 copy of the model: a forward that makes a tensor of
    a fixed dtype (``torch.zeros(len(x), h)``, float32) fails there with a bare dtype error,
    refused here with what to write instead."""
    try:
        with torch.no_grad():
            twin(x[:1])
    except RuntimeError as exc:
        if "dtype" not in str(exc) and "Double" not in str(exc):
            raise
        raise DpclipError(f"the model check runs a float64 copy of the model, and its forward "
                          f"failed there ({exc}): a tensor the forward makes has a fixed "
                          f"dtype; make it like its input (x.new_zeros(len(x), h), "
                          f"torch.zeros(..., dtype=x.dtype, device=x.device)); the model is "
                          f"refused") from exc


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
    what differs and why. The message holds no number computed from the records."""
    for p, mine, theirs in zip(groups.flat(), got, expected):
        theirs = torch.zeros_like(p) if theirs is None else theirs
        if float((mine - theirs).norm()) > RELATIVE_TOLERANCE * float(theirs.norm()) + 1e-12:
            what, why = say(names[id(p)])
            raise DpclipError(f"{what}; {why}; the model is refused")


def checked_positions(size: int) -> list[int]:
    """The batch positions whose records the training-mode check follows: the first, the
    middle one and the last (a model that mixed only the rows after the first two passed when
    the first two were the ones followed)."""
    return sorted({0, size // 2, size - 1})


def check_in_train_mode(model: nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor,
                        batch_size: int, records: int = TRAIN_MODE_RECORDS) -> None:
    """The training-mode checks: a copy of ``model`` as the step runs it, the records
    at :func:`checked_positions` each checked with every other record of its batch changed,
    and with its batch one record longer (neighbouring datasets give batches whose sizes
    differ by one: what the other records add must not depend on it)."""
    first = min(max(int(batch_size), records + 2), len(x))
    if first <= records:
        return  # too few records to change the others
    twin = copy.deepcopy(model).train()
    groups = LayerGroups.of(twin)
    wrapped = BookKeeping(twin, groups)
    start = StateBeforeStep(twin)
    dtype = next((p.dtype for p in twin.parameters() if p.is_floating_point()), torch.float32)
    tolerance = 0.0 if x.device.type == "cpu" else TRAIN_MODE_TOLERANCE.get(dtype, 1e-2)
    watch = _OutputsOfModules(twin)
    # Poisson batches vary: the expected size, one more (an odd size, where a model that
    # reshapes by pairs breaks before training, not mid-run at a size that tells the batch's),
    # twice and four times it
    most = max(LARGEST_BATCH_CHECKED, 2 * first)  # the step's own batch and twice it, at least
    sizes = dict.fromkeys(min(size, most, len(x))
                          for size in (first, first + 1, 2 * first, 4 * first))
    try:
        for seed in REPLAY_SEEDS:
            for size in sizes:
                batch, labels = x[:size], y[:size]
                base = {i: _as_the_step_runs(wrapped, groups, start, watch, loss_fn, batch,
                                             labels, i, seed)
                        for i in checked_positions(size)}
                _refuse_moved_parameters(base[0].moved)
                _refuse_written_buffers(base[0].written)
                for others, labels_of_others in _other_records(x, y, size, twin):
                    for i, seen in base.items():
                        changed, changed_labels = others.clone(), labels_of_others.clone()
                        changed[i], changed_labels[i] = batch[i], labels[i]
                        again = _as_the_step_runs(wrapped, groups, start, watch, loss_fn,
                                                  changed, changed_labels, i, seed)
                        _refuse_if_mixed(seen, again, tolerance)
        _check_one_record_more(wrapped, groups, start, watch, loss_fn, x, y, first,
                               TRAIN_MODE_TOLERANCE.get(dtype, 1e-2))
    finally:
        start.restore()
        watch.remove()
        for handle in wrapped._handles:
            handle.remove()


DROPOUT = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
           nn.FeatureAlphaDropout)


def _check_one_record_more(wrapped, groups, start, watch, loss_fn, x, y, size: int,
                           tolerance: float) -> None:
    """Each followed record's block in a batch of ``size`` and in the same batch with the next
    record appended: equal within ``tolerance`` (other kernels may sum in another order: a
    matrix product's blocking follows the batch). Dropout modules are turned off for it,
    since where a mask falls follows how many numbers were drawn before it, which the batch's
    size changes; the rest stays in training mode."""
    if size + 1 > len(x):
        return
    dropouts = [m for m in wrapped.modules() if isinstance(m, DROPOUT) and m.training]
    for module in dropouts:
        module.eval()
    try:
        for i in checked_positions(size):
            seen, again = (_as_the_step_runs(wrapped, groups, start, watch, loss_fn, x[:n],
                                             y[:n], i, REPLAY_SEEDS[0])
                           for n in (size, size + 1))
            _refuse_if_sized(seen, again, tolerance)
    finally:
        for module in dropouts:
            module.train()


def _refuse_moved_parameters(moved: list[str]) -> None:
    if moved:
        raise DpclipError(f"the forward pass changes parameter {moved[0]!r} in place (e.g. "
                          f"Embedding(max_norm=...) renormalising the rows a batch uses): the "
                          f"released weights would move with no clipping and no noise; the "
                          f"model is refused")


def _refuse_written_buffers(written: list[str]) -> None:
    if written:
        raise DpclipError(f"buffer or attribute {written[0]!r} is written during the training "
                          f"forward pass (running statistics, an EMA, an observer, a counter, "
                          f"a cached tensor): the DP step puts every buffer and attribute back "
                          f"after each step, so nothing computed from a batch is released "
                          f"without noise, and this one would never change as the model "
                          f"expects (use a layer without tracked statistics, e.g. "
                          f"track_running_stats=False); the model is refused")


class _Pass:
    """One record's part of a training-mode step: its block of the weighted sum, each module's output for it (in call order), and the parameters and buffers
    the pass changed."""

    def __init__(self, block, outputs, changed):
        self.block, self.outputs = block, outputs
        self.moved, self.written = changed


def _as_the_step_runs(wrapped, groups, start, watch, loss_fn, x, y, i, seed) -> _Pass:
    """The step on batch (x, y) from the state ``start`` (put back first), in training mode,
    with the forward pass's random draws replayed from ``seed``: record ``i``'s part of it."""
    start.restore()
    devices = [x.device] if x.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        watch.start(i)
        out, uses = wrapped.forward_keeping(x)
        kept = backward_keeping(wrapped, loss_fn(out, y), uses)
        per_layer_norms(groups, kept)  # as the step: it may keep per-sample gradients
        factors = torch.zeros(len(x), device=x.device)
        factors[i] = 1
        block = [g.detach() for g in scaled_sum(groups, kept, factors)]
    return _Pass(block, watch.stop(), start.changed())


def _other_records(x, y, size, model):
    """Batches of ``size`` other records, into which the checked record is put: other training
    records (or the same ones in another order, when there are too few), and, for real-valued
    inputs to a model without token lookups, the batch scaled by :data:`PROBE_SCALES`
    (adversarial records)."""
    if len(x) >= 2 * size:
        yield x[size:2 * size], y[size:2 * size]
    else:
        yield x[:size].roll(1, 0), y[:size].roll(1, 0)
    lookups = any(isinstance(m, (nn.Embedding, nn.EmbeddingBag)) for m in model.modules())
    if x.is_floating_point() and not lookups:
        for scale in PROBE_SCALES:
            yield x[:size] * scale, y[:size]


def _refuse_if_mixed(seen: _Pass, again: _Pass, tolerance: float) -> None:
    """The record's block of the weighted sum, what it contributes, must be the same (the
    same bits on the CPU). Its norms are not compared: the whole batch's range picks their
    float32 or float64 path, both upper bounds of the same gradient (they differed by 2.5e-4
    on a CNN's wide layer), and a record's own norms move only with its own block."""
    if all(_close(a, b, tolerance) for a, b in zip(seen.block, again.block)):
        return
    first = next((name for (name, a), (_, b) in zip(seen.outputs, again.outputs)
                  if not _close(a, b, tolerance)), None)
    where = f"; the record's output first changes at module {first!r}" if first else ""
    raise DpclipError(f"in training mode, records of one batch change each other's gradients "
                      f"(what the step adds for one record changes when the other records of "
                      f"its batch change{where}): an operation across the batch (a functional "
                      f"batch norm, mixup, x - x.mean(0)) makes the clipped sum's sensitivity "
                      f"exceed C; the model is refused")


def _refuse_if_sized(seen: _Pass, again: _Pass, tolerance: float) -> None:
    """The record's block must not change when its batch holds one record more (at the end):
    neighbouring datasets give Poisson batches whose sizes differ by one, so a model whose
    records' gradients follow the batch's size (its parity, a count of calls, a centring of
    some rows) moves every other record's contribution when one record joins. Compared as one
    vector (what the record adds, against its norm): a block that is zero in exact arithmetic
    (a key bias under softmax) holds rounding only, which other kernels round otherwise."""
    moved = sum(float((a.double() - b.double()).square().sum())
                for a, b in zip(seen.block, again.block)) ** 0.5
    size = sum(float(a.double().square().sum()) for a in seen.block) ** 0.5
    if moved <= tolerance * size or (moved == 0 and size == 0):
        return
    raise DpclipError("in training mode, what the step adds for a record changes when its "
                      "batch holds one record more: a forward pass that depends on the "
                      "batch's size (its parity, a number of calls or rows it takes) lets one "
                      "record move every other record's contribution, so the clipped sum's "
                      "sensitivity exceeds C (a functional dropout, F.dropout, whose masks "
                      "fall by how many numbers were drawn before, does this too: use "
                      "nn.Dropout modules); the model is refused")


def _close(a: torch.Tensor, b: torch.Tensor, tolerance: float) -> bool:
    if a.shape != b.shape:
        return False
    a, b = a.double(), b.double()
    if tolerance == 0:
        return bool(torch.equal(a.nan_to_num(), b.nan_to_num()))
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return bool(torch.equal(a.nan_to_num(), b.nan_to_num()) and
                    torch.equal(torch.isnan(a), torch.isnan(b)))
    return float((a - b).norm()) <= tolerance * float(a.norm()) + 1e-30


class _OutputsOfModules:
    """Forward hooks on every module keeping its output's row for one record, in call order:
    where a record's forward first depends on the rest of its batch."""

    def __init__(self, model: nn.Module):
        self._kept: list | None = None
        self._row = 0
        self._handles = [m.register_forward_hook(self._keep(name))
                         for name, m in model.named_modules() if name]

    def _keep(self, name):
        def hook(module, args, output):
            if self._kept is not None and isinstance(output, torch.Tensor) and output.dim() \
                    and len(output) > self._row:
                self._kept.append((name, output[self._row].detach().clone()))
        return hook

    def start(self, row: int) -> None:
        self._kept, self._row = [], row

    def stop(self) -> list:
        kept, self._kept = self._kept, None
        return kept

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
