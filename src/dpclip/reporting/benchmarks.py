"""Claims about cost, checked against a committed ``dpclip bench`` measurement instead of runs.

A claim with ``rule: benchmark`` names a check (:data:`CHECKS`: ``probe_share``, WW-DP-SGD's
probe time over its training time; ``step_ratio``, a method's median step over a baseline's)
and the ``bench.json`` it reads (``file``, relative to the project root);
:func:`dpclip.reporting.evidence.judge` turns it into "held by the benchmark" or "contradicted
by the benchmark". A timing is one machine's. The checks: docs/presets.md,
"Claims about cost: measured by `dpclip bench`, not run".
"""

from __future__ import annotations

from pathlib import Path

from dpclip.errors import DpclipError
from dpclip.files import read_json
from dpclip.claim_checks import Check, positive_number


def bench_path(spec: dict, project: Path) -> Path:
    """The bench output a check reads (it may not exist yet: the claim is then untested)."""
    file = spec.get("file") if isinstance(spec, dict) else None
    if not isinstance(file, str) or not file:
        raise DpclipError(f"benchmark check {spec.get('check')!r}: file must name the "
                          f"bench.json to read, not {file!r}")
    return project / file


def _bench(spec: dict, project: Path) -> dict:
    path = bench_path(spec, project)
    if not path.is_file():
        raise DpclipError(f"benchmark check {spec.get('check')!r}: {path} does not exist")
    bench = read_json(path)
    if not isinstance(bench, dict) or not isinstance(bench.get("table", []), list):
        raise DpclipError(f"{path}: not a `dpclip bench` output (a mapping with a table)")
    return bench


def _steps(bench: dict, model: str, path: str) -> dict:
    """{method: median step in ms} of the bench's table for ``model``, each checked."""
    steps = {}
    for row in bench.get("table", []):
        if isinstance(row, dict) and row.get("model") == model:
            steps[row.get("method")] = positive_number(
                row, "step_ms_median", f"{path}: {model}/{row.get('method')}")
    return steps


def _setting(bench: dict) -> str:
    setting = bench.get("setting") or {}
    return "measured by `dpclip bench` on " + ", ".join(
        f"{k} {setting[k]}" for k in ("device", "threads", "dataset", "batch_size")
        if k in setting)


def probe_share(spec: dict, project: Path) -> Check:
    """The method's probe time over its training time against the paper's overhead, a
    fraction below 1 (docs/presets.md, "Claims about cost: measured by `dpclip bench`, not
    run")."""
    what = "benchmark check 'probe_share'"
    bench = _bench(spec, project)
    method, model = spec.get("method"), spec.get("model")
    bound = positive_number(spec, "bound", what)
    if bound >= 1:
        raise DpclipError(f"{what}: bound is the paper's overhead as a fraction below 1 "
                          f"(1.79% is 0.0179), not {bound!r}")
    key = f"{model}/{method}"
    probe = (bench.get("probes") or {}).get(key)
    if not isinstance(probe, dict):
        raise DpclipError(f"{what}: the bench has no probe share for {key!r} "
                          f"(it has {sorted(bench.get('probes') or {})})")
    probe_s = positive_number(probe, "probe_s", f"{what}, {key}")
    train_s = positive_number(probe, "train_s", f"{what}, {key}")
    share = probe_s / train_s
    lines = [f"{method}'s probe on {model}, once every K = {probe.get('probe_every', '?')} "
             f"steps: {probe_s:.4g} s of {train_s:.3g} s of training steps "
             f"({probe.get('steps', '?')} timed), {100 * share:.3g}% of the training time, "
             f"against the paper's {100 * bound:.3g}%", _setting(bench)]
    steps = _steps(bench, model, key)
    if "dp_sgd" in steps and method in steps:
        lines.append(f"the two steps, interleaved (median ms): dp_sgd {steps['dp_sgd']:.3g}, "
                     f"{method} {steps[method]:.3g}, ratio {steps[method] / steps['dp_sgd']:.3g}"
                     f" (the probe's share is not in the median step)")
    holds = share <= bound
    return Check(bound, share, holds, lines, summary=(
        f"the probe costs {100 * share:.3g}% of the training time on this machine, "
        + ("within" if holds else "above") + f" the paper's {100 * bound:.3g}%"))


def step_ratio(spec: dict, project: Path) -> Check:
    """The method's median step time over the baseline's, both timed in the same interleaved
    rounds, against the paper's ratio of its per-iteration times (docs/presets.md)."""
    what = "benchmark check 'step_ratio'"
    bench = _bench(spec, project)
    method, baseline, model = spec.get("method"), spec.get("baseline"), spec.get("model")
    bound = positive_number(spec, "bound", what)
    steps = _steps(bench, model, spec["file"])
    missing = [m for m in (method, baseline) if m not in steps]
    if missing:
        raise DpclipError(f"{what}: the bench timed no {missing} on {model!r} "
                          f"(it has {sorted(steps)})")
    ours = steps[method] / steps[baseline]
    rounds = (bench.get("setting") or {}).get("rounds", "?")
    lines = [f"median step on {model} (ms, interleaved in {rounds} rounds): "
             + ", ".join(f"{m} {ms:.3g}" for m, ms in steps.items()),
             f"{method} / {baseline} = {ours:.3g}, against the paper's {bound:g}",
             _setting(bench)]
    holds = ours <= bound
    return Check(bound, ours, holds, lines, summary=(
        f"{method}'s step takes {ours:.3g} times {baseline}'s on this machine, "
        + ("within" if holds else "above") + f" the paper's {bound:g}"))


CHECKS = {"probe_share": probe_share, "step_ratio": step_ratio}


def run_check(spec: dict, project: Path) -> Check:
    """The check ``spec["check"]`` on the bench output below ``project``."""
    check = spec.get("check") if isinstance(spec, dict) else None
    if check not in CHECKS:
        raise DpclipError(f"benchmark check {check!r} is not one of {list(CHECKS)}")
    return CHECKS[check](spec, project)
