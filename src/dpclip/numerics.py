"""CPU kernels chosen so that a run gives the same numbers on any x86-64 machine with AVX2:
torch, MKL and oneDNN otherwise pick kernels by the processor's instruction set, which sum in
another order (docs/measurements.md, "Results across machines"). :func:`pin_cpu_kernels` sets
``ATEN_CPU_CAPABILITY=avx2``, ``MKL_CBWR=AVX2`` and ``ONEDNN_MAX_CPU_ISA=AVX2`` (a value already
in the environment wins) unless ``DPCLIP_CPU_KERNELS=native``. It runs when ``dpclip`` is
imported, before torch; each run records the kernels torch actually used (:func:`kernels_in_use`).
"""

from __future__ import annotations

import os

VARIABLE = "DPCLIP_CPU_KERNELS"  # avx2 (default) | native
PINS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
CHOICES = ("avx2", "native")


def pin_cpu_kernels(environ=os.environ) -> dict[str, str]:
    """Set :data:`PINS` in ``environ`` where unset, unless ``DPCLIP_CPU_KERNELS=native``;
    returns what was set."""
    choice = environ.get(VARIABLE, "avx2").strip().lower()
    if choice not in CHOICES:
        raise ValueError(f"{VARIABLE}: {choice!r} is not one of {', '.join(CHOICES)}")
    if choice == "native":
        return {}
    added = {k: v for k, v in PINS.items() if k not in environ}
    environ.update(added)
    return added


def kernels_in_use() -> dict[str, str | None]:
    """The kernels this process computes with: torch's CPU capability as torch reports it and
    the MKL / oneDNN settings it started with (None: the library's own choice)."""
    import torch

    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "mkl_cbwr": os.environ.get("MKL_CBWR"),
            "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
            "torch": torch.__version__}
