"""``dpclip bench``: every method's median training step against two anchors, in one run.

Speed on a shared machine is only comparable within one run, so the methods are timed
round-robin on the same model, data and Poisson batches, each as a ratio to the non-private
step and to ``dp_sgd``, beside Opacus's ghost clipping (``opacus_ghost``); peak working memory
per step is measured in a fresh subprocess, and a periodic probe's share of the step time
(``Method.probe_cost``) is reported. How: docs/measurements.md, "Speed: dpclip bench".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from dpclip.config import Params
from dpclip.errors import DpclipError
from dpclip.files import write_json, write_text
from dpclip.layout import Layout
from dpclip.methods import Method, get_method
from dpclip.models import build_model
from dpclip.pipeline.params import load_params
from dpclip.train import build_run
from dpclip.train.runs import run_class
from dpclip.tools.cost import bench_config, poisson_batches, step_function, target_data


# the anchors: timed with the methods, not methods themselves
NON_PRIVATE, OPACUS_GHOST = "non_private", "opacus_ghost"


def with_model(params: Params, model: str | None = None, hidden: list[int] | None = None,
               batch_size: int | None = None) -> Params:
    """``params`` with train.model, train.hidden and train.batch_size replaced where given."""
    update = {k: v for k, v in {"model": model, "hidden": hidden,
                                "batch_size": batch_size}.items() if v is not None}
    return params.model_copy(update={"train": params.train.model_copy(update=update)})


def _runner(params: Params, layout: Layout, method: str, x, y, shape, n_classes):
    cfg = bench_config(params, layout, method)
    cfg = cfg.with_train(epochs=1_000)  # a long plan, so the budget never stops the benchmark
    run = build_run(shape, n_classes, len(x), cfg)
    return run, torch.as_tensor(x, device=run.device), torch.as_tensor(y, device=run.device)


def _stepper(params: Params, layout: Layout, name: str, data):
    """(step(batch), device, q) of a method or an anchor, on the same model architecture."""
    x, y, shape, n_classes = data
    if name == OPACUS_GHOST:
        return _opacus_ghost(params, layout, data)
    run, xt, yt = _runner(params, layout, name, x, y, shape, n_classes)
    return step_function(run, xt, yt), run.device, run.q


def _opacus_ghost(params: Params, layout: Layout, data):
    """Opacus's DP-SGD with ghost clipping on dp_sgd's model, C, sigma and learning rate."""
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    x, y, shape, n_classes = data
    reference, xt, yt = _runner(params, layout, "dp_sgd", x, y, shape, n_classes)
    model = build_model(params.train.model, shape, n_classes, list(params.train.hidden))
    model.to(reference.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=params.train.lr)
    loader = DataLoader(TensorDataset(xt, yt), batch_size=params.train.batch_size)
    model, optimizer, criterion, _ = PrivacyEngine(accountant="rdp").make_private(
        module=model, optimizer=optimizer, data_loader=loader, criterion=nn.CrossEntropyLoss(),
        noise_multiplier=reference.sigma_train, max_grad_norm=params.train.clip_norm,
        grad_sample_mode="ghost", poisson_sampling=True)

    def step(batch):
        idx = torch.as_tensor(batch, device=reference.device)
        optimizer.zero_grad(set_to_none=True)
        criterion(model(xt[idx]), yt[idx]).backward()
        optimizer.step()
    return step, reference.device, reference.q


def time_steps(params: Params, layout: Layout, names: list[str], steps: int,
               rounds: int = 5) -> dict[str, list[float]]:
    """Seconds per step of each method or anchor, interleaved over ``rounds`` rounds."""
    data = target_data(layout)
    steppers = {name: _stepper(params, layout, name, data) for name in names}
    _, device, q = next(iter(steppers.values()))
    batches = poisson_batches(len(data[0]), q, steps * rounds)
    times: dict[str, list[float]] = {name: [] for name in names}
    for name, (step, _, _) in steppers.items():  # warm-up: lazy loads, first allocations
        for batch in batches[:2]:
            step(batch)
    for r in range(rounds):
        # rotate the order every round, so no method always runs first (or after another)
        for name in names[r % len(names):] + names[:r % len(names)]:
            step = steppers[name][0]
            for batch in batches[r * steps:(r + 1) * steps]:
                tic = time.perf_counter()
                step(batch)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times[name].append(time.perf_counter() - tic)
    return times


PAPER_SCALE = 60_000  # records in an epoch of full MNIST's training set


def epoch_throughput(params: Params, layout: Layout, method: str = "dp_sgd",
                     rounds: int = 1) -> list[dict]:
    """Records per second of whole epochs over the prepared target train split, as training
    runs them: the run's own epoch loop (Poisson batches, the budget guard, the trace) for
    ``non_private`` and ``method``; Opacus's ghost clipping stepping through as many Poisson
    batches. Each is timed over ``rounds`` epochs, alternating, after two warm-up steps; the
    time of an epoch of :data:`PAPER_SCALE` records follows from the rate."""
    from tqdm import tqdm

    data = target_data(layout)
    x, y, shape, n_classes = data
    runs = {name: _runner(params, layout, name, x, y, shape, n_classes)
            for name in (NON_PRIVATE, method)}
    ghost, device, q = _opacus_ghost(params, layout, data)
    steps = max(1, round(1 / q))
    batches = poisson_batches(len(x), q, steps * rounds + 2, seed=1)
    seconds = dict.fromkeys([NON_PRIVATE, OPACUS_GHOST, method], 0.0)
    for run, xt, yt in runs.values():  # warm-up: lazy loads, first allocations
        for batch in batches[:2]:
            step_function(run, xt, yt, epoch=0)(batch)
    for batch in batches[:2]:
        ghost(batch)
    bar = tqdm(disable=True)
    for r in range(rounds):
        for name in seconds:
            tic = time.perf_counter()
            if name == OPACUS_GHOST:
                for batch in batches[2 + r * steps:2 + (r + 1) * steps]:
                    ghost(batch)
            else:
                run, xt, yt = runs[name]
                run.run_epoch(xt, yt, r + 1, bar)
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds[name] += time.perf_counter() - tic
    floor = seconds[NON_PRIVATE]
    return [{"method": name, "records_per_s": len(x) * rounds / s,
             "epoch_s": s / rounds, f"epoch_s_{PAPER_SCALE}": PAPER_SCALE * s / (len(x) * rounds),
             "ratio_to_non_private": s / floor} for name, s in seconds.items()]


def probe_share(params: Params, layout: Layout, method: str, steps: int) -> dict | None:
    """A method's probe time over its step time at the configured probe period (None: the
    method has no probe)."""
    x, y, shape, n_classes = target_data(layout)
    run, xt, yt = _runner(params, layout, method, x, y, shape, n_classes)
    if run.method.probe_cost() is None:
        return None
    batches = poisson_batches(len(x), run.q, steps + 2, seed=1)
    for batch in batches[:2]:  # warm-up (lazy loads, first allocations), not timed
        run.step(xt, yt, batch, epoch=1)
    before = run.method.probe_cost()["seconds"]
    total = 0.0
    for batch in batches[2:]:
        tic = time.perf_counter()
        run.step(xt, yt, batch, epoch=1)
        total += time.perf_counter() - tic
    cost = run.method.probe_cost()
    probe = cost["seconds"] - before
    return {"probe_every": cost["every"], "steps": steps, "probe_s": probe, "train_s": total,
            "share": probe / total if total else float("nan")}


def peak_memory(params_path: str, root: str, name: str, steps: int, model: str,
                hidden: list[int], batch_size: int) -> float:
    """Peak memory (MiB) of ``steps`` steps of one method or anchor, in a fresh process."""
    code = ("import sys, json; from dpclip.tools.bench import _child_memory; "
            "print(json.dumps(_child_memory(*sys.argv[1:])))")
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(16 * 1024)}
    spec = json.dumps({"model": model, "hidden": hidden, "batch_size": batch_size})
    out = subprocess.run([sys.executable, "-c", code, params_path, root, name, str(steps), spec],
                         capture_output=True, text=True, check=True, env=env)
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def _child_memory(params_path: str, root: str, name: str, steps: str, spec: str) -> float:
    params = with_model(load_params(params_path), **json.loads(spec))
    layout = Layout(Path(root))
    data = target_data(layout)
    step, device, q = _stepper(params, layout, name, data)
    batches = poisson_batches(len(data[0]), q, _WARM_UP + int(steps))
    for batch in batches[:_WARM_UP]:
        step(batch)
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        for batch in batches[_WARM_UP:]:
            step(batch)
        return (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    with _RssPeak() as peak:
        for batch in batches[_WARM_UP:]:
            step(batch)
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
          steps: int = 10, rounds: int = 5, models: list[str] | None = None,
          hidden: list[int] | None = None, batch_size: int | None = None,
          memory: bool = True, epoch: bool = False) -> pd.DataFrame:
    """The table of every method and both anchors, per model; written to reports/bench.*.
    With ``epoch``, also the records per second of whole epochs of
    the non-private run, ``dp_sgd`` and Opacus's ghost clipping (:func:`epoch_throughput`)."""
    methods = [m for m in (methods or params.train.methods) if m != NON_PRIVATE]
    if "dp_sgd" not in methods:
        methods.insert(0, "dp_sgd")
    # a method whose run has no per-batch DP step (sanitize: noise on activations, a forward
    # pass per batch) has nothing comparable to time; unknown names fail here
    not_timed = [m for m in methods if not hasattr(run_class(get_method(m).run_kind), "step")]
    methods = [m for m in methods if m not in not_timed]
    if not layout.split("target_train").exists():
        raise DpclipError("bench needs the prepared data: run `dpclip prepare` first")
    names = [NON_PRIVATE, OPACUS_GHOST, *methods]
    rows, probes, epochs = [], {}, {}
    for model in models or [params.train.model]:
        p = with_model(params, model, hidden, batch_size)
        times = time_steps(p, layout, names, steps, rounds)
        if epoch:
            epochs[model] = epoch_throughput(p, layout, "dp_sgd")
        # at least 100 steps, so that the WW probe (every K = 50 steps) falls among them
        mem = {n: peak_memory(params_path, str(layout.root), n, max(steps, 100), model,
                              list(p.train.hidden), p.train.batch_size) if memory else None
               for n in names}
        floor, dp_sgd = (float(np.median(times[n])) for n in (NON_PRIVATE, "dp_sgd"))
        for n in names:
            median = float(np.median(times[n]))
            rows.append({"model": model, "method": n, "step_ms_median": 1000 * median,
                         "ratio_to_non_private": median / floor,
                         "ratio_to_dp_sgd": median / dp_sgd, "peak_mib": mem[n],
                         "memory_ratio_to_dp_sgd": (mem[n] / mem["dp_sgd"]
                                                    if memory and mem["dp_sgd"] > 0 else None),
                         "steps_timed": len(times[n])})
        for m in methods:
            share = probe_share(p, layout, m, steps=max(200, steps * rounds)) \
                if get_method(m).probe_cost is not Method.probe_cost else None
            if share is not None:
                probes[f"{model}/{m}"] = share
    table = pd.DataFrame(rows)
    device = "cuda" if torch.cuda.is_available() and params.train.device != "cpu" else "cpu"
    setting = {"device": device, "threads": torch.get_num_threads(),
               "batch_size": batch_size or params.train.batch_size,
               "hidden": hidden or list(params.train.hidden), "steps": steps, "rounds": rounds,
               "dataset": params.data.dataset}
    result = {"setting": setting, "table": rows, **({"probes": probes} if probes else {}),
              **({"epochs": epochs} if epochs else {}),
              **({"not_timed": not_timed} if not_timed else {})}
    out = layout.reports
    write_json(out / "bench.json", result)
    text = table.to_markdown(index=False, floatfmt=".3f")  # tabulate: a dependency of DVC's
    extra = ""
    for method, w in probes.items():
        extra += (f"\n\n{method} probe at K = {w['probe_every']}: {w['probe_s']:.4f} s of "
                  f"{w['train_s']:.3f} s of steps = {100 * w['share']:.2f}%\n")
    header = ", ".join(f"{k} {v}" for k, v in setting.items())
    if not_timed:
        extra += (f"\n\nNot timed (no per-batch DP step to compare): {', '.join(not_timed)}\n")
    for model, model_epochs in epochs.items():
        frame = pd.DataFrame(model_epochs)
        extra += (f"\n\n## Whole epochs ({model}, {len(target_data(layout)[0])} records)\n\n" +
                  frame.to_markdown(index=False, floatfmt=".3f") + "\n")
    write_text(out / "bench.md", f"# dpclip bench\n\n{header}\n\n" + text + extra)
    return table
