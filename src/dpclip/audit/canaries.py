"""Canaries of the one-run audit (:mod:`dpclip.audit.bound`): m of them, each included in
training independently with probability 1/2, scored after training. :class:`GradientCanaries`
(white-box "Dirac" canaries: a gradient at one coordinate, or with ``span: every_layer`` one
per layer group so that a per-layer rule clips them to norm C) join the DP step like records,
auditing sampling, clipping, the method's rule and the noise. :func:`input_canaries`
(black-box) are public records with a wrong label, scored by minus their loss. How each is
clipped and scored: docs/api/audit.md.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from dpclip.train.book_keeping import LayerGroups

RAW_NORM = 1e4  # a canary's gradient norm: above every clip threshold, so it is clipped
SPANS = ("one_layer", "every_layer")


class GradientCanaries:
    """White-box canaries on the parameters of ``groups`` (see the module docstring).
    ``param``, ``offset`` and ``layer`` are (m, S) arrays: canary i's S coordinates (S = 1
    for ``one_layer``, L for ``every_layer``)."""

    def __init__(self, groups: LayerGroups, m: int, q: float, seed: int,
                 span: str = "one_layer") -> None:
        if span not in SPANS:
            raise ValueError(f"audit: canary span {span!r} is not one of {SPANS}")
        params = groups.flat()
        sizes = [p.numel() for p in params]
        starts = np.cumsum([0] + sizes)
        layer_of = np.array([k for k, group in enumerate(groups.params) for _ in group])
        rng = np.random.default_rng(seed)
        self.span, self.n_layers, self.q = span, len(groups.names), q
        if span == "one_layer":
            if m > sum(sizes):
                raise ValueError(f"audit: {m} canaries need as many parameters; the model has "
                                 f"{sum(sizes)}")
            flat = np.sort(rng.choice(sum(sizes), size=m, replace=False))[:, None]
        else:  # one coordinate per layer group: m distinct ones in each
            columns = []
            for layer in range(self.n_layers):
                mine = np.flatnonzero(layer_of == layer)
                coordinates = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in mine])
                if m > len(coordinates):
                    raise ValueError(f"audit: {m} canaries spanning every layer need as many "
                                     f"parameters in each; layer {groups.names[layer]!r} has "
                                     f"{len(coordinates)}")
                columns.append(rng.choice(coordinates, size=m, replace=False))
            flat = np.stack(columns, axis=1)
        self.param = np.searchsorted(starts, flat, side="right") - 1  # which parameter
        self.offset = flat - starts[self.param]  # where in it
        self.layer = layer_of[self.param]
        # the raw norm of a canary in each of its layers: R in one, R / sqrt(L) in each of L
        self.raw = RAW_NORM / math.sqrt(self.layer.shape[1])
        self.direction = np.zeros(self.layer.shape[1])  # a_l (every_layer), summed each step
        self.included = rng.random(m) < 0.5  # fixed before training, secret to the scorer
        self.sampling = torch.Generator().manual_seed(int(rng.integers(2**62)))
        self.steps_sampled = 0  # the DP steps that drew from the canaries

    def __len__(self) -> int:
        return len(self.included)

    def profile(self, k: int, device) -> torch.Tensor:
        """k canaries' per-layer gradient norms, shape (k, L): one row each."""
        norms = torch.zeros((k, self.n_layers), device=device)
        if self.span == "every_layer":
            return norms + self.raw
        return norms

    def sample(self, device) -> tuple[np.ndarray, torch.Tensor]:
        """The included canaries in this step's Poisson batch (each with probability q) and
        their per-layer gradient norms, shape (k, L): R in a one-layer canary's layer (0
        elsewhere), R / sqrt(L) in every layer of a spanning one."""
        self.steps_sampled += 1
        draws = torch.rand(len(self), generator=self.sampling).numpy() < self.q
        chosen = np.flatnonzero(draws & self.included)
        norms = self.profile(len(chosen), device)
        if self.span == "one_layer":
            norms[torch.arange(len(chosen)), torch.as_tensor(self.layer[chosen, 0],
                                                             dtype=torch.int64)] = RAW_NORM
        return chosen, norms

    def observe(self, method, device) -> None:
        """Add this step's per-layer factors of the method's rule for a spanning canary to
        the scoring direction a (a function of the rule's state, not of any sampling)."""
        if self.span != "every_layer":
            return
        factors = method.scale(self.profile(1, device)).detach().reshape(-1).cpu().numpy()
        self.direction += np.broadcast_to(factors, (self.n_layers,)) * self.raw

    def add(self, sums: list[torch.Tensor], chosen: np.ndarray, factors: torch.Tensor) -> None:
        """Add the chosen canaries' scaled gradients (``factors``: their rows of the method's
        scaling, (k,) or (k, L)) to the clipped sums, in ``groups.flat()`` order."""
        if not len(chosen):
            return
        factors = factors.detach()
        rows = torch.arange(len(chosen))
        for slot in range(self.layer.shape[1]):
            each = factors if factors.dim() == 1 else \
                factors[rows, torch.as_tensor(self.layer[chosen, slot])]  # the slot's layer
            values = each * self.raw
            params, offsets = self.param[chosen, slot], self.offset[chosen, slot]
            for index in np.unique(params):
                picked = np.flatnonzero(params == index)
                target = sums[index].view(-1)
                target.index_add_(0, torch.as_tensor(offsets[picked], device=target.device),
                                  values[torch.as_tensor(picked)].to(target.dtype))

    def scores(self, start: list[torch.Tensor], end: list[torch.Tensor]) -> np.ndarray:
        """-(theta_T - theta_0) at each canary's coordinate (one-layer), or its projection on
        the direction a (every-layer): training moves an included canary against its
        gradient."""
        moved = [(b.detach().cpu() - a.detach().cpu()).reshape(-1) for a, b in zip(start, end)]
        against = np.array([[-float(moved[p][o]) for p, o in zip(ps, os)]
                            for ps, os in zip(self.param, self.offset)])
        weights = self.direction if self.span == "every_layer" else np.ones(1)
        return against @ weights

    def facts(self) -> dict:
        """What the audit's record says of its canaries."""
        return {"canary_span": self.span, "canary_coordinates": int(self.layer.shape[1]),
                **({"canary_direction": [float(v) for v in self.direction]}
                   if self.span == "every_layer" else {})}


def input_canaries(x: np.ndarray, y: np.ndarray, n_classes: int, m: int, seed: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """m black-box canaries from the public records ``x, y``: each gets a label other than its
    own (uniformly), and is included with probability 1/2. Returns (features, wrong labels,
    included)."""
    if m > len(x):
        raise ValueError(f"audit: {m} input canaries need as many public records; there are "
                         f"{len(x)}")
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(x), size=m, replace=False)
    shift = rng.integers(1, n_classes, size=m)
    return x[pick], (y[pick] + shift) % n_classes, rng.random(m) < 0.5
