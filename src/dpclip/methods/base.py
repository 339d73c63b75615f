"""What a training method is, and every hook one may use.

A method is one module in :mod:`dpclip.methods` that defines a subclass of :class:`Method` and
decorates it with :func:`register`; the package finds the module by itself
(:func:`dpclip.methods.discover`). Each hook has a default, so a method overrides only what it
changes; the generic code calls the hooks and never names a method. The hooks by what they
serve, and what a layer is: docs/adding-a-method.md, "What else a method may override".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, create_model
from torch import nn

from dpclip.errors import DpclipError, bad_value
from dpclip.param_types import NUMBER, problems_of, unknown_key
from dpclip.privacy import ExtraQuery
from dpclip.randomness import NoiseSources
from dpclip.registry import Registry


@dataclass
class StepRelease:
    """What one DP step releases; the only inputs a controller may read (docs/privacy.md,
    "The DP step").

    ``noisy_grad`` is the noisy sum divided by the expected batch size, per parameter;
    ``extras`` holds the noisy answers of the method's extra queries.
    """

    step: int
    noisy_grad: list[torch.Tensor]
    extras: dict = field(default_factory=dict)


@dataclass(frozen=True)
class PrivacyClaim:
    """What a run's epsilon is, fixed by its method and options before any training: a DP
    guarantee or not (``privacy.dp_guarantee``), and under which neighbouring notion
    (``privacy.adjacency``: add_remove, replace_one_features, None for no DP claim). The run's
    record, the audit stage and ``dpclip cost`` all read it here."""

    dp_guarantee: bool
    adjacency: str | None


@dataclass(frozen=True)
class Option:
    """One method parameter in params.yaml (``methods.<method>.<option>``) and its range."""

    default: Any
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    choices: tuple | None = None
    help: str = ""

    def field(self) -> tuple:
        """(type, pydantic Field) of this option in the method's options model."""
        if self.choices is not None:
            kind = Literal[self.choices]
        elif isinstance(self.default, bool):
            kind = StrictBool
        elif isinstance(self.default, str):
            kind = Annotated[str, Field(min_length=1)]
        elif self.integer:  # YAML's true / false are not numbers
            kind = Annotated[int, NUMBER]
        else:
            kind = Annotated[float, NUMBER, Field(allow_inf_nan=False)]
        bounds = {("gt" if self.low_open else "ge"): self.low} if self.low is not None else {}
        if self.high is not None:
            bounds[("lt" if self.high_open else "le")] = self.high
        return kind, Field(self.default, description=self.help or None, **bounds)


@dataclass(frozen=True)
class Tunable:
    """One hyperparameter ``dpclip tune`` searches (:mod:`dpclip.stages.tune`): a range
    [low, high], searched on a log scale when ``log``, over integers when ``integer``."""

    low: float
    high: float
    log: bool = False
    integer: bool = False


@dataclass
class MethodContext:
    """What a method may know when it is built: C_0, the layers, d = number of trainable
    parameters, the expected batch size B, its options, the model (weights only) and, for
    methods that declare ``needs_shadow_risk``, the shadow stage's public risk record."""

    clip_norm: float
    layer_names: list[str]
    n_params: int = 0
    expected_batch: float = 1.0
    # the validated ``methods.<name>`` section (an instance of the method's options model);
    # None: every option at its default
    options: BaseModel | None = None
    model: nn.Module | None = None
    shadow_risk: dict | None = None  # the shadow stage's risk file, for methods that need it


CONSTANT_CLIP = "nothing: C is constant"  # the controller_data of a method without a controller
# what a method does not define, and where it belongs: refused rather than silently ignored
OWNED_ELSEWHERE = {name: "the model a run trains is its run kind's (dpclip.train.runs)"
                  for name in ("model_hidden", "needs_public_data", "rebuild_for_evaluation")}
OWNED_ELSEWHERE["Options"] = "a method's options are its OPTIONS"
CLAIM_FIELDS = ("dp_guarantee", "adjacency")  # what Method.privacy_claim returns


class Method:
    """Base class. Subclasses set ``name`` and override the hooks they change."""

    name: ClassVar[str] = ""
    private: ClassVar[bool] = True  # False: plain training, no clipping, no noise
    dp_guarantee: ClassVar[bool] = True  # False: a literal-paper variant whose epsilon fails
    OPTIONS: ClassVar[dict[str, Option]] = {}  # params.yaml methods.<name>.<option>
    # How the method's training runs (dpclip.train.runs.RUN_KINDS): "private" = the shared DP
    # step (dpclip.train.step); "plain" = no privacy; "opacus_optimizer" = the method brings an
    # Opacus DPOptimizer of its own (dpclip.train.runs.opacus_optimizer); a method with a
    # mechanism of its own names the run kind that implements it (and the model it trains).
    run_kind: ClassVar[str] = "private"
    needs_shadow_risk: ClassVar[bool] = False  # True: trains only after the shadow stage
    # The neighbouring notion of the epsilon reported (privacy.adjacency): add_remove (one
    # record added or removed, Opacus's accountants under Poisson sampling) | replace_one_features
    adjacency: ClassVar[str | None] = "add_remove"
    # What the clip threshold's controller reads (privacy.data_use.clip_threshold); a method
    # without a controller keeps CONSTANT_CLIP
    controller_data: ClassVar[str] = CONSTANT_CLIP
    # What early stopping watches for this method (privacy.data_use and the plot's label)
    early_stopping_watches: ClassVar[str] = ("the public shadow_train split under the released "
                                             "weights")
    early_stopping_series: ClassVar[str] = "public head-input std"
    # Trace columns of trace_row() that MLflow logs as step metrics
    STEP_METRICS: ClassVar[tuple[str, ...]] = ()
    # dpclip tune: the method's own knobs it searches, beside the learning rate and C (C_0)
    TUNED_OPTIONS: ClassVar[dict[str, Tunable]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        misplaced = [f"{name} ({why})" for name, why in OWNED_ELSEWHERE.items()
                     if name in cls.__dict__]
        if misplaced:
            raise DpclipError(f"method class {cls.__name__} defines {'; '.join(misplaced)}: "
                              f"docs/adding-a-method.md")
        cls._options_model = None
        cls.options_model()  # built with the class: unpickling an options instance needs it

    def __init__(self, context: MethodContext):
        self.context = context
        self.options = self.typed_options(context.options)
        self.claim = self.privacy_claim(self.options)
        self.clip_threshold = float(context.clip_norm)  # C_t, read before each step
        self.layer_names = list(context.layer_names)
        self.sigma_eff = self.sigma_train = None

    def __setattr__(self, name: str, value) -> None:
        # a run's claim is privacy_claim(options), read alike by its record and the audit: set
        # on an instance, it would silently reach neither
        if name in CLAIM_FIELDS:
            raise DpclipError(f"method {self.name!r}: {name} is declared on the class, or "
                              f"computed from the options by privacy_claim(options), not set "
                              f"on an instance: docs/adding-a-method.md")
        super().__setattr__(name, value)

    @classmethod
    def privacy_claim(cls, options: BaseModel | None = None) -> PrivacyClaim:
        """What a run with ``options`` (None: the defaults) claims: the class's
        ``dp_guarantee`` and ``adjacency``, unless an option of the method changes them."""
        return PrivacyClaim(cls.dp_guarantee, cls.adjacency)

    @classmethod
    def typed_options(cls, options: BaseModel | None) -> BaseModel:
        """``options`` as validated once by :func:`read_method_options` (None: the defaults).
        A mapping is refused: options reach a method typed, never re-merged from raw values."""
        model = cls.options_model()
        if options is None:
            return model()
        if not isinstance(options, model):
            raise TypeError(f"{cls.name}: options must be a {model.__name__} (validated by "
                            f"{cls.__name__}.options_model()), not {type(options).__name__}")
        return options

    def data_use(self) -> dict[str, str]:
        """Which data each component of this method saw (the record's ``privacy.data_use``),
        so a reviewer can check it without reading code."""
        return {"weights": "members (the run's partition of target_train), only through the "
                           "clipped and noised DP step",
                "clip_threshold": self.controller_data}

    @classmethod
    def options_model(cls) -> type[BaseModel]:
        """The pydantic model of ``methods.<name>``, built from ``OPTIONS`` (ranges as
        constraints, unknown options refused)."""
        if cls.__dict__.get("_options_model") is None:
            model = create_model(
                f"{cls.__name__}Options", __config__=ConfigDict(extra="forbid", frozen=True),
                __module__=cls.__module__,
                **{name: option.field() for name, option in cls.OPTIONS.items()})
            # named where it lives, so pickle finds the same class in another process (a
            # Dask worker of the flow): options there are still instances of the model
            model.__qualname__ = f"{cls.__qualname__}._options_model"
            cls._options_model = model
        return cls._options_model

    @classmethod
    def default_options(cls) -> BaseModel:
        """Every option at its default (what an empty ``methods.<name>`` section gives)."""
        return cls.options_model()()

    @classmethod
    def parse_options(cls, section: dict | None) -> BaseModel:
        """``section`` (a ``methods.<name>`` mapping) validated by the options model; raises
        pydantic's ``ValidationError`` (tools and tests build a run from loose values)."""
        return cls.options_model().model_validate(section or {})

    @classmethod
    def check_options(cls, values: BaseModel, prefix: str,
                      layer_names: list[str]) -> list[str]:
        """Problems of the options taken together (one line each, naming ``prefix.<option>``
        and the value), beyond each option's own range; ``layer_names`` are the model's."""
        return []

    @classmethod
    def params_problems(cls, options: BaseModel, params) -> list[str]:
        """This method's rules across sections of params.yaml: its validated ``options``
        against the rest of ``params`` (checked when ``train.methods`` names it), one line each
        naming the key; none by default."""
        return []

    @classmethod
    def resolved_options(cls, options: BaseModel | None, params) -> BaseModel | None:
        """``options`` with each ``auto`` value chosen for the setting ``params`` describes
        (what a run trains with; records keep the written ``auto``); unchanged by default."""
        return options

    @classmethod
    def tuning_space(cls, options: BaseModel, lr: Tunable,
                     clip_norm: Tunable) -> dict[str, Tunable]:
        """What ``dpclip tune`` searches for this method, by dotted params.yaml key: the
        learning rate ``train.lr`` (range ``lr``), C (or C_0) ``train.clip_norm`` for a private
        method (range ``clip_norm``), and ``methods.<name>.<option>`` for each of
        ``TUNED_OPTIONS``. A method whose training ignores one of them leaves it out."""
        space = {"train.lr": lr}
        if cls.private:
            space["train.clip_norm"] = clip_norm
        space.update({f"methods.{cls.name}.{name}": tunable
                      for name, tunable in cls.TUNED_OPTIONS.items()})
        return space

    @classmethod
    def step_metrics(cls, columns) -> list[str]:
        """The trace columns this method adds that MLflow logs per step."""
        return [c for c in columns if c in cls.STEP_METRICS]

    def probe_cost(self) -> dict | None:
        """``dpclip bench``: a periodic probe's cost so far, ``{"every": K steps,
        "seconds": s}``; None for a method without one."""
        return None

    def bind_noise(self, sigma_eff: float, sigma_train: float) -> None:
        """Told once, after the sigma split: the step's overall and gradient multipliers."""
        self.sigma_eff, self.sigma_train = sigma_eff, sigma_train

    def scale(self, layer_norms: torch.Tensor) -> torch.Tensor:
        """Per-sample scaling factors s_i (shape B) or per-layer s_i^(l) (shape B x L).

        ``layer_norms[i, l]`` is ||g_i^(l)||. The result must satisfy ||gbar_i|| <= C_t for
        every i, where gbar_i^(l) = s_i^(l) * g_i^(l): the accountant relies on it. Every
        method of the ``private`` run kind defines it.
        """
        raise NotImplementedError(f"method {self.name!r} defines no scaling rule")

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


REGISTRY = Registry("method", "dpclip.methods", "Method", "dpclip.methods")
register = REGISTRY.register  # the class decorator of every method module


def read_method_options(raw: object, layer_names: list[str], problems: list[str]) -> dict:
    """``methods.<method>.<option>`` for every registered method, each validated by the
    method's own model."""
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        problems.append(bad_value("methods", raw, "must be a mapping of keys"))
        return {}
    problems += [unknown_key(f"methods.{k}", v, REGISTRY)
                 for k, v in raw.items() if k not in REGISTRY]
    out = {}
    for key, cls in sorted(REGISTRY.items()):
        section = raw.get(key)
        try:
            values = cls.parse_options(section)
        except ValidationError as exc:
            problems += problems_of(exc, ("methods", key), cls.options_model())
            continue
        problems += cls.check_options(values, f"methods.{key}", layer_names)
        out[key] = values
    return out


EPS64 = torch.finfo(torch.float64).eps


def total_norms(layer_norms: torch.Tensor) -> torch.Tensor:
    """n_i = sqrt(sum_l (n_i^(l))^2), never below the true value: summed in float64 (a float32
    square of a norm below about 1e-23 is 0, and a nonzero block would then be scaled as a
    zero one: auto_s's factor became C / gamma), the sum's and root's rounding added, and
    rounded upwards to the norms' dtype."""
    wide = layer_norms.double().square().sum(dim=1).sqrt() * \
        (1 + (layer_norms.shape[1] + 4) * EPS64)
    return rounded(wide, layer_norms.dtype, upward=True)


def rounded(wide: torch.Tensor, dtype: torch.dtype, upward: bool) -> torch.Tensor:
    """Float64 ``wide`` in ``dtype``, rounded upwards (a norm: never below the value) or
    downwards towards 0 (a clip factor: never above it), one unit in the last place where the
    nearest value lies on the wrong side."""
    narrow = wide.to(dtype)
    if dtype == torch.float64:
        return narrow
    wrong = narrow.double() < wide if upward else narrow.double() > wide
    target = torch.full_like(narrow, torch.inf if upward else 0.0)
    return torch.where(wrong, torch.nextafter(narrow, target), narrow)


def factors_of(clip: float, denominators: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """C / d_i computed in float64 and rounded downwards to ``dtype``: a record scaled by it
    never exceeds the bound its rule promises through the factor's own rounding."""
    return rounded(clip / denominators.double(), dtype, upward=False)


def clip_factors(layer_norms: torch.Tensor, clip: float, totals: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """DP-SGD's rule s_i = min(1, C / n_i); n_i = 0 gives 1 (the clamp avoids 0/0).
    ``totals``: the n_i, when the caller has computed them already."""
    totals = total_norms(layer_norms) if totals is None else totals
    return factors_of(clip, totals.clamp_min(1e-12), totals.dtype).clamp(max=1.0)
