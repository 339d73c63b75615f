"""The ``opacus_optimizer`` run kind: a private run whose method brings an Opacus
``DPOptimizer`` of its own instead of the shared DP step. Sampling, the budget guard, the trace
and the privacy record are those of :class:`PrivateRun`. Its method defines

* ``attach(model, optimizer, noise_generator)``: (the wrapped model, the DPOptimizer drawing
  its noise from ``noise_generator``);
* ``opacus_step(model, loss_fn, x, y, optimizer)``: one step on the batch (possibly empty, then
  a noise-only step), returning the mean loss."""

from __future__ import annotations

import torch

from dpclip.errors import DpclipError
from dpclip.train.runs.base import register_run_kind
from dpclip.train.runs.private import PrivateRun


@register_run_kind
class OpacusOptimizerRun(PrivateRun):
    kind = "opacus_optimizer"
    # Opacus's optimizer, not the shared step, adds the noise; it wraps the model itself
    takes_gradient_canaries = takes_users_model = False

    def attach(self) -> None:
        missing = [f for f in ("attach", "opacus_step") if not callable(getattr(self.method, f,
                                                                               None))]
        if missing:
            raise DpclipError(f"method {self.method.name!r}: run kind {self.kind!r} needs "
                              f"{' and '.join(f + '()' for f in missing)} "
                              f"(dpclip.train.runs.opacus_optimizer)")
        self.model, self.optimizer = self.method.attach(self.model, self.optimizer,
                                                        self.rng.noise)

    def apply_step(self, x, y, step: int) -> float:
        return self.method.opacus_step(self.model, self.loss_fn, x, y, self.optimizer)

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        # the optimizer keeps C itself, as a float32 tensor on the run's device once it has
        # updated it (a CPU tensor here made a resumed CUDA run fail)
        self.optimizer.max_grad_norm = torch.tensor(self.method.clip_threshold,
                                                    dtype=torch.float32, device=self.device)
