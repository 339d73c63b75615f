"""Every random draw of a training run comes from three generators the run owns
(:class:`NoiseSources`: ``sampling`` and ``extras`` on the CPU, ``noise`` on the run's device),
checkpointed on every device, so a resumed run continues each stream and never repeats a draw.
Their seeds come from ``train.seed`` and the run's identity (the default: runs that differ in
anything draw independent noise), from ``train.seed`` alone (``privacy.common_random_numbers``:
runs of one seed share noise, never to be released together), or from the operating system's
entropy (``privacy.secure_noise``: written nowhere, not reproducible). What each stream draws
and what each mode guarantees: docs/privacy.md, "Randomness".
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import torch

STREAMS = ("sampling", "noise", "extras")


def _entropy_seed() -> int:
    return int.from_bytes(os.urandom(8), "little") >> 1  # torch takes seeds below 2^63


def _keyed_seed(seed: int, key: str, stream: str) -> int:
    """A 63-bit seed from (seed, run identity, stream) by SHA-256: runs that differ in
    anything get unrelated streams."""
    digest = hashlib.sha256(f"{seed}\0{key}\0{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclass
class NoiseSources:
    """The run's generators (see the module note). ``secure``: seeded from OS entropy."""

    sampling: torch.Generator
    noise: torch.Generator
    extras: torch.Generator
    secure: bool = False

    @classmethod
    def for_run(cls, seed: int, device: torch.device | str = "cpu",
                secure: bool = False, key: str | None = None) -> "NoiseSources":
        """The streams of one run: from OS entropy (``secure``), else from ``seed`` and the
        run's identity ``key`` (independent of every other run's), else (``key`` None: common
        random numbers) from ``seed`` alone."""
        device = torch.device(device)
        if secure:
            seeds = [_entropy_seed() for _ in STREAMS]
        elif key is None:
            seeds = [seed * 7919 + k for k in (1, 2, 3)]
        else:
            seeds = [_keyed_seed(seed, key, name) for name in STREAMS]
        return cls(sampling=torch.Generator().manual_seed(seeds[0]),
                   noise=torch.Generator(device=device).manual_seed(seeds[1]),
                   extras=torch.Generator().manual_seed(seeds[2]), secure=secure)

    @classmethod
    def seeded(cls, seed: int = 0) -> "NoiseSources":
        """CPU streams from ``seed`` (tests and benchmarks)."""
        return cls.for_run(seed)

    def state_dict(self) -> dict:
        """The streams' states for a checkpoint; nothing at all for a secure run."""
        if self.secure:
            return {"secure": True}
        return {name: getattr(self, name).get_state() for name in STREAMS}

    def load_state_dict(self, state: dict) -> None:
        """Continue the checkpointed streams; a secure run re-seeds from fresh entropy."""
        if self.secure:
            for name in STREAMS:
                getattr(self, name).manual_seed(_entropy_seed())
            return
        if state.get("secure"):
            raise ValueError("the checkpoint holds no generator state (a secure-noise run); "
                             "it cannot resume a reproducible run")
        for name in STREAMS:
            # a checkpoint loaded onto a GPU brings the states there; torch wants CPU bytes
            getattr(self, name).set_state(state[name].cpu())
