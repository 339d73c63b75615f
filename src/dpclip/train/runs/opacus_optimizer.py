"""The ``opacus_optimizer`` run kind: a private run whose method brings an Opacus
``DPOptimizer`` of its own (:meth:`dpclip.methods.Method.attach` and
:meth:`~dpclip.methods.Method.opacus_step`) instead of the shared DP step. Sampling, the
budget guard, the trace and the privacy record are those of :class:`PrivateRun`."""

from __future__ import annotations

import torch

from dpclip.train.runs.base import register_run_kind
from dpclip.train.runs.private import PrivateRun


@register_run_kind
class OpacusOptimizerRun(PrivateRun):
    kind = "opacus_optimizer"

    def attach(self) -> None:
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
