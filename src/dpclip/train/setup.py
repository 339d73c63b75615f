"""What every run kind shares before it starts: the loop's configuration and result types, the
device, the optimizer, seeding, and the plan of Poisson steps."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np
import torch
from pydantic import BaseModel
from torch import nn

from dpclip.config import PrivacyParams, TrainParams, option_values
from dpclip.errors import DpclipError
from dpclip.methods import get_method


@dataclass(frozen=True)
class TrainConfig:
    """One run: the method, its target epsilon and seed, and the validated ``train`` and
    ``privacy`` sections it reads (the fields are declared once, in :mod:`dpclip.config`)."""

    method: str
    target_epsilon: float | None
    seed: int
    train: TrainParams
    privacy: PrivacyParams
    # params.yaml methods.<method>, validated by the method's options model (None: defaults)
    method_options: BaseModel | None = None
    shadow_risk: dict | None = None  # the shadow stage's risk record, for methods that need it
    # the Poisson rate q when it is not train.batch_size / n: a reference model trained with
    # another run's q (so its steps and noise match that run's) on a set of another size
    sample_rate: float | None = None
    # what the run's records are, beyond this configuration (the pipeline's dataset and
    # partition): part of the key its noise is drawn from (stream_key)
    data_label: str = ""

    @classmethod
    def of(cls, method: str, target_epsilon: float | None, seed: int = 0, *,
           method_options: dict | BaseModel | None = None, shadow_risk: dict | None = None,
           **fields) -> "TrainConfig":
        """A run from loose ``train.*`` and ``privacy.*`` fields (validated like
        params.yaml, the method's options by its options model; tools and tests use it)."""
        train = {k: v for k, v in fields.items() if k in TrainParams.model_fields}
        privacy = {k: v for k, v in fields.items() if k in PrivacyParams.model_fields}
        unknown = set(fields) - set(train) - set(privacy)
        if unknown:
            raise TypeError(f"not train.* or privacy.* fields: {sorted(unknown)}")
        return cls(method, target_epsilon, seed, TrainParams.model_validate(train),
                   PrivacyParams.model_validate(privacy),
                   method_options if isinstance(method_options, BaseModel) or method_options is None
                   else get_method(method).parse_options(method_options),
                   shadow_risk)

    def identity(self) -> dict:
        """What makes this run this run (the checkpoint's fingerprint): the method, its target,
        seed, options and the training and privacy settings it uses, but not the matrix it
        belongs to (train.methods, train.seeds, privacy.target_epsilons) nor how often it is
        checkpointed, so growing the matrix keeps a crashed run's checkpoint usable."""
        identity = {"method": self.method, "target_epsilon": self.target_epsilon,
                    "seed": self.seed, "method_options": option_values(self.method_options),
                    "shadow_risk": self.shadow_risk,
                    "train": self.train.model_dump(exclude={"methods", "seeds",
                                                            "checkpoint_every"}),
                    "privacy": self.privacy.model_dump(exclude={"target_epsilons"})}
        if self.sample_rate is not None:  # absent otherwise: older checkpoints stay usable
            identity["sample_rate"] = self.sample_rate
        if self.data_label:
            identity["data_label"] = self.data_label
        return identity

    def stream_key(self) -> str | None:
        """The key this run's random streams are drawn from besides its seed
        (:class:`dpclip.randomness.NoiseSources`): its whole identity, so that runs differing
        in anything (method, options, epsilon, data) draw independent noise; None under
        ``privacy.common_random_numbers`` (the seed alone: runs of one seed share noise)."""
        if self.privacy.common_random_numbers:
            return None
        return repr(self.identity())

    def with_train(self, **changes) -> "TrainConfig":
        """The same run with some ``train.*`` fields changed (a method's own epochs or
        learning rate)."""
        return replace(self, train=self.train.model_copy(update=changes))


@dataclass
class TrainResult:
    model: nn.Module
    trace: list[dict]
    privacy: dict
    time: dict
    training: dict = field(default_factory=dict)
    architecture: dict = field(default_factory=dict)  # what load_model needs beyond train.*


class PublicData(NamedTuple):
    """The public data a run may use without noise: the shadow train split (x, y) and the
    shadow holdout split (a held-out check for public pre-training; None when not loaded).
    Indexing ``[0]``, ``[1]`` gives (x, y), as the plain tuple it replaces did."""

    x: np.ndarray
    y: np.ndarray
    held_out: tuple[np.ndarray, np.ndarray] | None = None


@dataclass
class RunSetup:
    """Everything a run kind's constructor receives (:func:`dpclip.train.loop.build_run`):
    the model on its device and its layer groups, the method, the configuration, the plan of
    steps, and the public (x, y) split when the run needs one."""

    model: nn.Module
    groups: object  # dpclip.train.book_keeping.LayerGroups
    method: object  # dpclip.methods.Method
    cfg: TrainConfig
    device: torch.device
    loss_fn: nn.Module
    n_records: int
    q: float
    steps_per_epoch: int
    total_steps: int
    hidden: list[int]
    public: PublicData | tuple | None = None


def resolve_device(choice: str) -> torch.device:
    """``auto`` takes a GPU when one is present; ``cuda`` without one is an error."""
    if choice == "cuda" and not torch.cuda.is_available():
        raise DpclipError("train.device: 'cuda' was asked for but no CUDA GPU is available")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(choice)


def make_optimizer(cfg: TrainConfig, params) -> torch.optim.Optimizer:
    t = cfg.train
    if t.optimizer == "adam":
        return torch.optim.Adam(params, lr=t.lr)
    return torch.optim.SGD(params, lr=t.lr, momentum=t.momentum)


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % (2 ** 32))


def plan_steps(n_records: int, batch_size: int, epochs: int,
               sample_rate: float | None = None) -> tuple[float, int, int]:
    """(q, steps per epoch, total steps T) for Poisson sampling with expected batch B, or at
    the given ``sample_rate`` q (expected batch qN)."""
    if sample_rate is not None:
        if not 0 < sample_rate <= 1:
            raise DpclipError(f"sample_rate: {sample_rate} is not in (0, 1]")
        q = float(sample_rate)
    elif batch_size > n_records:
        raise DpclipError(f"train.batch_size: {batch_size} is larger than the training set "
                          f"({n_records} records)")
    else:
        q = batch_size / n_records
    steps_per_epoch = max(1, int(1 / q))  # Opacus's sampler default: one pass in expectation
    return q, steps_per_epoch, epochs * steps_per_epoch

