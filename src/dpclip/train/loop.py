"""The training loop: Poisson sampling, device choice, the budget guard, the per-step trace.

Private methods: each step samples a Poisson batch (every record independently with
probability q = B / N, Opacus's ``UniformWithReplacementSampler``), asks the budget guard, and
runs the shared DP step. An empty batch skips the update and the controller but still counts as
a step for the accountant. Non-private training uses shuffled minibatches of size B.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from opacus import GradSampleModule
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from torch import nn
from tqdm.auto import tqdm

from dpclip.errors import DpclipError
from dpclip.methods import get_method
from dpclip.models import build_model
from dpclip.privacy import BudgetGuard, epsilon_of, noise_for_epsilon, split_sigma
from dpclip.train.step import LayerGroups, dp_step, plain_step

# PRV epsilon costs ~0.5 s a call: the trace samples it at about this many steps per run.
PRV_TRACE_POINTS = 50


@dataclass(frozen=True)
class TrainConfig:
    method: str
    target_epsilon: float | None
    delta: float
    accountant: str
    epochs: int
    batch_size: int
    lr: float
    optimizer: str
    momentum: float
    clip_norm: float
    seed: int
    device: str
    model: str
    hidden: tuple[int, ...]
    epsilon_tolerance: float = 0.01


@dataclass
class TrainResult:
    model: nn.Module
    trace: list[dict]
    privacy: dict
    time: dict
    training: dict = field(default_factory=dict)


def resolve_device(choice: str) -> torch.device:
    """``auto`` takes a GPU when one is present; ``cuda`` without one is an error."""
    if choice == "cuda" and not torch.cuda.is_available():
        raise DpclipError("train.device: 'cuda' was asked for but no CUDA GPU is available")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(choice)


def make_optimizer(cfg: TrainConfig, params) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum)


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % (2 ** 32))


def plan_steps(n_records: int, batch_size: int, epochs: int) -> tuple[float, int, int]:
    """(q, steps per epoch, total steps T) for Poisson sampling with expected batch B."""
    if batch_size > n_records:
        raise DpclipError(f"train.batch_size: {batch_size} is larger than the training set "
                          f"({n_records} records)")
    q = batch_size / n_records
    steps_per_epoch = max(1, int(1 / q))  # Opacus's sampler default: one pass in expectation
    return q, steps_per_epoch, epochs * steps_per_epoch


def build_run(feature_shape: tuple[int, ...], n_classes: int, n_records: int,
              cfg: TrainConfig) -> "_Run":
    """Seed, build the model and method, plan the steps, and (private) find the noise."""
    method_cls = get_method(cfg.method)
    seed_everything(cfg.seed)
    device = resolve_device(cfg.device)
    model = build_model(cfg.model, feature_shape, n_classes, list(cfg.hidden)).to(device)
    q, steps_per_epoch, total_steps = plan_steps(n_records, cfg.batch_size, cfg.epochs)
    groups = LayerGroups.of(model)
    method = method_cls(cfg.clip_norm, groups.names)
    runner = _PrivateRun if method_cls.private else _PlainRun
    return runner(model, groups, method, cfg, q, steps_per_epoch, total_steps, device,
                  nn.CrossEntropyLoss(reduction="none"))


def train_model(x: np.ndarray, y: np.ndarray, feature_shape: tuple[int, ...], n_classes: int,
                cfg: TrainConfig, *, progress: bool = True, desc: str = "") -> TrainResult:
    """Train one configuration and return the model, its trace and its privacy record."""
    run = build_run(feature_shape, n_classes, len(x), cfg)
    x_t = torch.as_tensor(x, dtype=torch.float32, device=run.device)
    y_t = torch.as_tensor(y, dtype=torch.int64, device=run.device)
    started = time.perf_counter()
    run.fit(x_t, y_t, progress=progress, desc=desc or cfg.method)
    train_s = time.perf_counter() - started
    step_times = np.array(run.step_times) if run.step_times else np.zeros(1)
    return TrainResult(
        model=run.plain_model().cpu(), trace=run.trace, privacy=run.privacy_record(),
        time={"train_s": round(train_s, 4), "step_s_median": float(np.median(step_times)),
              "device": str(run.device)},
        training={"epochs_planned": cfg.epochs, "steps_planned": run.total_steps,
                  "steps_per_epoch": run.steps_per_epoch, "n_train": int(len(x)),
                  "stopped_by_budget": run.stopped_by_budget},
    )


class _Run:
    """State shared by private and plain runs: optimizer, generators, trace."""

    def __init__(self, model, groups, method, cfg, q, steps_per_epoch, total_steps, device,
                 loss_fn):
        self.model, self.groups, self.method, self.cfg = model, groups, method, cfg
        self.q, self.steps_per_epoch, self.total_steps = q, steps_per_epoch, total_steps
        self.device, self.loss_fn = device, loss_fn
        self.sample_gen = torch.Generator().manual_seed(cfg.seed * 7919 + 1)
        self.noise_gen = torch.Generator(device=device).manual_seed(cfg.seed * 7919 + 2)
        self.optimizer = make_optimizer(cfg, groups.flat())
        self.trace: list[dict] = []
        self.step_times: list[float] = []
        self.stopped_by_budget = False

    def plain_model(self) -> nn.Module:
        """The trained network without Opacus's per-sample-gradient wrapper."""
        return self.model._module if isinstance(self.model, GradSampleModule) else self.model

    def _bar(self, progress: bool, desc: str):
        return tqdm(total=self.total_steps, desc=desc, disable=not progress, leave=False,
                    unit="step", dynamic_ncols=True, mininterval=0.5)

    def _show(self, bar, step: int, **postfix) -> None:
        """Advance the bar; refresh its numbers about 100 times a run, not every step."""
        bar.update(1)
        if step % max(1, self.total_steps // 100) == 0 or step == self.total_steps:
            bar.set_postfix(postfix, refresh=False)


class _PlainRun(_Run):
    """Non-private: shuffled minibatches, mean loss, no clipping, no noise."""

    def fit(self, x, y, *, progress, desc):
        n, b = len(x), self.cfg.batch_size
        step = 0
        with self._bar(progress, desc) as bar:
            for epoch in range(1, self.cfg.epochs + 1):
                order = torch.randperm(n, generator=self.sample_gen).to(self.device)
                for k in range(self.steps_per_epoch):
                    idx = order[k * b:(k + 1) * b] if (k + 1) * b <= n else order[-b:]
                    step += 1
                    tic = time.perf_counter()
                    loss = plain_step(self.model, self.loss_fn, x[idx], y[idx], self.optimizer)
                    self.step_times.append(time.perf_counter() - tic)
                    self.trace.append({"step": step, "epoch": epoch, "batch_size": len(idx),
                                       "clip_threshold": float("nan"), "train_loss": loss,
                                       "epsilon_spent": float("nan")})
                    self._show(bar, step, epoch=epoch, loss=f"{loss:.3f}")

    def privacy_record(self) -> dict:
        return {"dp_guarantee": False, "accountant": None, "target_epsilon": None,
                "epsilon": None, "delta": self.cfg.delta, "sample_rate": self.q,
                "noise_multiplier": 0.0, "sigma_train": 0.0, "steps": len(self.trace)}


class _PrivateRun(_Run):
    """DP run: Poisson batches, the shared DP step, accounting and the budget guard."""

    def __init__(self, *args):
        super().__init__(*args)
        cfg = self.cfg
        self.sigma_eff = noise_for_epsilon(cfg.target_epsilon, cfg.delta, self.q,
                                           self.total_steps, cfg.accountant,
                                           cfg.epsilon_tolerance)
        self.extras = self.method.extra_queries(self.sigma_eff)
        self.sigma_train = split_sigma(self.sigma_eff, self.extras)
        self.guard = BudgetGuard(cfg.accountant, cfg.delta, cfg.target_epsilon)
        self.model = GradSampleModule(self.model, batch_first=True, loss_reduction="sum")
        trace_every = 1 if cfg.accountant == "rdp" else max(1, self.total_steps // PRV_TRACE_POINTS)
        self.trace_every = trace_every

    def fit(self, x, y, *, progress, desc):
        sampler = UniformWithReplacementSampler(num_samples=len(x), sample_rate=self.q,
                                                generator=self.sample_gen,
                                                steps=self.steps_per_epoch)
        with self._bar(progress, desc) as bar:
            for epoch in range(1, self.cfg.epochs + 1):
                for batch in sampler:
                    if not self.guard.allows(self.sigma_eff, self.q,
                                             horizon=self.total_steps - self.guard.steps):
                        self.stopped_by_budget = True
                        return
                    row = self.step(x, y, batch, epoch)
                    self._show(bar, row["step"], epoch=epoch, loss=f"{row['train_loss']:.3f}",
                               C=f"{row['clip_threshold']:.3g}",
                               eps="-" if math.isnan(row["epsilon_spent"])
                               else f"{row['epsilon_spent']:.2f}")

    def step(self, x, y, batch, epoch: int) -> dict:
        """One accounted step on Poisson batch ``batch`` (record indices); returns its trace row.

        An empty batch counts for the accountant but changes neither the weights nor the
        method's state.
        """
        self.guard.record(self.sigma_eff, self.q)
        step = self.guard.steps
        clip = self.method.clip_threshold
        loss = float("nan")
        if len(batch) > 0:
            idx = torch.as_tensor(batch, device=self.device)
            tic = time.perf_counter()
            loss, _ = dp_step(self.model, self.groups, self.loss_fn, x[idx], y[idx],
                              self.method, self.sigma_train, self.q * len(x), self.optimizer,
                              self.noise_gen, step)
            self.step_times.append(time.perf_counter() - tic)
        row = {"step": step, "epoch": epoch, "batch_size": len(batch), "clip_threshold": clip,
               "train_loss": loss, "epsilon_spent": self._epsilon_for_trace(step),
               **self.method.trace_row()}
        self.trace.append(row)
        return row

    def _epsilon_for_trace(self, step: int) -> float:
        if step % self.trace_every == 0 or step == self.total_steps:
            return self.guard.epsilon()
        return float("nan")

    def privacy_record(self) -> dict:
        steps = self.guard.steps
        return {"dp_guarantee": bool(self.method.dp_guarantee), "accountant": self.cfg.accountant,
                "target_epsilon": self.cfg.target_epsilon,
                "epsilon": epsilon_of(self.cfg.accountant, self.guard.history, self.cfg.delta),
                "delta": self.cfg.delta, "sample_rate": self.q,
                "noise_multiplier": self.sigma_eff, "sigma_train": self.sigma_train,
                "steps": steps,
                **{f"sigma_{e.name}": e.noise_std for e in self.extras}}
