"""``dpclip bench``: each method's median training step against ``dp_sgd``, in one run.

Speed on a shared machine is only comparable within one run, so the methods are timed
round-robin on the same model, data and Poisson batches (same seed), and each is reported as a
ratio to dp_sgd's median step. Peak memory is each method's working memory per step, measured
in a fresh subprocess after warm-up steps, as a ratio too: on CPU, the peak growth of the
resident set size (sampled every millisecond) over the warmed-up level, with glibc's mmap
threshold lowered so that every freed tensor over 16 KiB goes back to the system (else the
allocator keeps it and the growth reads 0); on a GPU, ``torch.cuda.max_memory_allocated`` over
the allocated level. Weights, data and library code are shared by all methods and left out. For a
method with a periodic probe (``Method.probe_cost``) the probe's share of the step time at its
configured period is reported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pandas as pd
import torch

from dpclip.config import Params
from dpclip.errors import DpclipError
from dpclip.io import read_json, write_json, write_text
from dpclip.layout import Layout
from dpclip.methods import Method, get_method
from dpclip.stages.prepare import load_split
from dpclip.stages.train import train_config
from dpclip.train import build_run


def _data(layout: Layout):
    x, y, _ = load_split(layout, "target_train")
    meta = read_json(layout.prepared_meta)
    return x, y, tuple(meta["feature_shape"]), int(meta["n_classes"])


def _runner(params: Params, layout: Layout, method: str, x, y, shape, n_classes):
    cfg = train_config(params, method, params.privacy.target_epsilons[0], 0, layout)
    cfg = cfg.with_train(epochs=1_000)  # a long plan, so the budget never stops the benchmark
    run = build_run(shape, n_classes, len(x), cfg)
    return run, torch.as_tensor(x, device=run.device), torch.as_tensor(y, device=run.device)


def _batches(n: int, q: float, steps: int, seed: int = 0) -> list[list[int]]:
    gen = np.random.default_rng(seed)
    return [np.flatnonzero(gen.random(n) < q).tolist() for _ in range(steps)]


def time_steps(params: Params, layout: Layout, methods: list[str], steps: int,
               rounds: int = 5) -> dict[str, list[float]]:
    """Seconds per step of each method, interleaved over ``rounds`` rounds."""
    x, y, shape, n_classes = _data(layout)
    runs = {m: _runner(params, layout, m, x, y, shape, n_classes) for m in methods}
    q = next(iter(runs.values()))[0].q
    batches = _batches(len(x), q, steps * rounds)
    times: dict[str, list[float]] = {m: [] for m in methods}
    order = list(runs)
    for r in range(rounds):
        # rotate the order every round, so no method always runs first (or after another)
        for method in order[r % len(order):] + order[:r % len(order)]:
            run, xt, yt = runs[method]
            for batch in batches[r * steps:(r + 1) * steps]:
                if not batch:
                    continue
                tic = time.perf_counter()
                _step(run, xt, yt, batch)
                if run.device.type == "cuda":
                    torch.cuda.synchronize()
                times[method].append(time.perf_counter() - tic)
    return times


def _step(run, x, y, batch):
    if hasattr(run, "guard"):
        run.step(x, y, batch, epoch=1)
    else:
        from dpclip.train.step import plain_step

        idx = torch.as_tensor(batch, device=run.device)
        plain_step(run.model, run.loss_fn, x[idx], y[idx], run.optimizer)


def probe_share(params: Params, layout: Layout, method: str, steps: int) -> dict | None:
    """A method's probe time over its step time at the configured probe period (None: the
    method has no probe)."""
    x, y, shape, n_classes = _data(layout)
    run, xt, yt = _runner(params, layout, method, x, y, shape, n_classes)
    if run.method.probe_cost() is None:
        return None
    total = 0.0
    for batch in _batches(len(x), run.q, steps, seed=1):
        if batch:
            tic = time.perf_counter()
            run.step(xt, yt, batch, epoch=1)
            total += time.perf_counter() - tic
    cost = run.method.probe_cost()
    return {"probe_every": cost["every"], "probe_s": cost["seconds"], "train_s": total,
            "share": cost["seconds"] / total if total else float("nan")}


def _has_probe(method: str) -> bool:
    return get_method(method).probe_cost is not Method.probe_cost


def peak_memory(params_path: str, root: str, method: str, steps: int) -> float:
    """Peak memory (MiB) of ``steps`` steps of one method, in a fresh process."""
    code = ("import sys, json; from dpclip.bench import _child_memory; "
            "print(json.dumps(_child_memory(*sys.argv[1:])))")
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(16 * 1024)}
    out = subprocess.run([sys.executable, "-c", code, params_path, root, method, str(steps)],
                         capture_output=True, text=True, check=True, env=env)
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def _child_memory(params_path: str, root: str, method: str, steps: str) -> float:
    from dpclip.config import load_params

    params = load_params(params_path)
    layout = Layout(__import__("pathlib").Path(root))
    x, y, shape, n_classes = _data(layout)
    run, xt, yt = _runner(params, layout, method, x, y, shape, n_classes)
    batches = [b for b in _batches(len(x), run.q, _WARM_UP + int(steps)) if b]
    for batch in batches[:_WARM_UP]:
        _step(run, xt, yt, batch)
    if run.device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        for batch in batches[_WARM_UP:]:
            _step(run, xt, yt, batch)
        return (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    with _RssPeak() as peak:
        for batch in batches[_WARM_UP:]:
            _step(run, xt, yt, batch)
    return peak.growth_mib


# steps before the memory baseline: optimizer state and lazy library loads, including the
# first run of every periodic controller at its default period (the WW probe, K = 50)
_WARM_UP = 60


class _RssPeak:
    """Samples the resident set size every millisecond in a thread; ``growth_mib`` is the
    peak over the level when sampling started (CPU allocations are invisible to torch)."""

    def __enter__(self):
        import psutil

        self._proc = psutil.Process()
        self._base = self._proc.memory_info().rss
        self._peak = self._base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.is_set():
            self._peak = max(self._peak, self._proc.memory_info().rss)
            time.sleep(0.001)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._peak = max(self._peak, self._proc.memory_info().rss)
        self.growth_mib = (self._peak - self._base) / 2 ** 20
        return False


def bench(params: Params, layout: Layout, params_path: str, methods: list[str] | None = None,
          steps: int = 20, rounds: int = 15) -> pd.DataFrame:
    methods = list(methods or params.train.methods)
    if "dp_sgd" not in methods:
        methods.insert(0, "dp_sgd")
    for m in methods:
        get_method(m)  # unknown names fail here
    if not layout.split("target_train").exists():
        raise DpclipError("bench needs the prepared data: run `dpclip prepare` first")
    times = time_steps(params, layout, methods, steps, rounds)
    # at least 100 steps, so that the WW probe (every K = 50 steps) falls among them
    memory = {m: peak_memory(params_path, str(layout.root), m, max(steps, 100))
              for m in methods}
    base_t = float(np.median(times["dp_sgd"]))
    base_m = memory["dp_sgd"]
    rows = [{"method": m, "step_ms_median": 1000 * float(np.median(times[m])),
             "ratio_to_dp_sgd": float(np.median(times[m])) / base_t,
             "peak_mib": memory[m], "memory_ratio": memory[m] / base_m if base_m > 0 else None,
             "steps_timed": len(times[m])} for m in methods]
    table = pd.DataFrame(rows)
    result = {"table": rows}
    probes = {m: probe_share(params, layout, m, steps=max(200, steps * rounds))
              for m in methods if _has_probe(m)}
    probes = {m: share for m, share in probes.items() if share is not None}
    if probes:
        result["probes"] = probes
    out = layout.reports
    write_json(out / "bench.json", result)
    text = table.to_markdown(index=False, floatfmt=".3f") if _has_tabulate() else \
        table.to_string(index=False)
    extra = ""
    for method, w in result.get("probes", {}).items():
        extra += (f"\n\n{method} probe at K = {w['probe_every']}: {w['probe_s']:.4f} s of "
                  f"{w['train_s']:.3f} s of steps = {100 * w['share']:.2f}%\n")
    write_text(out / "bench.md", "# dpclip bench\n\n" + text + extra)
    return table


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
        return True
    except ImportError:
        return False
