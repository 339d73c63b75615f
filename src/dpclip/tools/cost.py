"""What training will cost, measured before it starts: the median step time of each method on
the prepared data, times the steps its runs plan (:func:`training_cost`), for the presets and
``dpclip advise`` to say how long they will take; and the step set-up ``dpclip bench`` shares."""

from __future__ import annotations

import time

import numpy as np
import torch

from dpclip.audit.status import why_not_audited
from dpclip.config import Params
from dpclip.files import read_json
from dpclip.layout import Layout
from dpclip.methods import get_method
from dpclip.models import layer_names
from dpclip.pipeline.inputs import load_public, needs_public, train_config
from dpclip.stage_outputs import load_split
from dpclip.train import TrainConfig, build_run
from dpclip.train.step import plain_step


def target_data(layout: Layout):
    """The prepared target train split: records, labels, feature shape and class count."""
    x, y, _ = load_split(layout, "target_train")
    meta = read_json(layout.prepared_meta)
    return x, y, tuple(meta["feature_shape"]), int(meta["n_classes"])


def bench_config(params: Params, layout: Layout, method: str) -> TrainConfig:
    """The run's configuration; a method that reads the shadow stage's per-layer risks gets
    neutral ones (every layer at error rate 0.5, equal norm shares) instead, so that one bench
    covers several architectures without a shadow run each: the values change no step's cost."""
    epsilon = params.privacy.target_epsilons[0]
    if not get_method(method).needs_shadow_risk:
        return train_config(params, method, epsilon, 0, layout, tuned=False)  # step cost only
    t = params.train
    _, _, shape, n_classes = target_data(layout)
    layers = layer_names(t.model, t.hidden, shape, n_classes)
    neutral = {"layers": {name: {"error_rate": 0.5, "norm_share": 1.0 / len(layers)}
                          for name in layers}}
    return TrainConfig(method, float(epsilon), 0, t, params.privacy,
                       params.method_options(method), neutral)


def step_function(run, xt, yt, epoch: int = 1):
    """One step of ``run`` on a batch (record positions): a private run kind's DP step (it has
    a budget guard), any other run kind's plain step."""
    if hasattr(run, "guard"):
        return lambda batch: run.step(xt, yt, batch, epoch=epoch)

    def step(batch):
        idx = torch.as_tensor(batch, device=run.device)
        plain_step(run.model, run.loss_fn, xt[idx], yt[idx], run.optimizer)
    return step


def poisson_batches(n: int, q: float, steps: int, seed: int = 0) -> list[list[int]]:
    """``steps`` Poisson batches of ``n`` records at rate ``q`` (empty ones left out)."""
    gen = np.random.default_rng(seed)
    return [b for b in (np.flatnonzero(gen.random(n) < q).tolist() for _ in range(steps)) if b]


def training_cost(params: Params, layout: Layout, keys: list, steps: int = 3) -> dict:
    """The expected training time of the runs ``keys`` on this machine, before they train:
    per method, its run's set-up (a public pre-training, when there is one) plus its steps per
    run (the run's own plan) times its median step time, measured now on the prepared data
    (``steps`` steps after one warm-up). A private run times its DP step at its Poisson batch;
    any other run kind a plain step at its own batch size (for ``sanitize``'s class-mean head
    an upper bound). ``seconds_all`` adds the other models each run trains, each at the run's
    cost: one per audit kind (runs with a DP claim; trained on the members plus canaries) and
    ``attack.references`` (trained on half a population, or of members and holdout), so an
    estimate, not a bound. Evaluation is not included.
    Returns {"runs", "seconds", "seconds_all", "methods": {method: {"runs", "steps_per_run",
    "step_s", "setup_s", "models_per_run"}}}."""
    x, y, shape, n_classes = target_data(layout)
    methods: dict[str, dict] = {}
    for method in sorted({key.method for key in keys}):
        cfg = bench_config(params, layout, method)
        tic = time.perf_counter()
        run = build_run(shape, n_classes, len(x), cfg,
                        load_public(layout) if needs_public(cfg) else None)
        setup_s = time.perf_counter() - tic
        xt = torch.as_tensor(x, dtype=torch.float32, device=run.device)
        yt = torch.as_tensor(y, dtype=torch.int64, device=run.device)
        step = step_function(run, xt, yt)
        if hasattr(run, "guard"):  # a private run kind: its DP step on Poisson batches
            batches = poisson_batches(len(x), run.q, steps + 1)
        else:  # plain and sanitize runs: shuffled batches of their own size
            size = min(run.cfg.train.batch_size, len(x))
            order = np.random.default_rng(0).permutation(len(x))
            batches = [order[i * size:(i + 1) * size] for i in range(steps + 1)]
        step(batches[0])  # warm-up
        times = []
        for batch in batches[1:]:
            tic = time.perf_counter()
            step(batch)
            times.append(time.perf_counter() - tic)
        options = params.method_options(method)
        audits = sum(why_not_audited(method, options, kind) is None
                     for kind in params.audit.kinds)
        methods[method] = {"runs": sum(key.method == method for key in keys),
                           "steps_per_run": int(run.total_steps),
                           "step_s": float(np.median(times)), "setup_s": setup_s,
                           "models_per_run": 1 + audits + params.attack.references}
    per_run = {name: m["steps_per_run"] * m["step_s"] + m["setup_s"]
               for name, m in methods.items()}
    seconds = sum(m["runs"] * per_run[name] for name, m in methods.items())
    seconds_all = sum(m["runs"] * m["models_per_run"] * per_run[name]
                      for name, m in methods.items())
    return {"runs": len(keys), "seconds": seconds, "seconds_all": seconds_all,
            "methods": methods}


def cost_text(cost: dict) -> str:
    """One line: how many runs, about how long, and from what."""
    if not cost["runs"]:
        return "expected training: none, every run is up to date"
    parts = ", ".join(f"{name} {m['runs']} x {m['steps_per_run']} steps x "
                      f"{1000 * m['step_s']:.1f} ms"
                      + (f" (+ {m['setup_s']:.0f} s set-up)" if m["setup_s"] >= 1 else "")
                      for name, m in cost["methods"].items())
    text = (f"expected training: {cost['runs']} runs, about {cost['seconds'] / 60:.1f} min on "
            f"this machine ({parts}; step times measured now")
    models = {m["models_per_run"] for m in cost["methods"].values()}
    if cost.get("seconds_all", cost["seconds"]) > cost["seconds"]:
        text += (f"); with the audit and reference models each run also trains "
                 f"({'/'.join(map(str, sorted(models)))} models a run in all), about "
                 f"{cost['seconds_all'] / 60:.1f} min")
    return text + "; evaluation not included)"
