"""Every random draw of a training run comes from generators the run owns (docs/privacy.md,
"Randomness"), on every device, so a resumed run never repeats a draw.

Three streams, each its own ``torch.Generator``:

* ``sampling`` (CPU): Poisson sampling of the batches and the shuffles of epochs;
* ``noise`` (the run's device): gradient noise, sanitization noise and dropout masks, and
  extra answers drawn on the device (lm_dp_sgd's noisy layer shares);
* ``extras`` (CPU): small extra answers drawn on the CPU (DC-SGD's noisy histogram, AdaClip's
  noisy count), on a GPU run too. Before, a GPU run drew these from torch's global CPU
  generator, which a resumed run re-seeded from ``train.seed``: step k*S + j then repeated the
  draws of step j, and differences of traced noisy answers revealed private counts.

Reproducible runs (``privacy.secure_noise: false``, the default) derive the seeds from
``train.seed`` and the run's identity (its method, options, target epsilon, training settings,
dataset and partition: :meth:`dpclip.train.setup.TrainConfig.stream_key`), so two runs that
differ in anything draw independent streams: the difference of two released models holds the
noise of both, as composition assumes. The generators' states are checkpointed, so a resumed
run continues each stream where it stopped and equals an uninterrupted run. Anyone who knows
the seed and the other records can replay such a run: the model is for research, not for
release.

Common random numbers (``privacy.common_random_numbers: true``) derive the seeds from
``train.seed`` alone, so runs of one seed share their batches and noise: methods with the same
noise scale add the very same noise at every step, which sharpens paired comparisons and
cancels in the difference of their models (``W_a - W_b`` is then noise-free). Such models must
never be released together; the record says ``noise_shared_across_runs: true``.

Secure runs (``privacy.secure_noise: true``) seed every stream from the operating system's
entropy (:func:`os.urandom`, 64 bits a stream). The seeds and generator states are never
written to a checkpoint, a record, MLflow or a log; a resumed run draws fresh seeds, which is
as private (fresh independent noise) but not reproducible. torch's generators themselves are not
cryptographic (MT19937 on the CPU, Philox on CUDA), and floating-point attacks on Gaussian
sampling are out of scope.
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
