"""Periodic training state, so a crash loses at most a few epochs of what a user trained."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dpclip.hashing import records_digest
from dpclip.files import write_torch


@dataclass
class Checkpoint:
    """Periodic training state at ``path``, so a crash loses at most ``every`` epochs.

    A checkpoint is used only when its fingerprint (the configuration and a hash of the
    training data, :meth:`~dpclip.train.setup.TrainConfig.identity`) matches; resuming restores the generators too, so a resumed run gives the
    same model as an uninterrupted one. It is deleted when training completes. ``run`` is any
    run kind (:class:`dpclip.train.runs.Run`): its ``state_dict`` holds everything.
    """

    path: Path
    every: int
    fingerprint: str

    @classmethod
    def for_run(cls, path: Path, every: int, cfg, x: np.ndarray, y: np.ndarray):
        digest = hashlib.sha256(repr(cfg.identity()).encode())
        digest.update(records_digest(x, y).encode())
        return cls(Path(path), every, digest.hexdigest())

    def restore(self, run) -> int:
        """Load a matching checkpoint into ``run``; return the last finished epoch (0: none)."""
        if not self.path.exists():
            return 0
        state = torch.load(self.path, map_location=run.device, weights_only=True)
        if state.get("fingerprint") != self.fingerprint:
            return 0  # another configuration or other data: start afresh
        run.load_state_dict(state["run"])
        return int(state["epoch"])

    def maybe_save(self, run, epoch: int) -> None:
        if epoch % self.every == 0:
            state = {"fingerprint": self.fingerprint, "epoch": epoch, "run": run.state_dict()}
            write_torch(self.path, state)

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)
