"""The CPU kernels every dpclip process computes with: pinned to AVX2 unless the user says
native, so that machines with other instruction sets give the same numbers."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dpclip.numerics import PINS, VARIABLE, pin_cpu_kernels

PROBE = ("import dpclip, json, os, torch; from dpclip.numerics import kernels_in_use; "
         "print(json.dumps(kernels_in_use()))")


def test_the_pins_are_set_unless_given_or_native():
    env = {}
    assert pin_cpu_kernels(env) == PINS and env == PINS
    env = {"MKL_CBWR": "COMPATIBLE"}  # the user's value wins
    pin_cpu_kernels(env)
    assert env["MKL_CBWR"] == "COMPATIBLE" and env["ATEN_CPU_CAPABILITY"] == "avx2"
    env = {VARIABLE: "native"}
    assert pin_cpu_kernels(env) == {} and env == {VARIABLE: "native"}
    with pytest.raises(ValueError, match=f"{VARIABLE}: 'avx9' is not one of avx2, native"):
        pin_cpu_kernels({VARIABLE: "avx9"})


def _probe(**extra):
    env = {k: v for k, v in os.environ.items() if k not in PINS and k != VARIABLE}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**env, **extra},
                         capture_output=True, text=True, check=True).stdout
    import json
    return json.loads(out)


def test_importing_dpclip_first_makes_torch_use_the_avx2_kernels():
    pinned = _probe()
    assert pinned["mkl_cbwr"] == "AVX2" and pinned["onednn_max_cpu_isa"] == "AVX2"
    # AVX2 at most: a processor without AVX2 falls back to torch's plain kernels
    assert pinned["cpu_capability"] in ("AVX2", "DEFAULT")
    native = _probe(**{VARIABLE: "native"})
    assert native["mkl_cbwr"] is None and native["onednn_max_cpu_isa"] is None
