"""The ``plain`` run kind: non-private training (shuffled minibatches of size B, mean loss, no
clipping, no noise)."""

from __future__ import annotations

import time

import torch

from dpclip.train.runs.base import Run, register_run_kind
from dpclip.train.step import plain_step


@register_run_kind
class PlainRun(Run):
    """Non-private: shuffled minibatches, mean loss, no clipping, no noise."""
    kind = "plain"
    takes_users_model = True

    def run_epoch(self, x, y, epoch: int, bar) -> bool:
        n = len(x)
        b = max(1, min(n, round(self.q * n)))  # train.batch_size, or q n at a given rate
        order = torch.randperm(n, generator=self.rng.sampling).to(self.device)
        for k in range(self.steps_per_epoch):
            idx = order[k * b:(k + 1) * b] if (k + 1) * b <= n else order[-b:]
            step = len(self.trace) + 1
            tic = time.perf_counter()
            loss = plain_step(self.model, self.loss_fn, x[idx], y[idx], self.optimizer)
            self.clock_step(tic)
            self.trace.append({"step": step, "epoch": epoch, "batch_size": len(idx),
                               "clip_threshold": float("nan"), "train_loss": loss,
                               "epsilon_spent": float("nan")})
            self.advance(bar, step, epoch=epoch, loss=f"{loss:.3f}")
        return True

    def privacy_record(self) -> dict:
        return {"dp_guarantee": False, "accountant": None, "target_epsilon": None,
                "epsilon": None, "delta": self.cfg.privacy.delta, "sample_rate": self.q,
                "noise_multiplier": 0.0, "sigma_train": 0.0, "steps": len(self.trace),
                **self.randomness_record()}
