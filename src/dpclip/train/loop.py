"""The training loop: Poisson sampling, device choice, the budget guard, the per-step trace.

Private methods: each step samples a Poisson batch (every record independently with
probability q = B / N, Opacus's ``UniformWithReplacementSampler``), asks the budget guard, and
runs the shared DP step. An empty batch is a full step (noise only; see ``dp_step``).
Non-private training uses shuffled minibatches of size B. Every random draw comes from the
run's :class:`~dpclip.randomness.NoiseSources`, checkpointed with the rest of the state.

The trace's ``train_loss`` and ``batch_size`` columns are computed from the private batch
without noise (:data:`PRIVATE_DIAGNOSTICS`): they stay in the local trace and reach MLflow only
when ``tracking.private_diagnostics`` asks for it.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from torch import nn
from tqdm.auto import tqdm

from dpclip.errors import DpclipError
from dpclip.io import write_with
from dpclip.methods import get_method
from dpclip.methods.base import MethodContext
from dpclip.models import build_model, count_parameters
from dpclip.privacy import (BudgetGuard, early_stop_privacy, epsilon_of, noise_for_epsilon,
                            split_sigma, stopped_epsilon)
from dpclip.randomness import NoiseSources
from dpclip.train.early_stopping import decide, public_representation_std
from dpclip.train.step import LayerGroups, dp_step, plain_step, wrap_for_dp

# Trace columns computed from the private batch without noise: local diagnostics only.
PRIVATE_DIAGNOSTICS = ("train_loss", "batch_size")

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
    secure_noise: bool = False  # privacy.secure_noise: OS-entropy seeds, never stored
    method_options: dict = field(default_factory=dict)  # params.yaml methods.<key>
    shadow_risk: dict | None = None  # the shadow stage's risk record (lm_dp_sgd)
    # rule none | slope | linear_trend, window (epochs), threshold (T_s or tau)
    early_stopping: dict = field(default_factory=lambda: {"rule": "none", "window": 5,
                                                          "threshold": 0.0})


@dataclass
class TrainResult:
    model: nn.Module
    trace: list[dict]
    privacy: dict
    time: dict
    training: dict = field(default_factory=dict)
    architecture: dict = field(default_factory=dict)  # what load_model needs beyond train.*


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
              cfg: TrainConfig, public: tuple | None = None) -> "_Run":
    """Seed, build the model and method, plan the steps, and (private) find the noise.
    ``public``: the public (x, y) a method may need (``Method.needs_public_data``)."""
    method_cls = get_method(cfg.method)
    seed_everything(cfg.seed)
    device = resolve_device(cfg.device)
    hidden = method_cls.model_hidden(dict(cfg.method_options), cfg.hidden)
    model = build_model(cfg.model, feature_shape, n_classes, hidden).to(device)
    q, steps_per_epoch, total_steps = plan_steps(n_records, cfg.batch_size, cfg.epochs)
    groups = LayerGroups.of(model)
    method = method_cls(MethodContext(cfg.clip_norm, groups.names, count_parameters(model),
                                      q * n_records, dict(cfg.method_options), model,
                                      cfg.shadow_risk))
    loss_fn = nn.CrossEntropyLoss(reduction="none")
    if method_cls.step_kind == "sanitize":  # noise on an activation layer: a run of its own
        from dpclip.train.sanitize_run import SanitizeRun

        return SanitizeRun(model, groups, method, cfg, n_records, device, loss_fn, hidden,
                           public)
    runner = _PrivateRun if method_cls.private else _PlainRun
    run = runner(model, groups, method, cfg, q, steps_per_epoch, total_steps, device, loss_fn)
    if cfg.early_stopping["rule"] != "none":
        run.monitor_on(public)
    return run


@dataclass
class Checkpoint:
    """Periodic training state at ``path``, so a crash loses at most ``every`` epochs.

    A checkpoint is used only when its fingerprint (the configuration and a hash of the
    training data) matches; resuming restores the generators too, so a resumed run gives the
    same model as an uninterrupted one. It is deleted when training completes.
    """

    path: Path
    every: int
    fingerprint: str

    @classmethod
    def for_run(cls, path: Path, every: int, cfg: TrainConfig, x: np.ndarray, y: np.ndarray):
        digest = hashlib.sha256(repr(asdict(cfg)).encode())
        digest.update(np.ascontiguousarray(x).tobytes())
        digest.update(np.ascontiguousarray(y).tobytes())
        return cls(Path(path), every, digest.hexdigest())

    def restore(self, run: "_Run") -> int:
        """Load a matching checkpoint into ``run``; return the last finished epoch (0: none)."""
        if not self.path.exists():
            return 0
        state = torch.load(self.path, map_location=run.device, weights_only=True)
        if state.get("fingerprint") != self.fingerprint:
            return 0  # another configuration or other data: start afresh
        run.load_state_dict(state["run"])
        return int(state["epoch"])

    def maybe_save(self, run: "_Run", epoch: int) -> None:
        if epoch % self.every == 0:
            state = {"fingerprint": self.fingerprint, "epoch": epoch, "run": run.state_dict()}
            write_with(self.path, lambda tmp: torch.save(state, tmp))

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


def train_model(x: np.ndarray, y: np.ndarray, feature_shape: tuple[int, ...], n_classes: int,
                cfg: TrainConfig, *, progress: bool = True, desc: str = "",
                checkpoint_path: Path | None = None, checkpoint_every: int = 5,
                public: tuple | None = None) -> TrainResult:
    """Train one configuration and return the model, its trace and its privacy record."""
    run = build_run(feature_shape, n_classes, len(x), cfg, public)
    checkpoint = Checkpoint.for_run(checkpoint_path, checkpoint_every, cfg, x, y) \
        if checkpoint_path else None
    x_t = torch.as_tensor(x, dtype=torch.float32, device=run.device)
    y_t = torch.as_tensor(y, dtype=torch.int64, device=run.device)
    started = time.perf_counter()
    run.fit(x_t, y_t, progress=progress, desc=desc or cfg.method, checkpoint=checkpoint)
    train_s = time.perf_counter() - started
    step_times = np.array(run.step_times) if run.step_times else np.zeros(1)
    privacy = run.privacy_record()
    if privacy["epsilon"] is not None and run.trace:
        # a stopped run reports a bound of its own (odometer or planned): the trace ends on it
        run.trace[-1]["epsilon_spent"] = privacy["epsilon"]
    return TrainResult(
        model=run.plain_model().cpu(), trace=run.trace, privacy=privacy,
        time={"train_s": round(train_s, 4), "step_s_median": float(np.median(step_times)),
              "device": str(run.device)},
        training={"epochs_planned": run.cfg.epochs, "steps_planned": run.total_steps,
                  "steps_per_epoch": run.steps_per_epoch, "n_train": int(len(x)),
                  "stopped_by_budget": run.stopped_by_budget, **run.training_extras()},
        architecture=run.architecture(),
    )


class _Run:
    """State shared by private and plain runs: optimizer, generators, trace, early stopping.

    Early stopping (``train.early_stopping``) watches one number per epoch (:meth:`epoch_std`).
    For gradient methods it is the mean per-record standard deviation of the head's input on
    the public shadow split under the weights just released: post-processing of the DP
    output, so watching it costs no privacy.
    """

    def __init__(self, model, groups, method, cfg, q, steps_per_epoch, total_steps, device,
                 loss_fn):
        self.model, self.groups, self.method, self.cfg = model, groups, method, cfg
        self.network = model  # the plain module; self.model may get Opacus's wrapper
        self.q, self.steps_per_epoch, self.total_steps = q, steps_per_epoch, total_steps
        self.device, self.loss_fn = device, loss_fn
        self.rng = NoiseSources.for_run(cfg.seed, device, cfg.secure_noise)
        self.optimizer = make_optimizer(cfg, groups.flat())
        self.trace: list[dict] = []
        self.step_times: list[float] = []
        self.stopped_by_budget = False
        self.monitor: torch.Tensor | None = None  # public features watched by early stopping
        self.std_series: list[float] = []
        self.stopped_epoch: int | None = None

    def monitor_on(self, public) -> None:
        """Watch the public split's representations for early stopping."""
        if public is None or len(public[0]) == 0:
            raise DpclipError("train.early_stopping.rule: "
                              f"{self.cfg.early_stopping['rule']!r} watches the model on the "
                              "public shadow split, which is empty (data.split.shadow_train)")
        self.monitor = torch.as_tensor(public[0], dtype=torch.float32, device=self.device)

    def plain_model(self) -> nn.Module:
        """The trained network without Opacus's per-sample-gradient wrapper."""
        return self.network

    def training_extras(self) -> dict:
        """Run facts beyond the common ones (early stopping's epoch, for instance)."""
        if self.stopped_epoch is None:
            return {}
        return {"stopped_epoch": self.stopped_epoch, "stopped_early": True}

    def architecture(self) -> dict:
        return {"hidden": list(self.cfg.hidden)}

    def randomness_record(self) -> dict:
        """The neighbouring notion, how the noise was seeded, and which data each part saw."""
        return {"adjacency": self.method.adjacency, "secure_noise": self.rng.secure,
                "reproducible": not self.rng.secure, "data_use": self.method.data_use()}

    def fit(self, x, y, *, progress: bool, desc: str, checkpoint: "Checkpoint | None" = None):
        """Run the epochs; with ``checkpoint``, resume from it and save one every few epochs."""
        first = checkpoint.restore(self) + 1 if checkpoint else 1
        with self._bar(progress, desc) as bar:
            bar.update(len(self.trace))
            for epoch in range(first, self.cfg.epochs + 1):
                if not self.run_epoch(x, y, epoch, bar):
                    break  # the budget guard stopped training
                if self.end_epoch(epoch):
                    break  # early stopping
                if checkpoint and epoch < self.cfg.epochs:
                    checkpoint.maybe_save(self, epoch)
        if checkpoint:
            checkpoint.discard()

    # --- early stopping ----------------------------------------------------------------------
    def epoch_std(self) -> float | None:
        """The epoch's value of the watched series; None when nothing is watched."""
        if self.monitor is None:
            return None
        return public_representation_std(self.plain_model(), self.monitor)

    def end_epoch(self, epoch: int) -> bool:
        """Trace the watched series and the rule's signal; True when training should stop."""
        std = self.epoch_std()
        if std is None or not self.trace:
            return False
        self.std_series.append(std)
        es = self.cfg.early_stopping
        decision = decide(es["rule"], self.std_series, es["window"], es["threshold"]) \
            if es["rule"] != "none" else None
        self.trace[-1].update({
            "monitored_std": std,
            "early_stop_signal": decision.signal if decision else math.nan,
            "early_stop_flag": bool(decision.stop) if decision else False})
        if decision is not None and decision.stop and epoch < self.cfg.epochs:
            self.stopped_epoch = epoch
            return True
        return False

    def state_dict(self) -> dict:
        """Everything needed to continue exactly where training stopped."""
        return {"model": self.plain_model().state_dict(),
                "optimizer": self.optimizer.state_dict(), "method": self.method.state_dict(),
                "trace": self.trace, "step_times": self.step_times,
                "std_series": list(self.std_series),
                "rng": self.rng.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.plain_model().load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.method.load_state_dict(state["method"])
        if hasattr(self.optimizer, "max_grad_norm"):
            # an Opacus optimizer keeps C itself, as a float32 tensor once it has updated it
            self.optimizer.max_grad_norm = torch.tensor(self.method.clip_threshold,
                                                        dtype=torch.float32)
        self.trace, self.step_times = list(state["trace"]), list(state["step_times"])
        self.std_series = list(state.get("std_series", []))
        self.rng.load_state_dict(state["rng"])

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

    def run_epoch(self, x, y, epoch: int, bar) -> bool:
        n, b = len(x), self.cfg.batch_size
        order = torch.randperm(n, generator=self.rng.sampling).to(self.device)
        for k in range(self.steps_per_epoch):
            idx = order[k * b:(k + 1) * b] if (k + 1) * b <= n else order[-b:]
            step = len(self.trace) + 1
            tic = time.perf_counter()
            loss = plain_step(self.model, self.loss_fn, x[idx], y[idx], self.optimizer)
            self.step_times.append(time.perf_counter() - tic)
            self.trace.append({"step": step, "epoch": epoch, "batch_size": len(idx),
                               "clip_threshold": float("nan"), "train_loss": loss,
                               "epsilon_spent": float("nan")})
            self._show(bar, step, epoch=epoch, loss=f"{loss:.3f}")
        return True

    def privacy_record(self) -> dict:
        return {"dp_guarantee": False, "accountant": None, "target_epsilon": None,
                "epsilon": None, "delta": self.cfg.delta, "sample_rate": self.q,
                "noise_multiplier": 0.0, "sigma_train": 0.0, "steps": len(self.trace),
                **self.randomness_record()}


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
        self.method.bind_noise(self.sigma_eff, self.sigma_train)
        self.guard = BudgetGuard(cfg.accountant, cfg.delta, cfg.target_epsilon)
        if self.method.step_kind == "opacus_optimizer":
            self.model, self.optimizer = self.method.attach(self.model, self.optimizer,
                                                            self.rng.noise)
        else:
            self.model = wrap_for_dp(self.model)
        trace_every = 1 if cfg.accountant == "rdp" else max(1, self.total_steps // PRV_TRACE_POINTS)
        self.trace_every = trace_every

    def run_epoch(self, x, y, epoch: int, bar) -> bool:
        sampler = UniformWithReplacementSampler(num_samples=len(x), sample_rate=self.q,
                                                generator=self.rng.sampling,
                                                steps=self.steps_per_epoch)
        for batch in sampler:
            if not self.guard.allows(self.sigma_eff, self.q,
                                     horizon=self.total_steps - self.guard.steps):
                self.stopped_by_budget = True
                return False
            row = self.step(x, y, batch, epoch)
            self._show(bar, row["step"], epoch=epoch, loss=f"{row['train_loss']:.3f}",
                       C=f"{row['clip_threshold']:.3g}",
                       eps="-" if math.isnan(row["epsilon_spent"])
                       else f"{row['epsilon_spent']:.2f}")
        return True

    def state_dict(self) -> dict:
        return {**super().state_dict(), "history": list(self.guard.history)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.guard.history = [tuple(entry) for entry in state["history"]]

    def step(self, x, y, batch, epoch: int) -> dict:
        """One accounted step on Poisson batch ``batch`` (record indices); returns its trace row.
        An empty batch is a full step: the update is the noise alone (``dp_step``)."""
        self.guard.record(self.sigma_eff, self.q)
        step = self.guard.steps
        clip = self.method.clip_threshold
        idx = torch.as_tensor(batch, dtype=torch.int64, device=self.device)
        tic = time.perf_counter()
        if self.method.step_kind == "opacus_optimizer":
            loss = self.method.opacus_step(self.model, self.loss_fn, x[idx], y[idx],
                                           self.optimizer)
        else:
            loss, _ = dp_step(self.model, self.groups, self.loss_fn, x[idx], y[idx],
                              self.method, self.sigma_train, self.q * len(x), self.optimizer,
                              self.rng, step)
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
        cfg = self.cfg
        record = {"dp_guarantee": bool(self.method.dp_guarantee), "accountant": cfg.accountant,
                  "target_epsilon": cfg.target_epsilon,
                  "epsilon": epsilon_of(cfg.accountant, self.guard.history, cfg.delta),
                  "delta": cfg.delta, "sample_rate": self.q,
                  "noise_multiplier": self.sigma_eff, "sigma_train": self.sigma_train,
                  "steps": self.guard.steps, "epsilon_bound": "fixed_horizon",
                  **self.randomness_record(),
                  **{f"sigma_{e.name}": e.noise_std for e in self.extras}}
        if self.stopped_epoch is not None:
            planned = epsilon_of(cfg.accountant, [(self.sigma_eff, self.q, self.total_steps)],
                                 cfg.delta)
            record.update(early_stop_privacy(planned, stopped_epsilon(self.guard.history,
                                                                      cfg.delta)))
        return record
