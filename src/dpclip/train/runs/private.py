"""The ``private`` run kind: DP-SGD with the method's scaling rule. Each step samples a Poisson
batch (every record independently with probability q = B / N, Opacus's
``UniformWithReplacementSampler``), asks the budget guard, and runs the shared DP step
(:func:`dpclip.train.step.dp_step`). An empty batch is a full step (noise only)."""

from __future__ import annotations

import math
import time

import torch

from dpclip.privacy import (BudgetGuard, early_stop_privacy, epsilon_of, noise_for_epsilon,
                            split_sigma, stopped_epsilon)
from dpclip.train.model_check import check_model
from dpclip.train.runs.base import Run, register_run_kind
from dpclip.train.setup import RunSetup
from dpclip.train.book_keeping import BookKeeping, wrap_for_dp
from dpclip.train.step import dp_step

# the PRV accountant is slow to call: the trace samples epsilon at about this many steps a run
PRV_TRACE_POINTS = 50


@register_run_kind
class PrivateRun(Run):
    """DP run: Poisson batches, the shared DP step, accounting and the budget guard."""
    kind = "private"
    takes_gradient_canaries = noise_for_target = takes_users_model = True

    def __init__(self, setup: RunSetup):
        super().__init__(setup)
        cfg = self.cfg
        self.sigma_eff = noise_for_epsilon(cfg.target_epsilon, cfg.privacy.delta, self.q,
                                           self.total_steps, cfg.privacy.accountant,
                                           cfg.privacy.epsilon_tolerance)
        self.extras = self.method.extra_queries(self.sigma_eff)
        self.sigma_train = split_sigma(self.sigma_eff, self.extras)
        self.method.bind_noise(self.sigma_eff, self.sigma_train)
        self.guard = BudgetGuard(cfg.privacy.accountant, cfg.privacy.delta, cfg.target_epsilon)
        self.attach()
        self.canaries = None  # the audit's white-box canaries (dpclip.audit), never otherwise
        self.trace_every = 1 if cfg.privacy.accountant == "rdp" else \
            max(1, self.total_steps // PRV_TRACE_POINTS)

    def attach(self) -> None:
        """Prepare the model for per-sample gradients (Opacus's GradSampleModule)."""
        self.model = wrap_for_dp(self.model)

    def fit(self, x, y, **kwargs):
        """Check the model's per-sample gradients against float64 autograd
        (:func:`dpclip.train.model_check.check_model`: a model the DP step would get wrong is
        refused before any step), then train. Opacus's own optimizer (a run kind on this one
        with Opacus's hooks) is not checked: the check is of dpclip's step."""
        if isinstance(self.model, BookKeeping):
            check_model(self.network, self.loss_fn, x, y,
                        batch_size=round(self.q * self.n_records))
            self.model.checked = True
        super().fit(x, y, **kwargs)

    def sum_divisor(self) -> float:
        """What each step's noisy sum is divided by: the Poisson batch's expected size q N,
        which is ``train.batch_size``, a public number. Never N itself: N changes by one
        between neighbouring data sets, and one record would then move the update by more than
        the noise is calibrated for."""
        return self.q * self.n_records

    def apply_step(self, x, y, step: int) -> float:
        """One DP update on the batch ``x, y``; returns the batch's mean loss (local only)."""
        loss, _ = dp_step(self.model, self.groups, self.loss_fn, x, y, self.method,
                          self.sigma_train, self.sum_divisor(), self.optimizer, self.rng,
                          step, self.canaries, most_records=self.n_records)
        return loss

    def run_epoch(self, x, y, epoch: int, bar) -> bool:
        from opacus.utils.uniform_sampler import UniformWithReplacementSampler  # on use

        sampler = UniformWithReplacementSampler(num_samples=len(x), sample_rate=self.q,
                                                generator=self.rng.sampling,
                                                steps=self.steps_per_epoch)
        for batch in sampler:
            if not self.guard.allows(self.sigma_eff, self.q,
                                     horizon=self.total_steps - self.guard.steps):
                self.stopped_by_budget = True
                return False
            row = self.step(x, y, batch, epoch)
            self.advance(bar, row["step"], epoch=epoch, loss=f"{row['train_loss']:.3f}",
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
        loss = self.apply_step(x[idx], y[idx], step)
        self.clock_step(tic)
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
        p = self.cfg.privacy
        record = {"dp_guarantee": bool(self.method.claim.dp_guarantee), "accountant": p.accountant,
                  "target_epsilon": self.cfg.target_epsilon,
                  "epsilon": epsilon_of(p.accountant, self.guard.history, p.delta),
                  "delta": p.delta, "sample_rate": self.q,
                  "noise_multiplier": self.sigma_eff, "sigma_train": self.sigma_train,
                  "steps": self.guard.steps, "epsilon_bound": "fixed_horizon",
                  **self.randomness_record(),
                  **{f"sigma_{e.name}": e.noise_std for e in self.extras}}
        if self.stopped_epoch is not None:
            planned = epsilon_of(p.accountant, [(self.sigma_eff, self.q, self.total_steps)],
                                 p.delta)
            record.update(early_stop_privacy(planned, stopped_epsilon(self.guard.history,
                                                                      p.delta)))
        return record
