"""reference: the reference models of LiRA and RMIA for one configuration
(:mod:`dpclip.attacks.lira`, :mod:`dpclip.attacks.rmia`).

``attack.references`` models are trained like the target (its code and configuration, a seed
of their own each, its sampling rate q = B / n, so its T steps at its sigma): offline on the
public pool, online on complementary halves of the members and the holdout. The models are not
kept: ``references/<run>/signals.npz`` holds their logits on the members, holdout and
population with which records each trained on, and ``reference.json`` each model's privacy
record. Pools, overlaps and shapes: docs/attacks.md, "Reference models, trained like the target".
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np

from dpclip.stage_outputs import load_split, population_source, public_population
from dpclip.config import Params
from dpclip.files import write_json, write_npz
from dpclip.layout import Layout
from dpclip.models import logits_of
from dpclip.run_keys import RunKey
from dpclip.catalog import BY_NAME
from dpclip.pipeline import provenance
from dpclip.threads import use_threads
from dpclip.methods import get_method
from dpclip.train import train_model
from dpclip.train.runs import run_class
from dpclip.pipeline.inputs import run_inputs

STAGE = BY_NAME["reference"]


def reference_seed(params: Params, run: str, what: str) -> int:
    """A seed of the run's reference models (the pool's halves, or model k's training),
    from ``data.seed``, the run and ``what``: every run's references differ."""
    text = f"{params.data.seed}:{run}:reference:{what}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:4], "big") >> 1  # < 2^31


def first_and_last(n: int, size: int, k: int, seed: int) -> np.ndarray:
    """(k, n) booleans: model 2j trains on the first ``size`` records of the j-th random
    permutation of the n pool records, model 2j+1 on its last ``size`` (disjoint when
    n >= 2 size, sharing 2 size - n records otherwise)."""
    if k % 2:
        raise ValueError(f"reference models come in pairs: {k} is odd")
    if not 0 < size <= n:
        raise ValueError(f"a reference set of {size} records from a pool of {n}")
    rng = np.random.default_rng(seed)
    inside = np.zeros((k, n), dtype=bool)
    for j in range(k // 2):
        order = rng.permutation(n)
        inside[2 * j, order[:size]] = True
        inside[2 * j + 1, order[n - size:]] = True
    return inside


def topped_up(records: np.ndarray, size: int, seed: int) -> np.ndarray:
    """``records`` (pool positions), with as many of them drawn a second time as ``size``
    exceeds their number (without replacement while it can): a pool a few records smaller than
    the target's set still gives reference models of the target's size n (docs/attacks.md)."""
    missing = size - len(records)
    if missing <= 0:
        return records
    rng = np.random.default_rng(seed)
    again = rng.choice(records, missing, replace=missing > len(records))
    return np.concatenate([records, again])


def complementary_halves(n: int, k: int, seed: int) -> np.ndarray:
    """(k, n) booleans: model 2j trains on the first half of the j-th random permutation of the
    n pool records, model 2j+1 on the rest, so each record is IN for exactly k / 2 models."""
    if k % 2:
        raise ValueError(f"reference models come in pairs: {k} is odd")
    rng = np.random.default_rng(seed)
    inside = np.zeros((k, n), dtype=bool)
    for j in range(k // 2):
        first = rng.permutation(n)[: n // 2]
        inside[2 * j, first] = True
        inside[2 * j + 1] = ~inside[2 * j]
    return inside


def reference(params: Params, method: str, epsilon, alpha, seed: int,
              layout: Layout = Layout()) -> dict:
    key = RunKey(method, epsilon, alpha, int(seed))
    run = key.name
    data = run_inputs(params, key, layout)  # the run's members, configuration, public data
    inputs = provenance.inputs(STAGE, params, key, layout, tuned=data.tuned)
    use_threads(params.train.threads)
    a = params.attack
    x_out, y_out, _ = load_split(layout, "target_holdout")
    n_m, n_h = len(data.x), len(x_out)
    # the target's plan, as its run kind made it (Poisson: q = B / n and T steps)
    method_cls = get_method(method)
    q, _, steps = run_class(method_cls.run_kind).plan(
        n_m, data.cfg, method_cls.typed_options(data.cfg.method_options))
    seed = reference_seed(params, run, "halves")
    if a.mode == "offline":
        pool_x, pool_y = public_population(params, layout)
        population = slice(0, len(pool_x))
        inside = first_and_last(len(pool_x), min(n_m, len(pool_x)), a.references, seed)
    else:
        pool_x, pool_y = np.concatenate([data.x, x_out]), np.concatenate([data.y, y_out])
        population = slice(n_m, n_m + n_h)  # the holdout: the pool's non-members of the run
        inside = complementary_halves(len(pool_x), a.references, seed)
    parts = {"members": (data.x, []), "holdout": (x_out, []), "population": (pool_x[population], [])}
    models = []
    for k in range(a.references):
        cfg = replace(data.cfg, seed=reference_seed(params, run, f"model{k}"), sample_rate=q)
        chosen = topped_up(np.flatnonzero(inside[k]), n_m if a.mode == "offline" else 0,
                           reference_seed(params, run, f"top-up{k}"))
        result = train_model(pool_x[chosen], pool_y[chosen], data.shape, data.n_classes,
                             cfg, progress=False, desc=f"{run} reference {k}",
                             public=data.public)
        for x, logits in parts.values():
            logits.append(logits_of(result.model, x))
        models.append({"seed": cfg.seed, "n_train": int(len(chosen)),
                       "repeated": int(len(chosen) - inside[k].sum()),
                       "sample_rate": result.privacy.get("sample_rate"),
                       "epsilon": result.privacy["epsilon"],
                       "noise_multiplier": result.privacy.get("noise_multiplier"),
                       "steps": result.training["steps_planned"]})
    if a.mode == "offline":
        in_members, in_holdout = np.zeros((a.references, n_m), bool), np.zeros((a.references, n_h), bool)
    else:
        in_members, in_holdout = inside[:, :n_m], inside[:, n_m:]
    folder = layout.references(run)
    write_npz(folder / "signals.npz",
              **{f"logits_{name}": np.stack(logits) for name, (_, logits) in parts.items()},
              in_members=in_members, in_holdout=in_holdout, in_population=inside[:, population])
    source = population_source(params)
    facts = {"run": run, "mode": a.mode, "references": a.references,
             "pool": source if a.mode == "offline" else "members + target_holdout",
             "pool_size": int(len(pool_x)), "population": source,
             "population_size": int(population.stop - population.start),
             "target_plan": {"n_train": n_m, "sample_rate": q, "steps": steps},
             "models": models}
    write_json(folder / "reference.json", facts)
    provenance.record(STAGE, layout, key, inputs)
    return facts


def skipped(params: Params) -> str | None:
    """Why no reference model is trained (None: they are)."""
    return None if params.attack.references else "no reference models (attack.references: 0)"


def describe(result: dict, layout: Layout) -> str:
    """The line ``dpclip reference`` prints: the reference models against the target's plan."""
    first = result["models"][0] if result["models"] else {}
    plan = result["target_plan"]
    return (f"{result['references']} {result['mode']} reference models of "
            f"{first.get('n_train')} records each (the target: {plan['n_train']}), "
            f"q={plan['sample_rate']:.4g}, {plan['steps']} steps, from {result['pool_size']} "
            f"records ({result['pool']})")
