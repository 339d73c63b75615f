"""Shared fixtures: tiny parameter sets and small data files made by the tests themselves."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml

PROJECT = Path(__file__).resolve().parents[1]

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
# One torch (OpenMP) thread per test worker: pytest-xdist runs one worker per core, and two
# threads per worker oversubscribe the cores, where OpenMP's spin-waiting threads burn the
# other worker's time (measured: 50 s against 30 s for the method and step tests on two
# cores). Every run sets its own count from train.threads (TINY asks for one), which then
# stays in effect for the worker's later tests.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The per-run stages' commands run their runs in this process: pytest-xdist already fills the
# cores, and workers would import Opacus and scikit-learn again for runs of a fraction of a
# second (about 5 s more for tests/test_cli.py and two other modules). Side-by-side runs are
# tested where a test asks for them (tests/pipeline/test_side_by_side.py, tests/test_presets.py).
os.environ.setdefault("DPCLIP_JOBS", "1")
# DVC's usage analytics: each dvc command left a background process, which found no network
# here and left a file in the temporary folder (54 in one run of the suite)
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
# The noise searches the tests remember stay theirs (not the user's ~/.cache/dpclip), in a
# folder that the process which made it removes at its end (pytest_unconfigure)
OWN_CACHE = None
if "DPCLIP_CACHE" not in os.environ:
    OWN_CACHE = os.environ["DPCLIP_CACHE"] = tempfile.mkdtemp(prefix="dpclip-cache-")


def pytest_unconfigure(config):
    if OWN_CACHE:
        shutil.rmtree(OWN_CACHE, ignore_errors=True)

TINY = {
    "data": {"dataset": "digits", "seed": 0},
    "partition": {"alphas": ["iid"]},
    "privacy": {"target_epsilons": [8], "delta": 1.0e-5, "accountant": "rdp"},
    "train": {"methods": ["non_private", "dp_sgd"], "model": "mlp", "hidden": [32],
              "seeds": [0], "epochs": 2, "batch_size": 64, "lr": 0.5, "momentum": 0.0,
              "threads": 1},
    "audit": {"kinds": ["whitebox", "blackbox"], "canaries": 300, "input_canaries": 100},
}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """``--dist loadgroup`` (pyproject's addopts): a test marked ``xdist_group(name)`` gets
    ``@name`` at the end of its id, by which pytest-xdist sends a group's tests to one worker,
    so a module's fixture (an end-to-end project) is built once. pytest-xdist 3.8 sets the
    suffix on ``item._nodeid``, which pytest 9 no longer reads (the id lives in ``item._id``):
    the marks were ignored and a module's tests, spread over both workers, built its project on
    each. Done here the way pytest-xdist means it; nothing when xdist already did it."""
    if not getattr(config.option, "loadgroup", False):  # set on xdist's workers only
        return
    try:
        from _pytest.nodeid import coerce_node_id  # pytest 9
    except ImportError:  # pytest 8: xdist's own suffix works
        return

    for item in items:
        names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                        for mark in item.iter_markers("xdist_group")})
        if names and not item.nodeid.endswith(f"@{'_'.join(names)}"):
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(names)}")


def merged(base: dict, override: dict) -> dict:
    """``base`` with ``override`` set section by section (what a Prefect run form does)."""
    from dpclip.config import with_overrides

    return with_overrides(base, override)


def tiny_project_params() -> dict:
    """The project's params.yaml (every key DVC tracks) with the tiny settings merged in."""
    return merged(yaml.safe_load((PROJECT / "params.yaml").read_text()), TINY)


@pytest.fixture
def tiny_raw():
    """A function returning the tiny parameter mapping with overrides merged in."""
    return lambda **sections: merged(TINY, sections)


@pytest.fixture
def write_params(tmp_path):
    def write(raw: dict, name: str = "params.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        return path

    return write


def prepared_project(tmp_path, raw: dict, write_params) -> list[str]:
    """Write ``raw`` as params, run prepare and the iid partition through the CLI; returns the
    CLI arguments that address this project."""
    from dpclip.cli import main

    params = write_params(raw)
    base = ["--params", str(params), "--root", str(tmp_path), "--quiet"]
    assert main([*base, "prepare"]) == 0
    assert main([*base, "partition", "--alpha", "iid"]) == 0
    return base


def shadow_risk_for(names: list[str], error_rates=None, shares=None) -> dict:
    """A shadow risk record (the ``layers`` part lm_dp_sgd reads) for hand-made cases."""
    error_rates = error_rates or [0.5 - 0.1 * (i % 3) for i in range(len(names))]
    shares = shares or [1.0 / (i + 1) for i in range(len(names))]
    return {"layers": {n: {"error_rate": float(e), "norm_share": float(s)}
                       for n, e, s in zip(names, error_rates, shares)},
            "layer_names": list(names)}


def tiny_train_config(method: str = "dp_sgd", **overrides):
    """The loop's configuration for the 6-feature, 3-class records of ``gaussian_records``:
    an 8-wide MLP, epsilon 4, B = 10, 2 epochs, on the CPU (lm_dp_sgd gets a hand-made risk)."""
    from dpclip.train import TrainConfig

    base = dict(method=method, target_epsilon=4.0, delta=1e-5, accountant="rdp", epochs=2,
                batch_size=10, lr=0.1, optimizer="sgd", momentum=0.0, clip_norm=1.0, seed=0,
                device="cpu", model="mlp", hidden=(8,),
                shadow_risk=shadow_risk_for(["fc1", "head"]))
    return TrainConfig.of(**{**base, **overrides})


def gaussian_records(n: int, seed: int = 0) -> tuple:
    """n records of 6 standard-normal features and labels in {0, 1, 2} (signal-free data for
    the training-loop tests)."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 6)).astype(np.float32), rng.integers(0, 3, size=n)


def docs_example(page: str, index: int = 0) -> str:
    """A Python block of a documentation page (``adding-a-method.md``): the first, or the
    ``index``-th counted from 0 (``adding-a-run-kind.md``'s method is its second)."""
    text = (PROJECT / "docs" / page).read_text()
    return re.findall(r"```python\n(.*?)```", text, re.S)[index]


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """``plugin(package, name, source)``: the module ``source`` saved as ``name`` in a folder
    that the registry package ``package`` (dotted) searches, and discovered there, as a user's
    own module would be; the registry and ``sys.modules`` forget it afterwards."""
    saved = []  # (package module, its registry, the module's sys.modules entry) before

    def drop(package: str, name: str, source: str) -> str:
        module = importlib.import_module(package)
        folder = tmp_path / f"plugins-{package}"
        folder.mkdir(exist_ok=True)
        (folder / f"{name}.py").write_text(source)
        saved.append((module, dict(module.REGISTRY), name,
                      sys.modules.get(f"{package}.{name}")))
        monkeypatch.setattr(module, "__path__", [*module.__path__, str(folder)])
        module.discover()  # a user's own module of that name (saved in src/) stays the one
        return name

    yield drop
    for module, registry, name, loaded in reversed(saved):  # exactly as before the test
        module.REGISTRY.clear()
        module.REGISTRY.update(registry)
        if loaded is None:
            sys.modules.pop(f"{module.__name__}.{name}", None)
        else:
            sys.modules[f"{module.__name__}.{name}"] = loaded
