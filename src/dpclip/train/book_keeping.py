"""What the DP step keeps of one forward and one backward pass (book-keeping, Bu et al. 2023):
each parameterised layer's input activations a_i and where its output z_i enters the autograd
graph (:class:`BookKeeping`), then dL/dz from one backward pass that computes no weight
gradient, and from (a, dL/dz) each layer's per-sample norms and weighted sum
(:mod:`dpclip.train.per_sample`). Also what a model must not do for that to hold, refused with
the layer named, and :class:`StateBeforeStep`, which puts back whatever a batch wrote into the
model. :mod:`dpclip.train.step` adds the noise; :mod:`dpclip.train.model_check` checks a model
against these paths."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.autograd.graph import get_gradient_edge

from dpclip.errors import DpclipError
from dpclip.models import own_parameters
from dpclip.train.per_sample import LayerTerms, combined_norm, refusal


@dataclass
class LayerGroups:
    """Parameters grouped by the module that owns them, in model order."""

    names: list[str]
    params: list[list[nn.Parameter]]
    modules: list[nn.Module]

    @classmethod
    def of(cls, model: nn.Module) -> "LayerGroups":
        """Each trainable parameter with the module whose calls use it
        (:func:`dpclip.models.own_parameters`)."""
        names, params, modules = [], [], []
        for name, module in model.named_modules():
            own = [p for p in own_parameters(module) if p.requires_grad]
            if own:
                names.append(name.removeprefix("_module."))
                params.append(own)
                modules.append(module)
        return cls(names, params, modules)

    def flat(self) -> list[nn.Parameter]:
        return [p for group in self.params for p in group]


# layers whose output for one record depends on the other records of the batch
BATCH_MIXING = (nn.modules.batchnorm._BatchNorm,)
# Opacus's versions of the fused sequence layers, built from Linear layers (which the step
# clips exactly) with the same arguments and weights; its fixer swaps in all but DPRNN
DP_VERSIONS = {nn.MultiheadAttention: "DPMultiheadAttention", nn.LSTM: "DPLSTM",
               nn.GRU: "DPGRU", nn.RNN: "DPRNN"}


def sequence_advice(module: nn.Module) -> str:
    """What to use instead of a fused sequence layer the DP step cannot clip (empty for
    others)."""
    replacement = DP_VERSIONS.get(type(module))
    if replacement is None:
        return ""
    how = "" if isinstance(module, nn.RNN) else (
        " (opacus.validators.ModuleValidator.fix(model) swaps it in, weights kept, inside a "
        "TransformerEncoderLayer too)")
    return f"; use Opacus's opacus.layers.{replacement}, the same layer built from Linear " \
        f"layers{how}"


class BookKeeping(nn.Module):
    """The model, with forward hooks on its parameterised layers that keep, during a DP step's
    forward pass, each layer's input activations a and the gradient edge where its output z
    enters the autograd graph (not z itself; an in-place op on z afterwards changes nothing),
    for one backward pass that asks for dL/dz only (docs/privacy.md, "The DP step")."""

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
    """Every parameter, buffer and plain attribute (a tensor, number or string, or a list,
    tuple, dict or numpy array of them) of a model's modules as a DP step's forward pass finds
    them, put back by :meth:`restore` once the step's sums exist, before the noise: nothing the
    batch writes into the model outlives the step. Values are compared, not version counters;
    :meth:`changed` names what moved (docs/privacy.md, "Models that are refused")."""

    def __init__(self, model: nn.Module):
        self.parameters = [(name, p, p.detach().clone()) for name, p in model.named_parameters()]
        self.modules = [(prefix, module, _own_buffers(module), _plain_attributes(module))
                        for prefix, module in model.named_modules()]

    def changed(self) -> tuple[list[str], list[str]]:
        """The names of the parameters, and of the buffers and plain attributes, whose values
        differ from the kept ones (created, removed or replaced ones count)."""
        moved = [name for name, p, value in self.parameters if not _same(p, value)]
        written = []
        for prefix, module, buffers, attributes in self.modules:
            for kept, now in ((buffers, _own_buffers(module, kept=False)),
                              (attributes, _plain_attributes(module))):
                written += [f"{prefix}.{name}" if prefix else name
                            for name in sorted(set(kept) | set(now))
                            if name not in kept or name not in now
                            or not _same(now[name], kept[name])]
        return moved, written

    @torch.no_grad()
    def restore(self) -> None:
        for _, p, value in self.parameters:
            if not _same(p, value):
                p.copy_(value)
        for _, module, buffers, attributes in self.modules:
            current = _own_buffers(module, kept=False)
            for name in set(current) - set(buffers):
                delattr(module, name)  # a buffer the pass created
            for name, value in buffers.items():
                if name not in current:
                    module.register_buffer(name, value.clone())  # the pass removed it
                elif not _same(current[name], value):
                    setattr(module, name, value.clone())  # stays a buffer, as it was
            now = _plain_attributes(module)
            for name in set(now) - set(attributes):
                delattr(module, name)
            for name, value in attributes.items():
                if name not in now or not _same(now[name], value):
                    setattr(module, name, _snapshot(value))


PLAIN = (torch.Tensor, bool, int, float, complex, str, bytes)
CONTAINERS = (list, tuple, dict, np.ndarray)
_MODULE_INTERNALS = frozenset(vars(nn.Module()))  # torch's own bookkeeping of every module


def _own_buffers(module: nn.Module, kept: bool = True) -> dict:
    """A module's own buffers: copies (``kept``) or the tensors themselves."""
    return {name: b.detach().clone() if kept else b
            for name, b in module.named_buffers(recurse=False)}


def _plain_attributes(module: nn.Module) -> dict:
    """A module's own attributes that hold a tensor (not a parameter or buffer), a plain value
    or a container of them (:data:`CONTAINERS`), as copies; ``training`` (set by train() and
    eval(), not by a pass) and torch's own bookkeeping left out."""
    return {name: _snapshot(value) for name, value in vars(module).items()
            if isinstance(value, PLAIN + CONTAINERS) and name != "training"
            and name not in _MODULE_INTERNALS}


def _snapshot(value):
    """A copy that shares no tensor, array or container with ``value``."""
    if torch.is_tensor(value):
        return value.detach().clone()
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return {k: _snapshot(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_snapshot(v) for v in value) if type(value) in (list, tuple) \
            else value
    return value


def _same(a, b) -> bool:
    """The same value (NaN where the other has NaN), shape and dtype; containers element by
    element."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.shape == b.shape and a.dtype == b.dtype and bool(
            np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, (list, tuple)) and type(a) is type(b):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if torch.is_tensor(a) and torch.is_tensor(b):
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            return False
        if a.is_floating_point() or a.is_complex():
            return bool(torch.equal(a.isnan(), b.isnan()) and
                        torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)))
        return bool(torch.equal(a, b))
    return type(a) is type(b) and a == b


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
    """(module, activations, dL/dz) per layer, from one backward pass of sum(losses) that
    computes no weight gradient; a layer called several times (a recurrent cell at each time
    step) gets the sum of its calls' per-sample gradients (:meth:`LayerTerms.over_calls`).
    Refused: a layer input changed in place after the layer ran (the kept input is no longer
    the one the gradient belongs to; autograd itself would refuse the weight gradient)."""
    for use in uses:
        sizes = {use.output[0][0] if len(use.output[0]) else None,
                 *(len(a) for a in use.activations if a.dim())}
        if sizes != {len(losses)}:
            raise DpclipError(f"layer {use.name!r} sees {sorted(map(str, sizes))} rows for a "
                              f"batch of {len(losses)} records: the DP step needs every "
                              f"layer's inputs and output to hold the batch on dimension 0 "
                              f"(a sequence-first layout, (T, B, d), would be clipped per "
                              f"position, not per record)")
    for use in uses:
        if [t._version for t in use.activations] != use.versions:
            raise DpclipError(f"the input of layer {use.name!r} was changed in place after "
                              f"the layer ran: its weight gradient would be computed from the "
                              f"changed values (make the op that changes it out of place)")
    grads = torch.autograd.grad(losses.sum(), [use.edge for use in uses], allow_unused=True)
    calls: dict[int, list[LayerTerms]] = {}
    for use, g in zip(uses, grads):
        calls.setdefault(id(use.module), []).append(LayerTerms(
            use.module, use.activations,
            torch.zeros(use.output[0], dtype=use.output[1], device=use.output[2])
            if g is None else g.detach()))
    return [LayerTerms.over_calls(terms) for terms in calls.values()]


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
