"""What a training method is: a per-sample scaling rule, a controller, and the extra noisy
queries it declares for accounting. The shared DP step (:mod:`dpclip.train.step`) does the rest.

A method module defines one subclass of :class:`Method` and registers it with
:func:`register`; adding a method never touches the training loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from dpclip.privacy import ExtraQuery
from dpclip.randomness import NoiseSources


@dataclass
class StepRelease:
    """What one DP step releases; the only inputs a controller may read (METHODS.md step 6).

    ``noisy_grad`` is the noisy sum divided by the expected batch size, per parameter;
    ``extras`` holds the noisy answers of the method's extra queries.
    """

    step: int
    noisy_grad: list[torch.Tensor]
    extras: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Option:
    """One method parameter in params.yaml (``methods.<options_key>.<name>``) and its range."""

    default: Any
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    choices: tuple | None = None
    help: str = ""


@dataclass
class MethodContext:
    """What a method may know when it is built: C_0, the layers, d = number of trainable
    parameters, the expected batch size B, its options, the model (weights only) and, for
    methods that declare ``needs_shadow_risk``, the shadow stage's public risk record."""

    clip_norm: float
    layer_names: list[str]
    n_params: int = 0
    expected_batch: float = 1.0
    options: dict = field(default_factory=dict)
    model: nn.Module | None = None
    shadow_risk: dict | None = None  # the shadow stage's risk file, for methods that need it


class Method:
    """Base class. Subclasses set ``name`` and override the rules they change."""

    name: ClassVar[str] = ""
    private: ClassVar[bool] = True  # False: plain training, no clipping, no noise
    dp_guarantee: ClassVar[bool] = True  # False: a literal-paper variant whose epsilon fails
    options_key: ClassVar[str | None] = None  # section of params.yaml `methods:`
    OPTIONS: ClassVar[dict[str, Option]] = {}
    # "shared": the shared DP step (dpclip.train.step). "opacus_optimizer": the method brings an
    # Opacus DPOptimizer of its own through attach() and opacus_step().
    step_kind: ClassVar[str] = "shared"
    needs_shadow_risk: ClassVar[bool] = False  # True: trains only after the shadow stage
    # The neighbouring notion of the epsilon reported (privacy.adjacency): add_remove (one
    # record added or removed, Opacus's accountants under Poisson sampling) | replace_one_features
    adjacency: ClassVar[str | None] = "add_remove"
    # What the clip threshold's controller reads (privacy.data_use.clip_threshold)
    controller_data: ClassVar[str] = "nothing: C is constant"

    def __init__(self, context: MethodContext):
        self.context = context
        self.options = {**{k: o.default for k, o in self.OPTIONS.items()}, **context.options}
        self.clip_threshold = float(context.clip_norm)  # C_t, read before each step
        self.layer_names = list(context.layer_names)
        self.sigma_eff = self.sigma_train = None

    @classmethod
    def model_hidden(cls, options: dict, hidden) -> list[int]:
        """The hidden widths of the model this method trains (``train.hidden`` by default)."""
        return list(hidden)

    @classmethod
    def needs_public_data(cls, options: dict) -> bool:
        """True: training needs the public shadow train split (``sanitize``'s frozen mode)."""
        return False

    def data_use(self) -> dict[str, str]:
        """Which data each component of this method saw (the record's ``privacy.data_use``),
        so a reviewer can check it without reading code."""
        return {"weights": "members (the run's partition of target_train), only through the "
                           "clipped and noised DP step",
                "clip_threshold": self.controller_data}

    def bind_noise(self, sigma_eff: float, sigma_train: float) -> None:
        """Told once, after the sigma split: the step's overall and gradient multipliers."""
        self.sigma_eff, self.sigma_train = sigma_eff, sigma_train

    def scale(self, layer_norms: torch.Tensor) -> torch.Tensor:
        """Per-sample scaling factors s_i (shape B) or per-layer s_i^(l) (shape B x L).

        ``layer_norms[i, l]`` is ||g_i^(l)||. The result must satisfy ||gbar_i|| <= C_t for
        every i, where gbar_i^(l) = s_i^(l) * g_i^(l): the accountant relies on it.
        """
        raise NotImplementedError

    def extra_queries(self, sigma_eff: float) -> list[ExtraQuery]:
        """Gaussian queries released beside the gradient each step (for the sigma split)."""
        return []

    def release_extras(self, layer_norms: torch.Tensor, rng: NoiseSources) -> dict:
        """Answer the extra queries with their noise (the only place raw norms are used).

        Draw CPU answers from ``rng.extras`` and on-device answers from ``rng.noise``: the
        run's own checkpointed generators, never torch's global one. ``layer_norms`` has no
        rows on an empty batch: the answer is then the noise alone."""
        return {}

    def total_norms(self, layer_norms: torch.Tensor) -> torch.Tensor:
        """n_i of this step's norms, computed once: ``scale`` and ``release_extras`` read the
        same tensor, and on small models each tensor op is a visible part of the step."""
        cached = getattr(self, "_totals", None)
        if cached is None or cached[0] is not layer_norms:
            cached = self._totals = (layer_norms, total_norms(layer_norms))
        return cached[1]

    def update(self, release: StepRelease) -> None:
        """Controller: compute C_{t+1} and other state from DP-released quantities only."""

    def trace_row(self) -> dict:
        """Method-specific signals for the per-step trace (beyond C_t)."""
        return {}

    def state_dict(self) -> dict:
        return {"clip_threshold": self.clip_threshold}

    def load_state_dict(self, state: dict) -> None:
        self.clip_threshold = float(state["clip_threshold"])


REGISTRY: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    if not cls.name or cls.name in REGISTRY:
        raise ValueError(f"method name {cls.name!r} is empty or already registered")
    REGISTRY[cls.name] = cls
    return cls


def total_norms(layer_norms: torch.Tensor) -> torch.Tensor:
    """n_i = sqrt(sum_l (n_i^(l))^2)."""
    return layer_norms.pow(2).sum(dim=1).sqrt()


def clip_factors(layer_norms: torch.Tensor, clip: float, totals: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """DP-SGD's rule s_i = min(1, C / n_i); n_i = 0 gives 1 (the clamp avoids 0/0).
    ``totals``: the n_i, when the caller has computed them already."""
    totals = total_norms(layer_norms) if totals is None else totals
    return (clip / totals.clamp_min(1e-12)).clamp(max=1.0)
