"""What every run kind shares: optimizer, generators, trace, progress, early stopping and the
state a checkpoint holds. A run kind (:mod:`dpclip.train.runs`) adds how an epoch runs and
what its privacy record says."""

from __future__ import annotations

import math
import os
import time

import torch
from torch import nn
from tqdm.auto import tqdm

from dpclip.errors import DpclipError
from dpclip.models import as_model_input
from dpclip.randomness import NoiseSources
from dpclip.registry import Registry
from dpclip.train.early_stopping import decide, public_representation_std
from dpclip.train.setup import RunSetup, make_optimizer, plan_steps

# the row of a run's progress bar on the terminal: each worker of runs going side by side
# sets its own (dpclip.pipeline.side_by_side, which cannot import this module: it runs before
# torch is imported)
PROGRESS_ROW = "DPCLIP_PROGRESS_ROW"


# kind -> Run subclass, the registry the methods, attacks and sources use too; the package
# imports every module of itself when it is imported (dpclip.train.runs), so every run's code
# includes every kind
RUN_KINDS = Registry("run kind", "dpclip.train.runs", "Run", "dpclip.run_kinds", key="kind")
register_run_kind = RUN_KINDS.register  # the class decorator of every run-kind module


class Run:
    """State shared by every run kind. Early stopping watches :meth:`epoch_std` once an epoch
    (docs/methods.md, "Early stopping (every method)"); a run kind that releases a series of
    its own overrides :meth:`epoch_std` and :meth:`watch_public`."""

    kind: str = ""  # the name a method's run_kind uses
    # What the pipeline may do with a run of this kind: the kind says so here, and a subclass
    # inherits its parent's answers (docs/adding-a-run-kind.md, "What a new kind gets")
    takes_gradient_canaries: bool = False  # the white-box audit's canaries enter its DP step
    # its sigma is the noise search's for the target epsilon at its plan (q, T), so a tuning
    # trial can run at the run's own noise (dpclip.stages.tune)
    noise_for_target: bool = False
    takes_users_model: bool = False  # dpclip.api.train_private may train a caller's model

    # the model a run of this kind trains: its hidden widths, whether its own training needs
    # the public split, and the evaluated model rebuilt from what architecture() saved
    @classmethod
    def model_hidden(cls, options, hidden) -> list[int]:
        """The hidden widths of the model (``train.hidden`` by default); ``options``: the
        method's validated options."""
        return list(hidden)

    @classmethod
    def plan(cls, n_records: int, cfg, options) -> tuple[float, int, int]:
        """(q, steps per epoch, total steps T) of a run on ``n_records``: Poisson sampling at
        q = ``train.batch_size`` / n (or ``cfg.sample_rate``) by default. Planned before the
        method is built, whose context's expected batch is q n."""
        return plan_steps(n_records, cfg.train.batch_size, cfg.train.epochs, cfg.sample_rate)

    @classmethod
    def needs_public_data(cls, options) -> bool:
        """True: the run's own training reads the public shadow train split (e.g. to pre-train
        a frozen encoder on it)."""
        return False

    @classmethod
    def rebuild_for_evaluation(cls, model: nn.Module, architecture: dict) -> nn.Module:
        """The evaluated model from the plain one and the saved :meth:`architecture`: a kind
        that inserted a layer puts it back here."""
        return model

    def __init__(self, setup: RunSetup):
        self.model, self.groups, self.method = setup.model, setup.groups, setup.method
        self.cfg = setup.cfg
        self.network = setup.model  # the plain module; self.model may get Opacus's wrapper
        self.n_records, self.q = setup.n_records, setup.q
        self.steps_per_epoch = setup.steps_per_epoch
        self.total_steps = setup.total_steps
        self.device, self.loss_fn = setup.device, setup.loss_fn
        self.rng = NoiseSources.for_run(self.cfg.seed, self.device, self.cfg.privacy.secure_noise,
                                        key=self.cfg.stream_key())
        self.optimizer = make_optimizer(self.cfg, self.groups.flat())
        self.trace: list[dict] = []
        self.step_times: list[float] = []  # seconds each step took
        self.step_ended_at: list[float] = []  # wall clock (Unix seconds) when each step ended
        self.stopped_by_budget = False
        self.monitor: torch.Tensor | None = None  # public features watched by early stopping
        self.public_init: dict = {}  # train.public_init's pre-training record (set by build_run)
        self.std_series: list[float] = []
        self.stopped_epoch: int | None = None

    def use_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Step with the caller's optimizer instead of ``train.optimizer``'s: it must update
        exactly the parameters the DP step releases (the model's trainable ones)."""
        given = {id(p) for group in optimizer.param_groups for p in group["params"]}
        trained = {id(p) for p in self.groups.flat()}
        if given != trained:
            raise DpclipError(f"optimizer: it holds {len(given)} parameters, the model trains "
                              f"{len(trained)}; build it from model.parameters() (those that "
                              f"require gradients), as the DP step releases exactly those")
        self.optimizer = optimizer

    def watch_public(self, public) -> None:
        """Watch the public split's representations for early stopping."""
        if public is None or len(public[0]) == 0:
            raise DpclipError("train.early_stopping.rule: "
                              f"{self.cfg.train.early_stopping.rule!r} watches the model on the "
                              "public shadow split, which is empty (data.split.shadow_train)")
        self.monitor = as_model_input(public[0], self.device)

    def plain_model(self) -> nn.Module:
        """The trained network without Opacus's per-sample-gradient wrapper."""
        return self.network

    def clock_step(self, started: float) -> None:
        """Record the step that began at ``started`` (``time.perf_counter()``): its duration
        and the wall-clock time it ended (MLflow's step timestamps)."""
        self.step_times.append(time.perf_counter() - started)
        self.step_ended_at.append(time.time())

    def timing_extras(self) -> dict:
        """Wall-clock measurements beyond the step times (a periodic probe's seconds, a
        public pre-training's). They go to the run's timings file, never into its record:
        DVC hashes the record, and a time differs on every run."""
        cost = self.method.probe_cost()
        return {"probe_s": round(cost["seconds"], 4)} if cost else {}

    def training_extras(self) -> dict:
        """Run facts beyond the common ones (early stopping's epoch, for instance)."""
        if self.stopped_epoch is None:
            return {}
        return {"stopped_epoch": self.stopped_epoch, "stopped_early": True}

    def architecture(self) -> dict:
        return {"hidden": list(self.cfg.train.hidden)}

    def randomness_record(self) -> dict:
        """The neighbouring notion, how the noise was seeded, and which data each part saw."""
        return {"adjacency": self.method.claim.adjacency, "secure_noise": self.rng.secure,
                "reproducible": not self.rng.secure,
                "noise_shared_across_runs": self.cfg.stream_key() is None and not self.rng.secure,
                "data_use": self.method.data_use()}

    def run_epoch(self, x, y, epoch: int, bar) -> bool:
        """Train one epoch; False when the budget guard stopped training."""
        raise NotImplementedError

    def privacy_record(self) -> dict:
        """The record's ``privacy`` entry: the guarantee, epsilon and how it was obtained."""
        raise NotImplementedError

    def fit(self, x, y, *, progress: bool, desc: str, checkpoint=None):
        """Run the epochs; with ``checkpoint``, resume from it and save one every few epochs."""
        first = checkpoint.restore(self) + 1 if checkpoint else 1
        with self.progress_bar(progress, desc) as bar:
            bar.update(len(self.trace))
            for epoch in range(first, self.cfg.train.epochs + 1):
                if not self.run_epoch(x, y, epoch, bar):
                    break  # the budget guard stopped training
                if self.end_epoch(epoch):
                    break  # early stopping
                if checkpoint and epoch < self.cfg.train.epochs:
                    checkpoint.maybe_save(self, epoch)
        self.finish()
        if checkpoint:
            checkpoint.discard()

    def finish(self) -> None:
        """After the last epoch, before the model is released (a run kind's last step)."""

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
        es = self.cfg.train.early_stopping
        decision = decide(es.rule, self.std_series, es.window, es.threshold) \
            if es.rule != "none" else None
        self.trace[-1].update({
            "monitored_std": std,
            "early_stop_signal": decision.signal if decision else math.nan,
            "early_stop_flag": bool(decision.stop) if decision else False})
        if decision is not None and decision.stop and epoch < self.cfg.train.epochs:
            self.stopped_epoch = epoch
            return True
        return False

    def state_dict(self) -> dict:
        """Everything needed to continue exactly where training stopped."""
        return {"model": self.plain_model().state_dict(),
                "optimizer": self.optimizer.state_dict(), "method": self.method.state_dict(),
                "trace": self.trace, "step_times": self.step_times,
                "step_ended_at": self.step_ended_at,
                "std_series": list(self.std_series),
                "rng": self.rng.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.plain_model().load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.method.load_state_dict(state["method"])
        self.trace, self.step_times = list(state["trace"]), list(state["step_times"])
        self.step_ended_at = list(state.get("step_ended_at", []))
        self.std_series = list(state.get("std_series", []))
        self.rng.load_state_dict(state["rng"])

    def progress_bar(self, progress: bool, desc: str):
        # runs side by side each draw on a row of their own (dpclip.pipeline.side_by_side)
        return tqdm(total=self.total_steps, desc=desc, disable=not progress, leave=False,
                    unit="step", dynamic_ncols=True, mininterval=0.5,
                    position=int(os.environ.get(PROGRESS_ROW, 0)))

    def advance(self, bar, step: int, **postfix) -> None:
        """Advance the bar; refresh its numbers about 100 times a run, not every step."""
        bar.update(1)
        if step % max(1, self.total_steps // 100) == 0 or step == self.total_steps:
            bar.set_postfix(postfix, refresh=False)
