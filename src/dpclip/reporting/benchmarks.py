"""Claims about cost, checked against a committed ``dpclip bench`` measurement instead of runs.

A claim with ``rule: benchmark`` names a check and the bench output it reads (``file``, the
``bench.json`` that ``dpclip bench`` writes, relative to the results folder's parent, e.g.
``benchmarks/table14/bench.json``); :func:`dpclip.reporting.evidence.judge` turns the check into
"held by the benchmark" or "contradicted by the benchmark". A timing is one machine's: the
check says which (the bench's own ``setting``) and the claim's note says how it was measured.

* ``probe_share`` (WW-DP-SGD's runtime overhead): WW-DP-SGD's step is DP-SGD's step at another
  threshold C_t (the same operations, one scalar controller update), plus its probe: once every
  K steps, a spectral fit of one layer's weights. Its overhead over DP-SGD is therefore the
  probe's time over the training time, share = t_probe / t_steps, which the bench measures
  directly (``probes``: the probes' seconds within 200 or more timed steps at the configured
  K) rather than as the difference of two step times, which on a shared machine spreads by
  more than the probe costs. The claim holds when share <= ``bound``, the paper's overhead as
  a fraction. The interleaved step times of both methods are shown beside it.
* ``step_ratio`` (a method's time per iteration against a baseline's): the median step of
  ``method`` over that of ``baseline``, timed by the bench in the same interleaved rounds (so
  the machine's drift falls on both), against ``bound``, the paper's ratio of its own
  per-iteration times. Holds when ours <= bound: the method costs no more, relative to the
  baseline, than the paper reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dpclip.errors import DpclipError
from dpclip.io import read_json


@dataclass
class BenchmarkCheck:
    """The paper's number, ours, whether ours is within it, and how it was measured."""

    claimed: float
    measured: float
    holds: bool
    lines: list[str] = field(default_factory=list)
    summary: str | None = None


def bench_path(spec: dict, root: Path) -> Path:
    """The bench output a check reads (it may not exist yet: the claim is then untested)."""
    file = spec.get("file")
    if not isinstance(file, str) or not file:
        raise DpclipError(f"benchmark check {spec.get('check')!r}: file must name the "
                          f"bench.json to read, not {file!r}")
    return root / file


def _bench(spec: dict, root: Path) -> dict:
    path = bench_path(spec, root)
    if not path.is_file():
        raise DpclipError(f"benchmark check {spec.get('check')!r}: {path} does not exist")
    return read_json(path)


def probe_share(spec: dict, root: Path) -> BenchmarkCheck:
    """The method's probe time over its training time against the paper's overhead (module
    docstring)."""
    name = "probe_share"
    bench = _bench(spec, root)
    method, model, bound = spec.get("method"), spec.get("model"), spec.get("bound")
    if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not bound > 0:
        raise DpclipError(f"benchmark check {name!r}: bound must be a number above 0, "
                          f"not {bound!r}")
    key = f"{model}/{method}"
    probe = (bench.get("probes") or {}).get(key)
    if probe is None:
        raise DpclipError(f"benchmark check {name!r}: the bench has no probe share for {key!r} "
                          f"(it has {sorted(bench.get('probes') or {})})")
    steps = {row["method"]: row["step_ms_median"] for row in bench.get("table", [])
             if row.get("model") == model}
    setting = bench.get("setting", {})
    lines = [f"{method}'s probe on {model}, once every K = {probe['probe_every']} steps: "
             f"{probe['probe_s']:.4g} s of {probe['train_s']:.3g} s of training steps, "
             f"{100 * probe['share']:.3g}% of the training time, against the paper's "
             f"{100 * bound:.3g}%",
             "measured by `dpclip bench` on " + ", ".join(f"{k} {v}" for k, v in setting.items()
                                                        if k in ("device", "threads", "dataset",
                                                                 "batch_size"))]
    if "dp_sgd" in steps and method in steps:
        lines.append(f"the two steps, interleaved (median ms): dp_sgd {steps['dp_sgd']:.3g}, "
                     f"{method} {steps[method]:.3g}: the same operations, so their ratio "
                     f"{steps[method] / steps['dp_sgd']:.3g} is the machine's spread between "
                     "rounds, not a cost")
    share = float(probe["share"])
    holds = share <= bound
    return BenchmarkCheck(bound, share, holds, lines, summary=(
        f"the probe costs {100 * share:.3g}% of the training time on this machine, "
        + ("within" if holds else "above") + f" the paper's {100 * bound:.3g}%"))


def step_ratio(spec: dict, root: Path) -> BenchmarkCheck:
    """The method's median step time over the baseline's, both timed in the same interleaved
    rounds, against the paper's ratio of its per-iteration times (module docstring)."""
    name = "step_ratio"
    bench = _bench(spec, root)
    method, baseline, model = spec.get("method"), spec.get("baseline"), spec.get("model")
    bound = spec.get("bound")
    if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not bound > 0:
        raise DpclipError(f"benchmark check {name!r}: bound must be a number above 0, "
                          f"not {bound!r}")
    rows = {row["method"]: row for row in bench.get("table", []) if row.get("model") == model}
    missing = [m for m in (method, baseline) if m not in rows]
    if missing:
        raise DpclipError(f"benchmark check {name!r}: the bench timed no {missing} on "
                          f"{model!r} (it has {sorted(rows)})")
    ours = rows[method]["step_ms_median"] / rows[baseline]["step_ms_median"]
    setting = bench.get("setting", {})
    others = ", ".join(f"{m} {row['step_ms_median']:.3g}" for m, row in rows.items())
    lines = [f"median step on {model} (ms, {rows[method].get('steps_timed', '?')} steps each, "
             f"interleaved in {setting.get('rounds', '?')} rounds): {others}",
             f"{method} / {baseline} = {ours:.3g}, against the paper's {bound:g}",
             "measured by `dpclip bench` on " + ", ".join(f"{k} {v}" for k, v in setting.items()
                                                        if k in ("device", "threads", "dataset",
                                                                 "batch_size"))]
    holds = ours <= bound
    return BenchmarkCheck(bound, ours, holds, lines, summary=(
        f"{method}'s step takes {ours:.3g} times {baseline}'s on this machine, "
        + ("within" if holds else "above") + f" the paper's {bound:g}"))


CHECKS = {"probe_share": probe_share, "step_ratio": step_ratio}


def run_check(spec: dict, root: Path) -> BenchmarkCheck:
    """The check ``spec['check']`` on the bench output below ``root``."""
    return CHECKS[spec["check"]](spec, root)
