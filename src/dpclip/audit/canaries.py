"""Canaries of the one-run audit (:mod:`dpclip.audit.bound`): m of them, each included in
training independently with probability 1/2, scored after training.

* :class:`GradientCanaries` (white-box): canary i is a record whose gradient is zero except for
  one coordinate of the model (a "Dirac" canary, Nasr et al. 2023; distinct coordinates, so
  canaries do not interfere), with a norm far above any clip threshold. An included canary
  joins the DP step like a record: Poisson-sampled with the run's rate q at every step, its
  per-layer norms seen by the method's scaling rule and extra queries, its clipped gradient
  added to the clipped sum before the noise. Its score is how far training moved its
  coordinate against the gradient, -(theta_T - theta_0)[j]. This audits the DP step itself:
  sampling, clipping, the method's rule and the noise.
* :func:`input_canaries` (black-box): public records with a wrong label, added to the members
  when included; scored by minus their loss under the trained model.
"""

from __future__ import annotations

import numpy as np
import torch

from dpclip.train.step import LayerGroups

RAW_NORM = 1e4  # a canary's gradient norm: above every clip threshold, so it is clipped


class GradientCanaries:
    """White-box canaries on the parameters of ``groups`` (see the module docstring)."""

    def __init__(self, groups: LayerGroups, m: int, q: float, seed: int) -> None:
        params = groups.flat()
        sizes = [p.numel() for p in params]
        if m > sum(sizes):
            raise ValueError(f"audit: {m} canaries need as many parameters; the model has "
                             f"{sum(sizes)}")
        rng = np.random.default_rng(seed)
        flat = np.sort(rng.choice(sum(sizes), size=m, replace=False))
        starts = np.cumsum([0] + sizes)
        self.param = np.searchsorted(starts, flat, side="right") - 1  # which parameter
        self.offset = flat - starts[self.param]  # where in it
        layer_of = [k for k, group in enumerate(groups.params) for _ in group]
        self.layer = np.array([layer_of[i] for i in self.param])
        self.n_layers, self.q = len(groups.names), q
        self.included = rng.random(m) < 0.5  # fixed before training, secret to the scorer
        self.sampling = torch.Generator().manual_seed(int(rng.integers(2**62)))

    def __len__(self) -> int:
        return len(self.included)

    def sample(self, device) -> tuple[np.ndarray, torch.Tensor]:
        """The included canaries in this step's Poisson batch (each with probability q) and
        their per-layer gradient norms, shape (k, L): RAW_NORM in their layer, 0 elsewhere."""
        draws = torch.rand(len(self), generator=self.sampling).numpy() < self.q
        chosen = np.flatnonzero(draws & self.included)
        norms = torch.zeros((len(chosen), self.n_layers), device=device)
        norms[torch.arange(len(chosen)), torch.as_tensor(self.layer[chosen],
                                                         dtype=torch.int64)] = RAW_NORM
        return chosen, norms

    def add(self, sums: list[torch.Tensor], chosen: np.ndarray, factors: torch.Tensor) -> None:
        """Add the chosen canaries' scaled gradients (``factors``: their rows of the method's
        scaling, (k,) or (k, L)) to the clipped sums, in ``groups.flat()`` order."""
        if not len(chosen):
            return
        factors = factors.detach()
        if factors.dim() == 2:  # per-layer factors: each canary's own layer
            factors = factors[torch.arange(len(chosen)), torch.as_tensor(self.layer[chosen])]
        values = factors * RAW_NORM
        for index in np.unique(self.param[chosen]):
            rows = np.flatnonzero(self.param[chosen] == index)
            target = sums[index].view(-1)
            target.index_add_(0, torch.as_tensor(self.offset[chosen[rows]], device=target.device),
                              values[torch.as_tensor(rows)].to(target.dtype))

    def scores(self, start: list[torch.Tensor], end: list[torch.Tensor]) -> np.ndarray:
        """-(theta_T - theta_0) at each canary's coordinate: training moves an included
        canary's coordinate against its gradient."""
        moved = [(b.detach().cpu() - a.detach().cpu()).reshape(-1) for a, b in zip(start, end)]
        return np.array([-float(moved[p][o]) for p, o in zip(self.param, self.offset)])


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
