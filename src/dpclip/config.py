"""The schema of ``params.yaml``: one pydantic model per section, and the rules within them.

The schema knows no plugin. The methods, attacks and dataset sources are names here, and the
sections that belong to one (``methods.<name>``, ``attack.<name>``) plain mappings: each family
validates them at its own registry, and :func:`dpclip.pipeline.params.parse_params` (what every
front door reads parameters through) runs the schema and then those checks.
"""

from __future__ import annotations

import copy
from typing import Annotated, Literal

from pydantic import (BaseModel, Field, SerializeAsAny, StrictBool,
                      field_validator, model_validator)

from dpclip.errors import bad_value
from dpclip.param_types import (IID, NUMBER, Alpha, Count, Fraction, Positive, Real, Section,
                                Seed, Text, unique_list)


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
    """The keys every dataset shares. A source's own keys (the csv source's ``data.target``,
    ``data.categories`` ...) are written beside them in params.yaml and validated by that
    source's ``Options`` model at the source registry
    (:func:`dpclip.data.sources.read_sections`), which moves them into ``options``."""

    dataset: Text = "digits"  # a source of dpclip.data.sources
    path: Text | None = None
    seed: Seed = 0
    download: StrictBool = True
    # at most this many records of the dataset (and of the shadow dataset), a stratified seeded
    # subset drawn before the splits (None: all); a quicker run on a large file
    max_records: Annotated[int, Field(ge=10), NUMBER] | None = None
    shadow_dataset: Text | None = None  # a separate public dataset (a source as well)
    shadow_path: Text | None = None
    shadow_max_shared: Fraction = 0.01  # of the shadow records that may equal a main record
    split: SplitFractions = SplitFractions()
    # source -> its validated options (the data.<key> that its Options model declares)
    options: dict[str, dict] = {}

    def as_written(self) -> dict:
        """The section as params.yaml writes it: the shared keys and the own keys of the
        sources it names (``data.target``, not ``data.options.csv.target``)."""
        out = self.model_dump(exclude={"options"})
        for name in (self.dataset, self.shadow_dataset):
            out.update(self.options.get(name) or {})
        return out


class PartitionParams(Section):
    alphas: unique_list(Alpha) = [IID]


class PrivacyParams(Section):
    target_epsilons: unique_list(Positive) = [8.0]
    delta: Annotated[float, Field(gt=0, lt=1), NUMBER] = 1e-5
    accountant: Literal["rdp", "prv"] = "rdp"
    epsilon_tolerance: Positive = 0.01
    secure_noise: StrictBool = False  # OS-entropy noise, never stored: for a released model
    # runs of one seed share batches and noise (sharper paired comparisons); their models
    # must never be released together: the noise cancels in their difference
    common_random_numbers: StrictBool = False

    @model_validator(mode="after")
    def _shared_noise_is_not_secure(self):
        if self.common_random_numbers and self.secure_noise:
            raise ValueError("common_random_numbers: true shares one seed's noise across "
                             "runs, which secure_noise: true (fresh entropy for every run) "
                             "rules out; set one of them to false")
        return self


class EarlyStopping(Section):
    rule: Literal[("none",) + EARLY_STOPPING_RULES] = "none"
    window: Annotated[int, Field(ge=2), NUMBER] = 5  # epochs
    threshold: Real = 0.0  # T_s (slope) or tau (linear_trend)


BUILT_IN_MODELS = ("mlp", "cnn", "paper_cnn", "resnet")


class TrainParams(Section):
    methods: unique_list(str) = ["non_private", "dp_sgd"]
    # mlp | cnn | paper_cnn | resnet, or a model of your own: path/to/file.py:factory (relative to the
    # project root) or package.module:factory, factory(feature_shape, n_classes) -> nn.Module
    model: str = "mlp"
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

    @field_validator("model")
    @classmethod
    def _built_in_or_a_factory(cls, value: str) -> str:
        if value in BUILT_IN_MODELS:
            return value
        where, colon, factory = value.rpartition(":")
        if not colon or not where or not factory.isidentifier():
            raise ValueError(f"{value!r} is not one of {list(BUILT_IN_MODELS)} nor a model "
                             f"of your own, path/to/file.py:factory or package.module:factory")
        return value


class EvaluateParams(Section):
    ece_bins: Count = 15
    ir_attack: StrictBool = True  # layer-wise membership inference on representations
    # also score each layer's classifier on the records it was fitted on (the LM-DP-SGD
    # paper's protocol), reported beside the held-out score as peak_ir_mia_train
    ir_train_scoring: StrictBool = False

    @model_validator(mode="after")
    def _train_scoring_needs_the_attack(self):
        if self.ir_train_scoring and not self.ir_attack:
            raise ValueError("ir_train_scoring: true scores the layer-wise attack, which "
                             "ir_attack: false turns off")
        return self


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
    # true: the learning rate and C searched on dp_sgd at each target epsilon and given to every
    # other private method, which searches only its own knobs (one schedule for all methods)
    shared: StrictBool = False
    # what a trial on the public records keeps of the run: "epochs" its batch size and epochs
    # (the noise then reaches the target epsilon at the public records' q); "steps" its batch
    # size, number of steps and noise multiplier (those of a run on tune.members records)
    match: Literal["epochs", "steps"] = "epochs"
    # match "steps": the members of the run whose steps a trial takes (None: the members
    # split's size, the IID run's; a Dirichlet partition trains on a subset of it)
    members: Count | None = None

    @model_validator(mode="after")
    def _ranges_increase(self):
        problems = [bad_value(f"tune.{key}", getattr(self, key), "must be [low, high] with "
                              "low < high") for key in ("lr", "clip_norm")
                    if getattr(self, key)[0] >= getattr(self, key)[1]]
        if self.members is not None and self.match != "steps":
            problems.append(bad_value("tune.members", self.members, "is read only with "
                                      "tune.match: steps (leave it null)"))
        if problems:
            raise ValueError("\n".join(problems))
        return self


class TrackingParams(Section):
    private_diagnostics: StrictBool = False  # MLflow also gets train_loss and batch_size
    # how MLflow stores each model: pt2 (torch.export: loads without dpclip and without
    # unpickling code) or pickle (quicker to log; MLflow warns it can run code on load)
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
    # method -> its options, validated by the method's own model (dpclip.methods.base)
    methods: dict[str, SerializeAsAny[BaseModel]] = {}

    def to_dict(self) -> dict:
        return self.model_dump()

    def method_options(self, method: str) -> BaseModel | None:
        """The validated options of one method (its section of ``methods:``); None when the
        parameters were not read through :func:`dpclip.pipeline.params.parse_params` (the
        method's defaults then apply)."""
        return self.methods.get(method)


def option_values(options: BaseModel | None) -> dict:
    """A method's validated options as plain values (what records and fingerprints hold)."""
    return {} if options is None else options.model_dump()


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
