"""Typed, validated parameters read from ``params.yaml``: one pydantic model per section.

Every stage, the CLI and the Prefect flows read parameters through :func:`load_params`: a bad
value fails the same way whichever front door started the run, before any work, with one
message listing every bad key (full dotted name) and its value; unknown keys are refused. Each
method's options are its module's model (:meth:`dpclip.methods.base.Method.options_model`);
:func:`json_schema` (``dpclip schema``) exports the whole schema for editors.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (BeforeValidator, Field, StrictBool, ValidationError, field_validator,
                      model_validator)

from dpclip.attacks import discover as discover_attacks
from dpclip.attacks import baseline_attack, get_attack
from dpclip.data.sources import available_sources
from dpclip.data.sources import discover as discover_sources
from dpclip.errors import ConfigError, DpclipError, bad_value
from dpclip.param_types import (IID, NUMBER, Alpha, Count, Fraction, Positive, Real, Section,
                                Seed, Text, problems_of, unique_list)



def _level(value) -> str:
    """A category level as text (YAML may read 3 or 1.5); true / false are no level."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{value!r} is not a level (text or a number)")
    return str(value)


Level = Annotated[str, BeforeValidator(_level)]
CLASSIFIERS = ("logistic", "gbdt")  # per-layer membership classifiers
RISK_EVALS = ("cv", "train")  # shadow risk: held-out folds | the paper's literal protocol
EARLY_STOPPING_RULES = ("slope", "linear_trend")


class SplitFractions(Section):
    """Fractions of the dataset given to each split; they sum to 1. With a separate public
    shadow dataset the shadow fractions apply to it and the target ones are renormalised."""

    target_train: Annotated[float, Field(gt=0, le=1), NUMBER] = 0.4
    target_holdout: Annotated[float, Field(gt=0, le=1), NUMBER] = 0.2
    shadow_train: Fraction = 0.2
    shadow_holdout: Fraction = 0.2

    @model_validator(mode="after")
    def _sum_to_one(self):
        total = sum(self.model_dump().values())
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"{self.model_dump()!r} fractions sum to {total:g}, not 1")
        return self


class DataParams(Section):
    dataset: Text = "digits"  # a source of dpclip.data.sources
    path: Text | None = None
    seed: Seed = 0
    download: StrictBool = True
    # at most this many records of the dataset (and of the shadow dataset), a stratified seeded
    # subset drawn before the splits (None: all); a quicker run on a large file
    max_records: Annotated[int, Field(ge=10), NUMBER] | None = None
    target: Text | None = None  # csv: the label column
    # csv: rename label values before anything reads them ({"2": "1"}: merge classes; Heart's
    # num > 0, Adult's ">50K." of its test file); values not listed stay as they are
    target_map: dict[Level, Level] | None = None
    columns: list[str] | None = None
    numeric_columns: list[str] | None = None
    categorical_columns: list[str] | None = None
    missing_values: list[str] = ["", "?", "NA", "NaN", "nan"]
    shadow_dataset: Text | None = None  # a separate public dataset (a source as well)
    shadow_path: Text | None = None
    shadow_max_shared: Fraction = 0.01  # of the shadow records that may equal a main record
    # csv: the public schema {column: [levels]}; the target's entry is the class list
    categories: dict[str, Annotated[list[Level], Field(min_length=1)]] | None = None
    split: SplitFractions = SplitFractions()

    @field_validator("categories")
    @classmethod
    def _levels_once(cls, value):
        for col, levels in (value or {}).items():
            if len(set(levels)) != len(levels):
                raise ValueError(bad_value(f"data.categories.{col}", levels,
                                           "has repeated levels"))
        return value

    @model_validator(mode="after")
    def _sources_known_and_complete(self):
        """Each named dataset is a registered source, with what that source needs (its
        path; a CSV's label column)."""
        registry, problems = discover_sources(), []
        for role, name in (("data.dataset", self.dataset),
                           ("data.shadow_dataset", self.shadow_dataset)):
            if name is None:
                continue
            if name not in registry:
                problems.append(bad_value(role, name, f"is not one of {sorted(registry)}: a "
                                          f"dataset source is a module in "
                                          f"src/dpclip/data/sources/"))
            else:
                problems += registry[name].check(self, role)
        if problems:
            raise ValueError("\n".join(problems))
        return self


class PartitionParams(Section):
    alphas: unique_list(Alpha) = [IID]


class PrivacyParams(Section):
    target_epsilons: unique_list(Positive) = [8.0]
    delta: Annotated[float, Field(gt=0, lt=1), NUMBER] = 1e-5
    accountant: Literal["rdp", "prv"] = "rdp"
    epsilon_tolerance: Positive = 0.01
    secure_noise: StrictBool = False  # OS-entropy noise, never stored: for a released model


class EarlyStopping(Section):
    rule: Literal[("none",) + EARLY_STOPPING_RULES] = "none"
    window: Annotated[int, Field(ge=2), NUMBER] = 5  # epochs
    threshold: Real = 0.0  # T_s (slope) or tau (linear_trend)


class TrainParams(Section):
    methods: unique_list(str) = ["non_private", "dp_sgd"]
    model: Literal["mlp", "cnn", "paper_cnn"] = "mlp"
    hidden: unique_list(Count, min_length=0) = [128, 64]
    seeds: unique_list(Seed) = [0]
    epochs: Count = 30
    batch_size: Count = 64
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: Positive = 0.5
    momentum: Annotated[float, Field(ge=0, lt=1), NUMBER] = 0.0
    clip_norm: Positive = 1.0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: Count | None = None  # torch's CPU threads (None: one per CPU); results depend on it
    checkpoint_every: Count = 5
    # start from a model pre-trained on the public shadow split (no privacy cost): the same
    # public knowledge the sound sanitize encoder has, for a fair pairing
    public_init: StrictBool = False
    early_stopping: EarlyStopping = EarlyStopping()

    @field_validator("methods")
    @classmethod
    def _registered(cls, methods):
        from dpclip.methods import available_methods  # late: the methods read this module

        unknown = [m for m in methods if m not in available_methods()]
        if unknown:
            raise ValueError("\n".join(f"train.methods: {m!r} is not one of "
                                       f"{available_methods()}" for m in unknown))
        return methods


class EvaluateParams(Section):
    ece_bins: Count = 15
    ir_attack: StrictBool = True  # layer-wise membership inference on representations


class ShadowParams(Section):
    """The shadow model (target architecture, non-private, on the public shadow train split)
    whose per-layer membership attacks estimate each layer's risk ER^(l)."""

    epochs: Count = 30
    batch_size: Count = 64
    max_records: Count | None = 4000  # a seeded subset of each public split (None: all)
    risk_eval: Literal[RISK_EVALS] = "cv"
    alpha: Alpha = IID  # Dirichlet label skew of the shadow train split (transfer tests)
    seed: Seed = 0


ATTACK_MODES = ("offline", "online")
POPULATIONS = ("public", "shadow_train", "shadow_holdout")


def _attack_registry() -> dict:
    return discover_attacks()


class AttackParams(Section):
    """Membership attacks: which record-level attacks the evaluate stage runs (``kinds``, each
    a module of :mod:`dpclip.attacks`) and their options (``attack.<name>``), the per-layer
    classifiers (shadow risk, IR-level MIA) and the reference models of the attacks that need
    them (the ``reference`` stage)."""

    kinds: unique_list(str) = ["loss", "lira", "rmia"]  # registered attacks; loss always
    classifier: Literal[CLASSIFIERS] = "logistic"
    folds: Annotated[int, Field(ge=2), NUMBER] = 5
    max_features: Count = 512  # conv maps average-pooled to this many
    max_records: Annotated[int, Field(ge=2), NUMBER] = 2000  # members (and as many non-members)
    # reference models per run, in complementary pairs (each pool record IN for exactly half);
    # 0 = none (the attacks that need them are skipped, with the reason in the metrics)
    references: Annotated[int, Field(ge=0), NUMBER] = 2
    mode: Literal[ATTACK_MODES] = "offline"  # offline: public pool | online: members + holdout
    population: Literal[POPULATIONS] = "public"  # offline pool and RMIA's z: public splits
    # the attack compared across methods and seeds, chosen before any run (auto: the first of
    # attack.kinds that uses reference models when there are some, else the baseline loss), not
    # the per-run best, which is biased upward
    headline: Text = "auto"
    # attack -> its validated options: the attack.<name> sections of params.yaml
    options: dict[str, dict] = {}

    @model_validator(mode="before")
    @classmethod
    def _attack_sections(cls, data):
        """Move each ``attack.<name>`` section into ``options``, validated by the attack's own
        model (every registered attack gets its defaults); refuse an option's old flat key."""
        if data is None:  # an empty section: the defaults
            data = {}
        if not isinstance(data, dict):
            return data
        registry, data, problems = _attack_registry(), dict(data), []
        for name, attack in sorted(registry.items()):
            problems += [bad_value(f"attack.{old}", data[old], f"has moved to "
                                   f"attack.{name}.{new}") for old, new in
                         attack.MOVED_KEYS.items() if old in data]
        written = dict(data.pop("options", None) or {})
        written.update({name: data.pop(name) for name in registry if name in data})
        problems += [bad_value(f"attack.{name}", value, f"is not a registered attack "
                               f"{sorted(registry)}") for name, value in written.items()
                     if name not in registry]
        options = {}
        for name, attack in sorted(registry.items()):
            try:
                options[name] = attack.Options.model_validate(written.get(name) or {}
                                                              ).model_dump()
            except ValidationError as exc:
                problems += problems_of(exc, ("attack", name))
        if problems:
            raise ValueError("\n".join(problems))
        return {**data, "options": options}

    def baseline(self) -> str:
        return baseline_attack().name

    def headline_attack(self) -> str:
        if self.headline != "auto":
            return self.headline
        registry = _attack_registry()
        calibrated = [k for k in self.kinds if registry[k].needs_references]
        return calibrated[0] if self.references and calibrated else self.baseline()

    def build(self, name: str):
        """The attack ``name`` with its options from params.yaml."""
        attack = get_attack(name)
        return attack(attack.Options.model_validate(self.options.get(name, {})))

    @model_validator(mode="after")
    def _attacks_fit(self):
        registry, k, problems = _attack_registry(), self.references, []
        problems += [bad_value("attack.kinds", kind, f"is not one of {sorted(registry)}: an "
                               f"attack is a module in src/dpclip/attacks/")
                     for kind in self.kinds if kind not in registry]
        if self.baseline() not in self.kinds:
            problems.append(bad_value("attack.kinds", self.kinds, f"must include "
                                      f"{self.baseline()!r}, the baseline attack every run "
                                      f"reports (mia_auc)"))
        if k % 2:
            problems.append(bad_value("attack.references", k, "is odd: reference models come "
                                      "in complementary pairs (each pool record IN for exactly "
                                      "half of them)"))
        elif self.mode == "online" and 0 < k < 4:
            problems.append(bad_value("attack.references", k, "is too few for attack.mode "
                                      "'online': each record needs two IN and two OUT models; "
                                      "use 4 or more"))
        for kind in (kind for kind in self.kinds if kind in registry):
            attack = registry[kind]
            problems += attack.check_options(attack.Options.model_validate(self.options[kind]),
                                             k, self.mode)
        if self.headline != "auto" and self.headline not in self.kinds:
            problems.append(bad_value("attack.headline", self.headline, f"is not one of "
                                      f"attack.kinds {self.kinds} (or auto)"))
        elif self.headline in registry and registry[self.headline].needs_references and k == 0:
            problems.append(bad_value("attack.headline", self.headline, "needs reference "
                                      "models: attack.references is 0"))
        if problems:
            raise ValueError("\n".join(problems))
        return self


class AuditParams(Section):
    """The one-run privacy audit of every run with a DP claim (dpclip.audit)."""

    # whitebox: gradient canaries in the DP step; blackbox: mislabelled public records (loose
    # at moderate epsilon, and one more model per run); [] = off
    kinds: unique_list(Literal["whitebox", "blackbox"], min_length=0) = ["whitebox"]
    canaries: Count = 1000  # white-box: gradient canaries (distinct model coordinates)
    # white-box canary shape: one_layer (a coordinate) | every_layer (one per layer group, so a
    # per-layer rule clips it to its full C) | auto (every_layer for a per-layer rule)
    canary_span: Literal["auto", "one_layer", "every_layer"] = "auto"
    input_canaries: Count = 200  # black-box: mislabelled public records (shadow holdout)
    confidence: Annotated[float, Field(gt=0, lt=1), NUMBER] = 0.95
    seed: Seed = 0


class TuneParams(Section):
    """Equal-budget hyperparameter search on public data (``dpclip tune``,
    :mod:`dpclip.stages.tune`): the same number of trials for every method and target
    epsilon, over the learning rate, C (C_0) and the method's own knobs."""

    trials: Annotated[int, Field(ge=0), NUMBER] = 0  # per (method, target epsilon); 0 = off
    seed: Seed = 0  # Optuna's TPE sampler, the public splits' division and each trial's training
    lr: Annotated[list[Positive], Field(min_length=2, max_length=2)] = [0.01, 2.0]  # log range
    clip_norm: Annotated[list[Positive], Field(min_length=2, max_length=2)] = [0.1, 10.0]
    epochs: Count | None = None  # each trial's epochs (None: train.epochs)

    @model_validator(mode="after")
    def _ranges_increase(self):
        problems = [bad_value(f"tune.{key}", getattr(self, key), "must be [low, high] with "
                              "low < high") for key in ("lr", "clip_norm")
                    if getattr(self, key)[0] >= getattr(self, key)[1]]
        if problems:
            raise ValueError("\n".join(problems))
        return self


class TrackingParams(Section):
    private_diagnostics: StrictBool = False  # MLflow also gets train_loss and batch_size
    # how MLflow stores each model: pt2 (torch.export: loads without dpclip and without
    # unpickling code) or pickle (about 0.5 s less a model; MLflow warns it can run code on load)
    model_format: Literal["pt2", "pickle"] = "pt2"


class ScheduleParams(Section):
    cron: Text = "0 3 * * *"
    timezone: Text = "UTC"

    @field_validator("cron")
    @classmethod
    def _five_fields(cls, cron: str) -> str:
        if len(cron.split()) != 5:
            raise ValueError(f"{cron!r} must be a cron expression with 5 fields")
        return cron


class Params(Section):
    data: DataParams = DataParams()
    partition: PartitionParams = PartitionParams()
    privacy: PrivacyParams = PrivacyParams()
    train: TrainParams = TrainParams()
    evaluate: EvaluateParams = EvaluateParams()
    shadow: ShadowParams = ShadowParams()
    attack: AttackParams = AttackParams()
    audit: AuditParams = AuditParams()
    tune: TuneParams = TuneParams()
    schedule: ScheduleParams = ScheduleParams()
    tracking: TrackingParams = TrackingParams()
    methods: dict[str, dict] = {}  # method -> its validated options (methods.base)

    def to_dict(self) -> dict:
        return self.model_dump()

    def method_options(self, method: str) -> dict:
        """The validated options of one method (its section of ``methods:``)."""
        return dict(self.methods.get(method, {}))


def _public_head_problems(params: Params, methods: dict) -> list[str]:
    """sanitize's keep_public_head scores heads on the public holdout split, which only says
    anything of the private task when the public split is of the same dataset."""
    from dpclip.methods import get_method

    if "sanitize" not in params.train.methods or not params.data.shadow_dataset:
        return []
    options = {**get_method("sanitize").default_options(), **methods.get("sanitize", {})}
    if options["encoder"] != "frozen" or not options["keep_public_head"]:
        return []
    return [bad_value("methods.sanitize.keep_public_head", True,
                      f"would choose the head on another dataset's task (data.shadow_dataset: "
                      f"{params.data.shadow_dataset}): set it false")]


def _device_problems(params: Params) -> list[str]:
    """``train.device: cuda`` on a machine without a GPU, refused when the parameters are read
    (every stage's command reads them first), not only once a run trains."""
    if params.train.device != "cuda":
        return []
    import torch

    if torch.cuda.is_available():
        return []
    return [bad_value("train.device", "cuda", "asks for a CUDA GPU and this machine has none: "
                                              "use auto (a GPU when there is one) or cpu")]


def parse_params(raw: dict | None) -> Params:
    """Validate a raw parameter mapping; raise :class:`ConfigError` listing every bad key."""
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError([bad_value("params.yaml", raw, "must be a mapping of sections "
                                                         "(data:, train:, ...)")])
    raw = dict(raw or {})
    methods_raw = raw.pop("methods", None)
    problems: list[str] = []
    try:
        params = Params.model_validate(raw)
    except ValidationError as exc:
        problems += problems_of(exc)
        params = None
    if params is not None:  # the options' checks need the model's layer names
        from dpclip.methods.base import read_method_options
        from dpclip.models import layer_names

        names = layer_names(params.train.model, params.train.hidden)
        methods = read_method_options(methods_raw, names, problems)
        problems += _public_head_problems(params, methods)
        problems += _device_problems(params)
    if problems:  # a shared old section is read by several methods: its problems once
        raise ConfigError(list(dict.fromkeys(problems)))
    return params.model_copy(update={"methods": methods})


def load_params(path: str | Path = "params.yaml", overrides: dict | None = None) -> Params:
    """Read ``params.yaml``, set the ``overrides`` (nested sections, e.g. ``{"train":
    {"methods": [...]}}``: what a Prefect run form changes) and validate the result."""
    path = Path(path)
    if not path.exists():
        raise DpclipError(f"parameter file {str(path)!r} does not exist")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise DpclipError(f"parameter file {str(path)!r} is not valid YAML: {exc}") from exc
    if overrides and isinstance(raw, dict):
        raw = with_overrides(raw, overrides)
    return parse_params(raw)


def with_overrides(raw: dict, overrides: dict) -> dict:
    """A copy of the raw mapping ``raw`` with ``overrides`` set, section by section (a nested
    mapping replaces single keys; any other value replaces the whole entry)."""
    out = copy.deepcopy(raw)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = with_overrides(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def json_schema() -> dict:
    """The JSON schema of params.yaml, each registered method's and attack's options included
    (``methods.<name>``, ``attack.<name>``)."""
    from dpclip.methods.base import REGISTRY

    schema = Params.model_json_schema()
    data = schema["$defs"]["DataParams"]["properties"]
    data["dataset"] = {**data["dataset"], "enum": available_sources()}
    data["shadow_dataset"]["anyOf"][0]["enum"] = available_sources()
    attack = schema["$defs"]["AttackParams"]["properties"]
    attack.pop("options")  # written as attack.<name> sections
    attack.update({name: cls.Options.model_json_schema()
                   for name, cls in sorted(_attack_registry().items())})
    schema["properties"]["methods"] = {
        "type": "object", "additionalProperties": False,
        "properties": {name: cls.options_model().model_json_schema()
                       for name, cls in sorted(REGISTRY.items())}}
    return schema
