"""CPU kernels chosen so that a run gives the same numbers on any x86-64 machine with AVX2.

torch, MKL and oneDNN pick their CPU kernels by the instruction set the processor has: on an
AVX-512 machine a reduction or a matrix product runs other code, summing in another order, than
on an AVX2 machine, so the same configuration trains to other weights; an adaptive method
then amplifies the rounding difference (docs/measurements.md). Each library can
be told the instruction set to use:

* ``ATEN_CPU_CAPABILITY=avx2``: torch's own vectorised kernels (reductions, elementwise);
* ``MKL_CBWR=AVX2``: MKL's conditional numerical reproducibility, the same results on every
  processor with AVX2 for a given number of threads;
* ``ONEDNN_MAX_CPU_ISA=AVX2``: oneDNN's convolutions and matrix products.

:func:`pin_cpu_kernels` sets the three (a value already in the environment wins) unless
``DPCLIP_CPU_KERNELS=native``. The variables are read when each library starts, so this runs
when ``dpclip`` is imported, before torch: a process that imported torch before dpclip keeps
its native kernels, and each run records the capability torch actually used
(:func:`kernels_in_use`), which ``dpclip verify`` shows for a run that differs. The thread
count matters as well (``train.threads``). The cost in speed is measured in docs/measurements.md.
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
