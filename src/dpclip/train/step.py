"""The one DP-SGD step shared by every gradient method (docs/privacy.md, "The DP step").

    gbar_i^(l) = s_i^(l) g_i^(l)                    (method's scaling rule, ||gbar_i|| <= C_t)
    G          = ( sum_i gbar_i + N(0, sigma_T^2 C_t^2 I) ) / B      (B = q N, the expected
                                                                      batch size, not |L_t|)
    theta     <- optimizer(theta, G)
    state     <- controller(released quantities)

One forward pass keeps each parameterised layer's input activations a_i and output z_i
(:class:`BookKeeping`); one backward pass asks autograd for dL/dz of every layer (delta_i) and
for no weight gradient, which the DP step would throw away. Each layer's per-sample norms and
its weighted sum sum_i s_i^(l) g_i^(l) come from (a, delta) (:mod:`dpclip.train.per_sample`:
ghost norms for Linear layers, the cheaper of ghost norms and instantiated per-sample gradients
for convolutions, Opacus's per-sample gradients for the others), for per-sample and per-layer
factors alike. No second backward pass is needed. A "layer" is one module that owns parameters
(its weight and bias together).
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.autograd.graph import get_gradient_edge

from dpclip.errors import DpclipError
from dpclip.methods.base import Method, StepRelease
from dpclip.randomness import NoiseSources
from dpclip.train.per_sample import LayerTerms, combined_norm, refusal


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


# layers whose output for one record depends on the other records of the batch
BATCH_MIXING = (nn.modules.batchnorm._BatchNorm,)
RECURRENT_DP_LAYERS = ("DPLSTM", "DPGRU", "DPRNN")


def sequence_advice(module: nn.Module) -> str:
    """What to use instead of a sequence layer the DP step cannot clip (empty for others)."""
    if isinstance(module, nn.MultiheadAttention):
        return ("; use Opacus's opacus.layers.DPMultiheadAttention, the same attention built "
                "from Linear layers, which the step clips exactly (a TransformerEncoderLayer "
                "holds an nn.MultiheadAttention: build the block from DPMultiheadAttention)")
    if isinstance(module, nn.RNNBase) or type(module).__name__ in RECURRENT_DP_LAYERS:
        return ("; recurrent layers (LSTM, GRU, RNN and Opacus's DP versions) are not "
                "supported: model the sequence with opacus.layers.DPMultiheadAttention or a "
                "Conv1d over the time axis")
    return ""


class BookKeeping(nn.Module):
    """The model, with forward hooks on its parameterised layers that keep, during a DP step's
    forward pass, each layer's input activations a and where its output z enters the autograd
    graph (a gradient edge: not z itself, whose memory the next op may then free, as in a
    non-private step). The step then asks autograd for dL/dz of every layer at once
    (``torch.autograd.grad``), which is the one backward pass minus the weight gradients (no
    parameter is among the requested inputs, so the engine skips them: the DP step would throw
    them away), and forms the per-sample norms and the scaled sums from (a, dL/dz)
    (book-keeping, Bu et al. 2023). The edge is the layer's own output slot, so an in-place op
    on z afterwards (``ReLU(inplace=True)``) does not change which gradient comes back."""

    def __init__(self, model: nn.Module, groups: LayerGroups):
        super().__init__()
        mixing = [name for name, m in model.named_modules() if isinstance(m, BATCH_MIXING)]
        if mixing:
            raise DpclipError(f"the model has batch-normalisation layers {mixing}: a record's "
                              f"output would depend on the other records of its batch, so "
                              f"per-sample gradients are undefined (use GroupNorm)")
        for name, module in model.named_modules():
            reason = refusal(module)
            if reason:
                raise DpclipError(f"the DP step cannot clip layer {name!r} exactly: {reason}")
        for name, module in model.named_modules():
            if type(module).__name__ in RECURRENT_DP_LAYERS:
                raise DpclipError(f"layer {name!r} is Opacus's {type(module).__name__}, which "
                                  f"applies one cell at every time step: the DP step's "
                                  f"per-layer norms need one call per layer"
                                  f"{sequence_advice(module)}")
        owners: dict[int, str] = {}
        for name, module in zip(groups.names, groups.modules):
            for p in module.parameters(recurse=False):
                if id(p) in owners:
                    raise DpclipError(f"layers {owners[id(p)]!r} and {name!r} share a parameter: "
                                      f"its per-sample gradient is the sum over both, which "
                                      f"per-layer norms do not give")
                owners[id(p)] = name
        self._module = model
        self._names = {id(m): name for name, m in zip(groups.names, groups.modules)}
        self._uses: list | None = None  # LayerUse while capturing
        # set once dpclip.train.model_check has passed the model: dp_step checks it otherwise
        self.checked = False
        self._handles = [m.register_forward_hook(self._keep, with_kwargs=True)
                         for m in groups.modules]

    def _keep(self, module, args, kwargs, output) -> None:
        if self._uses is None or not torch.is_grad_enabled():
            return
        if not isinstance(output, torch.Tensor):
            raise DpclipError(f"layer {self._names[id(module)]!r} "
                              f"({type(module).__name__}) returns {type(output).__name__}, not "
                              f"a tensor: the DP step needs its output's gradient"
                              f"{sequence_advice(module)}")
        inputs = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
        self._uses.append(LayerUse(module, self._names[id(module)],
                                   [t.detach() for t in inputs],
                                   [t._version for t in inputs], get_gradient_edge(output),
                                   (output.shape, output.dtype, output.device)))

    def forward(self, *args, **kwargs):
        return self._module(*args, **kwargs)

    def forward_keeping(self, x: torch.Tensor) -> tuple[torch.Tensor, list["LayerUse"]]:
        """The model's output on ``x`` and the layers' uses (:class:`LayerUse`)."""
        self._uses = []
        try:
            return self._module(x), self._uses
        finally:
            self._uses = None


class StateBeforeStep:
    """Every parameter and buffer of a model as a DP step's forward pass finds them, put back
    once the step's sums exist (:meth:`restore`), before the noise and the optimizer: whatever
    the forward or backward pass writes into the model from the batch (running statistics, an
    EMA, a renormalisation such as ``Embedding(max_norm=...)``, a copy of a record) never
    outlives the step, so the only thing a step releases is the noisy update. The model check
    refuses models that write them (:meth:`changed`); this is the step's own guarantee for
    what a test cannot see (a write every k-th call, or only on rare records)."""

    def __init__(self, model: nn.Module):
        self.parameters = [(name, p, p._version, p.detach().clone())
                           for name, p in model.named_parameters()]
        self.buffers = [(f"{prefix}.{name}" if prefix else name, module, name, buffer,
                         buffer.detach().clone())
                        for prefix, module in model.named_modules()
                        for name, buffer in module.named_buffers(recurse=False)]

    def changed(self) -> tuple[list[str], list[str]]:
        """The names of the parameters and of the buffers whose values differ from the kept
        ones (a buffer replaced by another tensor counts)."""
        moved = [name for name, p, _, value in self.parameters if not torch.equal(p, value)]
        written = [name for name, module, attr, buffer, value in self.buffers
                   if getattr(module, attr) is not buffer or not torch.equal(buffer, value)]
        return moved, written

    @torch.no_grad()
    def restore(self) -> None:
        for _, p, version, value in self.parameters:
            if p._version != version:  # changed in place
                p.copy_(value)
        for _, module, attr, buffer, value in self.buffers:
            if getattr(module, attr) is not buffer or not torch.equal(buffer, value):
                buffer.copy_(value)
                setattr(module, attr, buffer)


def wrap_for_dp(model: nn.Module) -> BookKeeping:
    """The model ready for the DP step (hooks keep activations; losses are summed)."""
    return BookKeeping(model, LayerGroups.of(model))


@dataclass
class LayerUse:
    """One call of a parameterised layer in the forward pass: its inputs (detached; their
    version counters then, to tell an in-place change later), where its output enters the
    autograd graph, and the output's shape, dtype and device."""

    module: nn.Module
    name: str
    activations: list[torch.Tensor]
    versions: list[int]
    edge: object
    output: tuple


def backward_keeping(model: BookKeeping, losses: torch.Tensor, uses: list[LayerUse]
                     ) -> list[LayerTerms]:
    """(module, activations, dL/dz) per use, from one backward pass of sum(losses) that
    computes no weight gradient. Refused: a layer used twice in one forward (its per-sample
    gradient is the sum over uses, which the per-use norms below do not give), and a layer
    input changed in place after the layer ran (the kept input is no longer the one the
    gradient belongs to; autograd itself would refuse the weight gradient)."""
    for use in uses:
        sizes = {use.output[0][0] if len(use.output[0]) else None,
                 *(len(a) for a in use.activations if a.dim())}
        if sizes != {len(losses)}:
            raise DpclipError(f"layer {use.name!r} sees {sorted(map(str, sizes))} rows for a "
                              f"batch of {len(losses)} records: the DP step needs every "
                              f"layer's inputs and output to hold the batch on dimension 0 "
                              f"(a sequence-first layout, (T, B, d), would be clipped per "
                              f"position, not per record)")
    seen: set[int] = set()
    for use in uses:
        if id(use.module) in seen:
            raise DpclipError(f"layer {use.name!r} is called more than once in one forward "
                              f"pass; the DP step's per-sample norms need one call per layer "
                              f"(use a separate layer for each call, or one call on the "
                              f"concatenated inputs)")
        seen.add(id(use.module))
    for use in uses:
        if [t._version for t in use.activations] != use.versions:
            raise DpclipError(f"the input of layer {use.name!r} was changed in place after "
                              f"the layer ran: its weight gradient would be computed from the "
                              f"changed values (make the op that changes it out of place)")
    grads = torch.autograd.grad(losses.sum(), [use.edge for use in uses], allow_unused=True)
    return [LayerTerms(use.module, use.activations,
                       torch.zeros(use.output[0], dtype=use.output[1], device=use.output[2])
                       if g is None else g.detach())
            for use, g in zip(uses, grads)]


def per_layer_norms(groups: LayerGroups, kept: list[LayerTerms]) -> torch.Tensor:
    """n_i^(l) = ||g_i^(l)||, shape (B, L): each layer's parameters' per-sample norms
    combined (weight and bias together), never below the norm of what the layer's weighted sum
    adds for the record (:mod:`dpclip.train.per_sample`). A trainable layer without one (not seen by the
    forward hooks) is an error: its gradient would go unclipped."""
    columns: list = [None] * len(groups.modules)
    for terms in kept:
        k = _layer_index(groups, terms.module)
        if k is not None:
            columns[k] = combined_norm(list(terms.norms().values()))
    if any(c is None for c in columns):
        missing = [groups.names[k] for k, c in enumerate(columns) if c is None]
        raise DpclipError(f"no per-sample norm for layer(s) {missing}: not used in the "
                          f"forward (or only under torch.no_grad), or not hooked (wrap the "
                          f"model after freezing layers)")
    return torch.stack(columns, dim=1)


def scaled_sum(groups: LayerGroups, kept: list[LayerTerms], factors: torch.Tensor
               ) -> list[torch.Tensor]:
    """sum_i s_i^(l) g_i^(l) for every parameter, in ``groups.flat()`` order and in float64,
    from each layer's terms (after :func:`per_layer_norms`, which may have kept per-sample
    gradients).

    Consumes ``kept``: each layer's terms are dropped as soon as its sums exist, so the sums
    grow while the activations and output gradients shrink (the step's peak memory)."""
    factors = factors.detach()
    totals: dict[int, torch.Tensor] = {}
    while kept:
        terms = kept.pop()
        k = _layer_index(groups, terms.module)
        if k is None:
            continue  # a layer the forward hooks saw that is not in groups
        weights = factors if factors.dim() == 1 else factors[:, k]
        totals.update({id(p): g for p, g in terms.weighted_sum(weights).items()})
        del terms
    return [totals[id(p)] if id(p) in totals else torch.zeros_like(p, dtype=torch.float64)
            for p in groups.flat()]


def _layer_index(groups: LayerGroups, module: nn.Module) -> int | None:
    return next((k for k, m in enumerate(groups.modules) if m is module), None)


STEP_PARTS = ("forward", "output gradients", "per-sample norms", "scaling rule",
              "weighted sum", "extra queries", "noise", "optimizer", "controller")


@dataclass
class StepLaps:
    """Wall time of each part of the DP step (:data:`STEP_PARTS`), summed over the non-empty
    steps run while it is active (:func:`timing_parts`): where a step's time goes, for
    ``dpclip bench --profile``. On a GPU each lap waits for the device."""

    seconds: dict = field(default_factory=lambda: dict.fromkeys(STEP_PARTS, 0.0))
    steps: int = 0
    _last: float = 0.0
    _cuda: bool = False

    def start(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self.steps += 1
        self._last = time.perf_counter()

    def lap(self, part: str) -> None:
        if self._cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.seconds[part] += now - self._last
        self._last = now


class _NoLaps:
    """What the step times with outside :func:`timing_parts`: nothing (no clock read)."""

    def start(self, device) -> None:
        pass

    def lap(self, part: str) -> None:
        pass


NO_LAPS = _NoLaps()
_laps: StepLaps | _NoLaps = NO_LAPS  # a StepLaps only inside timing_parts()


@contextlib.contextmanager
def timing_parts():
    """Time the parts of every DP step run inside the block; yields the :class:`StepLaps`."""
    global _laps
    _laps = laps = StepLaps()
    try:
        yield laps
    finally:
        _laps = NO_LAPS


# numbers drawn per call: a multiple of 16, the block torch's CPU Gaussian sampler fills
NOISE_CHUNK = {"cpu": 1 << 16, "cuda": 1 << 24}


def add_noise(total: torch.Tensor, std: float, generator: torch.Generator,
              draw: torch.dtype | None = None) -> torch.Tensor:
    """``total + N(0, std^2 I)``, in place in ``total``, the noise drawn in ``draw`` (default
    ``total``'s dtype: the float64 sum takes float32 draws for a float32 model, as fine a
    Gaussian as the model holds, at a third of float64's cost) a chunk at a time
    (:data:`NOISE_CHUNK`) so that the step never holds a second tensor of the largest layer's
    size beside the sums. On the CPU the chunks are exactly the numbers one draw of the whole
    tensor gives: torch fills blocks of 16 and redraws a ragged last block, so every chunk but
    the last is a multiple of 16 and a last one shorter than 16 joins the one before it."""
    flat = total.view(-1) if total.is_contiguous() else total.contiguous().view(-1)
    chunk = NOISE_CHUNK.get(flat.device.type, NOISE_CHUNK["cuda"])
    starts = list(range(0, flat.numel(), chunk))
    if len(starts) > 1 and flat.numel() - starts[-1] < 16:
        starts.pop()
    for start, end in zip(starts, starts[1:] + [flat.numel()]):
        flat[start:end].add_(torch.normal(0.0, std, size=(end - start,), generator=generator,
                                          dtype=draw or flat.dtype, device=flat.device))
    return flat.view(total.shape)


def rounding_slack(records: int) -> float:
    """eta such that the float64 sum of at most ``records`` vectors, each of norm at most C,
    changes by at most C (1 + eta) when one record joins or leaves, rounding included: any
    order of summation is within gamma_{n} sum_i |v_i| of the exact sum (Higham, Accuracy and
    Stability of Numerical Algorithms, 2002, eq. 4.4; each entry is a dot product over the
    records), so the two sums' errors add at most 2 gamma_{n} n C, with gamma_n = n u /
    (1 - n u) and u = 2^-53. The noise is scaled by (1 + eta): 8e-7 for n = 60,000."""
    unit = 2.0 ** -53
    n = max(int(records), 1) + 1
    return 2 * n * (n * unit / (1 - n * unit))


def dp_step(model: nn.Module, groups: LayerGroups, loss_fn, x: torch.Tensor, y: torch.Tensor,
            method: Method, sigma_train: float, expected_batch: float,
            optimizer: torch.optim.Optimizer, rng: NoiseSources, step: int,
            canaries=None, *, most_records: int) -> tuple[float, StepRelease]:
    """One DP step on Poisson batch (x, y); returns (mean batch loss, the release).

    A model that :func:`dpclip.train.model_check.check_model` has not passed (``model.checked``)
    is checked on the first batch of two or more records before anything is computed.

    An empty batch is a full step, as the accountant models it and as Opacus does: the clipped
    sum is zero, so the update is the noise alone, the extra queries release their noise, and
    the controller reads those releases as usual (skipping the step would reveal that the batch
    was empty). Its loss is NaN. Noise comes from ``rng.noise``, extra answers from the method.

    ``canaries`` (the audit's :class:`~dpclip.audit.canaries.GradientCanaries`, never in a
    released run): the included canaries sampled into this batch join it as records, after
    the real ones: the method scales them and counts them in its extra queries.

    The clipped sum is accumulated in float64 and the noise added to it there, with its
    standard deviation scaled by 1 + :func:`rounding_slack` of ``most_records`` (the most
    records a batch can hold: the data set's size, public, plus the audit's canaries), so the
    sensitivity the noise is calibrated to holds with the rounding included.
    """
    if not model.checked and len(x) > 1:
        # a model wrapped by hand: the check runs on the first batch with two records
        from dpclip.train.model_check import check_model  # it builds on this module

        check_model(model._module, loss_fn, x, y, batch_size=round(expected_batch))
        model.checked = True
    clip = method.clip_threshold
    optimizer.zero_grad(set_to_none=True)
    laps = _laps if len(x) else NO_LAPS  # the parts of non-empty steps, when profiling
    laps.start(x.device)
    n_layers = len(groups.names)
    chosen, canary_norms = canaries.sample(x.device) if canaries is not None else \
        ([], torch.zeros((0, n_layers), device=x.device))
    if len(x) == 0:
        loss = float("nan")
        layer_norms = torch.cat([torch.zeros((0, n_layers), device=x.device), canary_norms])
        factors = method.scale(layer_norms)  # a rule with state sees the batch as always
        sums = [torch.zeros_like(p, dtype=torch.float64) for p in groups.flat()]
    else:
        before = StateBeforeStep(model)
        out, uses = model.forward_keeping(x)
        losses = loss_fn(out, y)  # per-sample losses, reduction="none"
        laps.lap("forward")
        kept = backward_keeping(model, losses, uses)  # no weight gradients computed
        del out, uses  # kept holds the activations now, and lets go of them layer by layer
        loss = float(losses.mean().detach())
        laps.lap("output gradients")
        layer_norms = torch.cat([per_layer_norms(groups, kept), canary_norms])
        laps.lap("per-sample norms")
        # a record whose factor is not finite contributes nothing (its gradient is zeroed too)
        factors = torch.nan_to_num(method.scale(layer_norms), nan=0.0, posinf=0.0, neginf=0.0)
        laps.lap("scaling rule")
        sums = scaled_sum(groups, kept, factors[:len(x)])  # empties kept as it goes
        before.restore()  # nothing the batch wrote into the model outlives the step
        laps.lap("weighted sum")
    if canaries is not None:
        canaries.observe(method, x.device)  # every step, whoever was sampled
    if len(chosen):
        canaries.add(sums, chosen, factors[len(x):])
    extras = method.release_extras(layer_norms, rng)
    laps.lap("extra queries")
    noisy = []
    most = most_records + (len(canaries.included) if canaries is not None else 0)
    std = sigma_train * clip * (1 + rounding_slack(most))
    for k, p in enumerate(groups.flat()):
        total, sums[k] = sums[k], None
        draw = torch.float64 if p.dtype == torch.float64 else torch.float32  # never bf16
        p.grad = add_noise(total, std, rng.noise, draw).div_(expected_batch).to(p.dtype)
        noisy.append(p.grad.detach())
    laps.lap("noise")
    optimizer.step()
    laps.lap("optimizer")
    release = StepRelease(step=step, noisy_grad=noisy, extras=extras)
    method.update(release)
    laps.lap("controller")
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
    """n_i^(l) for every record (N x L) under ``model``'s current weights, with the same
    per-sample norms as the DP step. Works on a copy: ``model`` keeps no hooks."""
    private_copy = copy.deepcopy(model).train()
    groups = LayerGroups.of(private_copy)
    wrapped = BookKeeping(private_copy, groups)
    out = []
    for start in range(0, len(x), batch):
        logits, uses = wrapped.forward_keeping(x[start:start + batch])
        kept = backward_keeping(wrapped, loss_fn(logits, y[start:start + batch]), uses)
        out.append(per_layer_norms(groups, kept).detach())
    return torch.cat(out)
