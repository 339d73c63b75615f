"""Typed, validated parameters read from ``params.yaml``.

Every stage, the CLI and the Prefect flows read parameters through :func:`load_params`, so a
bad value fails the same way whichever front door started the run: before any work, with one
message that lists every bad key and its value.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from dpclip.errors import ConfigError, DpclipError, bad_value

DATASETS = ("digits", "mnist", "fashion-mnist", "cifar10", "csv")
MODELS = ("mlp", "cnn")
ACCOUNTANTS = ("rdp", "prv")
OPTIMIZERS = ("sgd", "adam")
DEVICES = ("auto", "cpu", "cuda")
IID = "iid"


@dataclass(frozen=True)
class SplitFractions:
    """Fractions of the dataset given to each split; they must sum to 1.

    When a separate public shadow dataset is configured, the shadow fractions apply to it and
    the target fractions are renormalised over the main dataset.
    """

    target_train: float = 0.4
    target_holdout: float = 0.2
    shadow_train: float = 0.2
    shadow_holdout: float = 0.2


@dataclass(frozen=True)
class DataParams:
    dataset: str = "digits"
    path: str | None = None
    seed: int = 0
    download: bool = True
    # CSV options
    target: str | None = None
    columns: list[str] | None = None
    numeric_columns: list[str] | None = None
    categorical_columns: list[str] | None = None
    missing_values: list[str] = field(default_factory=lambda: ["", "?", "NA", "NaN", "nan"])
    # separate public dataset for the shadow splits (e.g. fashion-mnist beside mnist)
    shadow_dataset: str | None = None
    shadow_path: str | None = None
    # the largest fraction of the shadow dataset's records that may equal a main record
    shadow_max_shared: float = 0.01
    # csv: the public schema, {column: [levels]}; the target column's entry is the class list.
    # Columns not named take their levels from the public rows; unseen levels map to "other".
    categories: dict[str, list[str]] | None = None
    split: SplitFractions = field(default_factory=SplitFractions)


@dataclass(frozen=True)
class PartitionParams:
    alphas: list[Any] = field(default_factory=lambda: [IID])


@dataclass(frozen=True)
class PrivacyParams:
    target_epsilons: list[float] = field(default_factory=lambda: [8.0])
    delta: float = 1e-5
    accountant: str = "rdp"
    epsilon_tolerance: float = 0.01
    # true: privacy noise (sampling, gradient and query noise, masks) seeded from the operating
    # system's entropy, never stored: the setting for a model that will be released
    secure_noise: bool = False


@dataclass(frozen=True)
class TrainParams:
    methods: list[str] = field(default_factory=lambda: ["non_private", "dp_sgd"])
    model: str = "mlp"
    hidden: list[int] = field(default_factory=lambda: [128, 64])
    seeds: list[int] = field(default_factory=lambda: [0])
    epochs: int = 30
    batch_size: int = 64
    optimizer: str = "sgd"
    lr: float = 0.5
    momentum: float = 0.0
    clip_norm: float = 1.0
    device: str = "auto"
    checkpoint_every: int = 5
    # stop when the released per-epoch std series settles (sanitize; see train/early_stopping)
    early_stopping: dict = field(default_factory=lambda: {"rule": "none", "window": 5,
                                                          "threshold": 0.0})


@dataclass(frozen=True)
class EvaluateParams:
    ece_bins: int = 15
    ir_attack: bool = True  # layer-wise membership inference on intermediate representations


@dataclass(frozen=True)
class ShadowParams:
    """The shadow model (target architecture, non-private, on the public shadow train split)
    whose per-layer membership attacks estimate each layer's risk ER^(l)."""

    epochs: int = 30
    batch_size: int = 64
    risk_eval: str = "cv"  # cv: held-out folds | train: the paper's literal protocol
    alpha: Any = IID  # Dirichlet label skew of the shadow train split (transfer tests)
    seed: int = 0


@dataclass(frozen=True)
class AttackParams:
    """Per-layer membership classifiers, for the shadow risk and the IR-level evaluation."""

    classifier: str = "logistic"  # logistic | gbdt
    folds: int = 5
    max_features: int = 512  # convolutional maps are average-pooled to at most this many
    max_records: int = 2000  # members (and as many non-members) per attack


@dataclass(frozen=True)
class TrackingParams:
    # true: also log to MLflow the per-step values computed from the private batch without
    # noise (train_loss, batch_size); they stay in the local trace either way
    private_diagnostics: bool = False


@dataclass(frozen=True)
class ScheduleParams:
    cron: str = "0 3 * * *"
    timezone: str = "UTC"


@dataclass(frozen=True)
class Params:
    data: DataParams = field(default_factory=DataParams)
    partition: PartitionParams = field(default_factory=PartitionParams)
    privacy: PrivacyParams = field(default_factory=PrivacyParams)
    train: TrainParams = field(default_factory=TrainParams)
    evaluate: EvaluateParams = field(default_factory=EvaluateParams)
    shadow: ShadowParams = field(default_factory=ShadowParams)
    attack: AttackParams = field(default_factory=AttackParams)
    schedule: ScheduleParams = field(default_factory=ScheduleParams)
    tracking: TrackingParams = field(default_factory=TrackingParams)
    methods: dict = field(default_factory=dict)  # options_key -> {option: value}

    def to_dict(self) -> dict:
        return asdict(self)

    def method_options(self, method: str) -> dict:
        """The validated options of one method (its section of ``methods:``)."""
        from dpclip.methods import get_method

        key = get_method(method).options_key
        return dict(self.methods.get(key, {})) if key else {}


# ---------------------------------------------------------------------------------------------
# Reading raw YAML values into typed fields. Each reader appends to `problems` instead of
# raising, so one run reports every bad key at once.


class _Reader:
    def __init__(self, raw: dict, prefix: str, problems: list[str]):
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            problems.append(bad_value(prefix, raw, "must be a mapping of keys"))
            raw = {}
        self.raw, self.prefix, self.problems = raw, prefix, problems
        self.known: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}"

    def get(self, name: str, default):
        self.known.add(name)
        return self.raw.get(name, default)

    def number(self, name, default, *, integer=False, low=None, high=None,
               low_open=False, high_open=False):
        value = self.get(name, default)
        return self._check_number(self.key(name), value, default, integer, low, high,
                                  low_open, high_open)

    def _check_number(self, key, value, default, integer, low, high, low_open, high_open):
        kind = "an integer" if integer else "a number"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            # YAML reads 1e-5 (no dot) as a string; accept numeric strings.
            try:
                value = float(value) if not integer else int(str(value))
            except (TypeError, ValueError):
                self.problems.append(bad_value(key, value, f"must be {kind}"))
                return default
        if integer and isinstance(value, float):
            if not value.is_integer():
                self.problems.append(bad_value(key, value, "must be an integer"))
                return default
            value = int(value)
        if isinstance(value, float) and not math.isfinite(value):
            self.problems.append(bad_value(key, value, "must be finite"))
            return default
        if low is not None and (value < low or (low_open and value == low)):
            self.problems.append(bad_value(key, value, f"must be {'>' if low_open else '>='} {low}"))
            return default
        if high is not None and (value > high or (high_open and value == high)):
            self.problems.append(bad_value(key, value, f"must be {'<' if high_open else '<='} {high}"))
            return default
        return value

    def choice(self, name, default, choices, *, optional=False):
        value = self.get(name, default)
        if optional and value is None:
            return None
        if value not in choices:
            self.problems.append(bad_value(self.key(name), value, f"is not one of {list(choices)}"))
            return default
        return value

    def boolean(self, name, default):
        value = self.get(name, default)
        if not isinstance(value, bool):
            self.problems.append(bad_value(self.key(name), value, "must be true or false"))
            return default
        return value

    def text(self, name, default, *, optional=True):
        value = self.get(name, default)
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value:
            self.problems.append(bad_value(self.key(name), value, "must be a non-empty string"))
            return default
        return value

    def text_list(self, name, default, *, optional=True):
        value = self.get(name, default)
        if value is None and optional:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.problems.append(bad_value(self.key(name), value, "must be a list of strings"))
            return default
        return list(value)

    def number_list(self, name, default, *, integer=False, low=None, low_open=False,
                    non_empty=True):
        value = self.get(name, default)
        if not isinstance(value, list):
            value = [value]
        if non_empty and not value:
            self.problems.append(bad_value(self.key(name), value, "must not be empty"))
            return default
        out = []
        for item in value:
            checked = self._check_number(self.key(name), item, None, integer, low, None,
                                         low_open, False)
            if checked is not None:
                out.append(checked)
        if len(set(out)) != len(out):
            self.problems.append(bad_value(self.key(name), value, "has repeated values"))
        return out if len(out) == len(value) else default

    def sub(self, name) -> "_Reader":
        self.known.add(name)
        return _Reader(self.raw.get(name), self.key(name), self.problems)

    def finish(self):
        for name in sorted(set(self.raw) - self.known):
            self.problems.append(bad_value(self.key(name), self.raw[name], "is not a known key"))


def _read_split(r: _Reader) -> SplitFractions:
    d = SplitFractions()
    fr = SplitFractions(**{name: r.number(name, getattr(d, name), low=0.0, high=1.0)
                           for name in ("target_train", "target_holdout", "shadow_train",
                                        "shadow_holdout")})
    total = fr.target_train + fr.target_holdout + fr.shadow_train + fr.shadow_holdout
    if abs(total - 1.0) > 1e-6:
        r.problems.append(bad_value(r.prefix, asdict(fr), f"fractions sum to {total:g}, not 1"))
    for name in ("target_train", "target_holdout"):
        if getattr(fr, name) <= 0:
            r.problems.append(bad_value(r.key(name), getattr(fr, name), "must be > 0"))
    r.finish()
    return fr


def _read_data(r: _Reader) -> DataParams:
    d = DataParams()
    data = DataParams(
        dataset=r.choice("dataset", d.dataset, DATASETS),
        path=r.text("path", d.path),
        seed=r.number("seed", d.seed, integer=True, low=0),
        download=r.boolean("download", d.download),
        target=r.text("target", d.target),
        columns=r.text_list("columns", d.columns),
        numeric_columns=r.text_list("numeric_columns", d.numeric_columns),
        categorical_columns=r.text_list("categorical_columns", d.categorical_columns),
        missing_values=r.text_list("missing_values", d.missing_values, optional=False),
        shadow_dataset=r.choice("shadow_dataset", d.shadow_dataset, DATASETS, optional=True),
        shadow_path=r.text("shadow_path", d.shadow_path),
        shadow_max_shared=r.number("shadow_max_shared", d.shadow_max_shared, low=0, high=1),
        categories=_read_categories(r),
        split=_read_split(r.sub("split")),
    )
    if data.dataset == "csv" and data.path is None:
        r.problems.append(bad_value("data.path", None, "is required when data.dataset is 'csv'"))
    if data.dataset == "csv" and data.target is None:
        r.problems.append(bad_value("data.target", None,
                                    "is required when data.dataset is 'csv' (the label column)"))
    if data.dataset == "cifar10" and data.path is None:
        r.problems.append(bad_value("data.path", None,
                                    "is required for cifar10 (folder of python pickle batches)"))
    if data.shadow_dataset in ("csv", "cifar10") and data.shadow_path is None:
        r.problems.append(bad_value("data.shadow_path", None,
                                    f"is required when data.shadow_dataset is "
                                    f"{data.shadow_dataset!r}"))
    r.finish()
    return data


def _read_categories(r: _Reader) -> dict[str, list[str]] | None:
    """``data.categories``: {column: [level, ...]}, levels written as text."""
    value = r.get("categories", None)
    if value is None:
        return None
    ok = isinstance(value, dict) and all(
        isinstance(col, str) and isinstance(levels, list) and levels
        and all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in levels)
        for col, levels in value.items())
    if not ok:
        r.problems.append(bad_value("data.categories", value,
                                    "must map each column name to a non-empty list of levels"))
        return None
    out = {col: [str(v) for v in levels] for col, levels in value.items()}
    for col, levels in out.items():
        if len(set(levels)) != len(levels):
            r.problems.append(bad_value(f"data.categories.{col}", value[col],
                                        "has repeated levels"))
    return out


def _read_alphas(r: _Reader) -> list:
    value = r.get("alphas", [IID])
    if not isinstance(value, list):
        value = [value]
    if not value:
        r.problems.append(bad_value("partition.alphas", value, "must not be empty"))
        return [IID]
    out = []
    for a in value:
        if a == IID:
            out.append(IID)
            continue
        ok = isinstance(a, (int, float)) and not isinstance(a, bool) and math.isfinite(a) \
            and a > 0
        if not ok:
            r.problems.append(bad_value("partition.alphas", a,
                                        "must be 'iid' or a Dirichlet concentration > 0"))
            continue
        out.append(a)  # kept as written (0.5, 1): its text names the partition's folder
    if len({alpha_tag(a) for a in out}) != len(out):
        r.problems.append(bad_value("partition.alphas", value, "has repeated values"))
    r.finish()
    return out


def _read_privacy(r: _Reader) -> PrivacyParams:
    d = PrivacyParams()
    p = PrivacyParams(
        target_epsilons=r.number_list("target_epsilons", d.target_epsilons, low=0.0,
                                      low_open=True),
        delta=r.number("delta", d.delta, low=0.0, high=1.0, low_open=True, high_open=True),
        accountant=r.choice("accountant", d.accountant, ACCOUNTANTS),
        epsilon_tolerance=r.number("epsilon_tolerance", d.epsilon_tolerance, low=0.0,
                                   low_open=True),
        secure_noise=r.boolean("secure_noise", d.secure_noise),
    )
    r.finish()
    return p


def _read_train(r: _Reader) -> TrainParams:
    from dpclip.methods import available_methods  # late import: methods import config

    d = TrainParams()
    methods = r.get("methods", d.methods)
    known_methods = available_methods()
    if not isinstance(methods, list) or not methods:
        r.problems.append(bad_value("train.methods", methods, "must be a non-empty list"))
        methods = d.methods
    for m in methods:
        if m not in known_methods:
            r.problems.append(bad_value("train.methods", m, f"is not one of {known_methods}"))
    if len(set(map(str, methods))) != len(methods):
        r.problems.append(bad_value("train.methods", methods, "has repeated values"))
    t = TrainParams(
        methods=[m for m in methods if m in known_methods] or d.methods,
        model=r.choice("model", d.model, MODELS),
        hidden=r.number_list("hidden", d.hidden, integer=True, low=1, non_empty=False),
        seeds=r.number_list("seeds", d.seeds, integer=True, low=0),
        epochs=r.number("epochs", d.epochs, integer=True, low=1),
        batch_size=r.number("batch_size", d.batch_size, integer=True, low=1),
        optimizer=r.choice("optimizer", d.optimizer, OPTIMIZERS),
        lr=r.number("lr", d.lr, low=0.0, low_open=True),
        momentum=r.number("momentum", d.momentum, low=0.0, high=1.0, high_open=True),
        clip_norm=r.number("clip_norm", d.clip_norm, low=0.0, low_open=True),
        device=r.choice("device", d.device, DEVICES),
        checkpoint_every=r.number("checkpoint_every", d.checkpoint_every, integer=True, low=1),
        early_stopping=_read_early_stopping(r.sub("early_stopping"), d.early_stopping),
    )
    r.finish()
    return t


def _read_early_stopping(r: _Reader, default: dict) -> dict:
    from dpclip.train.early_stopping import RULES

    out = {"rule": r.choice("rule", default["rule"], ("none",) + RULES),
           "window": r.number("window", default["window"], integer=True, low=2),
           "threshold": r.number("threshold", default["threshold"])}
    r.finish()
    return out


def _read_evaluate(r: _Reader) -> EvaluateParams:
    d = EvaluateParams()
    e = EvaluateParams(ece_bins=r.number("ece_bins", d.ece_bins, integer=True, low=1),
                       ir_attack=r.boolean("ir_attack", d.ir_attack))
    r.finish()
    return e


def _read_shadow(r: _Reader) -> ShadowParams:
    from dpclip.attacks.layerwise import RISK_EVALS

    d = ShadowParams()
    alpha = r.get("alpha", d.alpha)
    if alpha != IID and not (isinstance(alpha, (int, float)) and not isinstance(alpha, bool)
                             and math.isfinite(alpha) and alpha > 0):
        r.problems.append(bad_value("shadow.alpha", alpha,
                                    "must be 'iid' or a Dirichlet concentration > 0"))
        alpha = d.alpha
    s = ShadowParams(epochs=r.number("epochs", d.epochs, integer=True, low=1),
                     batch_size=r.number("batch_size", d.batch_size, integer=True, low=1),
                     risk_eval=r.choice("risk_eval", d.risk_eval, RISK_EVALS), alpha=alpha,
                     seed=r.number("seed", d.seed, integer=True, low=0))
    r.finish()
    return s


def _read_attack(r: _Reader) -> AttackParams:
    from dpclip.attacks.layerwise import CLASSIFIERS

    d = AttackParams()
    a = AttackParams(classifier=r.choice("classifier", d.classifier, CLASSIFIERS),
                     folds=r.number("folds", d.folds, integer=True, low=2),
                     max_features=r.number("max_features", d.max_features, integer=True, low=1),
                     max_records=r.number("max_records", d.max_records, integer=True, low=2))
    r.finish()
    return a


def _read_tracking(r: _Reader) -> TrackingParams:
    d = TrackingParams()
    t = TrackingParams(private_diagnostics=r.boolean("private_diagnostics",
                                                     d.private_diagnostics))
    r.finish()
    return t


def _read_schedule(r: _Reader) -> ScheduleParams:
    d = ScheduleParams()
    cron = r.text("cron", d.cron, optional=False)
    if isinstance(cron, str) and len(cron.split()) != 5:
        r.problems.append(bad_value("schedule.cron", cron,
                                    "must be a cron expression with 5 fields"))
    s = ScheduleParams(cron=cron, timezone=r.text("timezone", d.timezone, optional=False))
    r.finish()
    return s


def _read_method_options(r: _Reader, layer_names: list[str]) -> dict:
    """``methods.<key>.<option>`` for every registered method that declares options."""
    from dpclip.methods.base import REGISTRY

    out: dict[str, dict] = {}
    # a class that declares the options reads a shared section first (adaclip, not
    # adaclip_opacus, which reuses it)
    for cls in sorted(REGISTRY.values(), key=lambda c: -len(c.OPTIONS)):
        key = cls.options_key
        if not key or key in out:
            continue
        section = r.sub(key)
        values = {}
        for name, opt in cls.OPTIONS.items():
            if opt.choices is not None:
                values[name] = section.choice(name, opt.default, opt.choices)
            elif isinstance(opt.default, bool):
                values[name] = section.boolean(name, opt.default)
            elif isinstance(opt.default, str) or opt.default is None:
                values[name] = section.text(name, opt.default)
            else:
                values[name] = section.number(name, opt.default, integer=opt.integer,
                                              low=opt.low, high=opt.high,
                                              low_open=opt.low_open, high_open=opt.high_open)
        section.finish()
        check = getattr(cls, "check_options", None)
        if check is not None:
            r.problems.extend(check(values, f"{r.prefix}.{key}", layer_names))
        out[key] = values
    r.finish()
    return out


def parse_params(raw: dict | None) -> Params:
    """Validate a raw parameter mapping; raise :class:`ConfigError` listing every bad key."""
    problems: list[str] = []
    root = _Reader(raw or {}, "", problems)
    root.key = lambda name: name  # top-level keys have no prefix
    params = Params(
        data=_read_data(root.sub("data")),
        partition=PartitionParams(alphas=_read_alphas(root.sub("partition"))),
        privacy=_read_privacy(root.sub("privacy")),
        train=_read_train(root.sub("train")),
        evaluate=_read_evaluate(root.sub("evaluate")),
        shadow=_read_shadow(root.sub("shadow")),
        attack=_read_attack(root.sub("attack")),
        schedule=_read_schedule(root.sub("schedule")),
        tracking=_read_tracking(root.sub("tracking")),
        methods={},
    )
    if not problems:  # layer names need a valid train section
        from dpclip.models import layer_names

        methods = _read_method_options(root.sub("methods"),
                                       layer_names(params.train.model, params.train.hidden))
        params = replace(params, methods=methods)
    root.known.add("methods")
    root.finish()
    if problems:
        raise ConfigError(problems)
    return params


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate ``params.yaml``."""
    path = Path(path)
    if not path.exists():
        raise DpclipError(f"parameter file {str(path)!r} does not exist")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise DpclipError(f"parameter file {str(path)!r} is not valid YAML: {exc}") from exc
    return parse_params(raw)


# ---------------------------------------------------------------------------------------------
# Run identity: (dataset, method, target epsilon, alpha, seed) -> a file-safe name.


def alpha_tag(alpha) -> str:
    """The partition's name in paths: 'iid', or the concentration as written ('0.5')."""
    return str(alpha)


def parse_scalar(text: str):
    """Read a CLI value the way YAML (and DVC's ${...} interpolation) wrote it: '8' -> 8."""
    return yaml.safe_load(str(text))


def epsilon_tag(epsilon) -> str:
    return f"eps{epsilon}"


def run_name(method: str, epsilon, alpha, seed: int) -> str:
    """The run's identity, e.g. ``dp_sgd-eps8-iid-seed0`` (the metrics contract).

    Values are written as YAML wrote them (``target_epsilons: [8]`` gives ``eps8``), which is
    also how dvc.yaml's ${item.*} interpolation spells the output paths.
    """
    return f"{method}-{epsilon_tag(epsilon)}-{alpha_tag(alpha)}-seed{int(seed)}"
