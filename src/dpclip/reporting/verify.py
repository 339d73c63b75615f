"""``dpclip verify``: does a fresh run reproduce the committed results?

Compares every configured run's git-tracked summary (``summary/<run>.json``) in the workspace
with the one in a commit (HEAD by default) and says, per run, "identical", "within tolerance"
or "differs" (naming each metric beyond its absolute tolerance, :data:`TOLERANCES`, with both
values); the exit status is 1 when a run differs or is missing. What the tolerances mean, and
what agrees across machines: docs/dvc.md, "Results on another machine: dpclip verify".
"""

from __future__ import annotations

import json
import math
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from dpclip.errors import DpclipError
from dpclip.files import read_json
from dpclip.layout import Layout
from dpclip.summaries import unfiled

EPSILON_RELATIVE = 1e-9
TOLERANCES = {"accuracy": 0.005, "ece": 0.005, "strongest_auc": 0.01, "attack_auc": 0.01,
              "strongest_tpr_at_fpr_1pct": 0.01, "strongest_tpr_at_fpr_0.1pct": 0.01,
              "attack_tpr_at_low_fpr": 0.01, "audit_epsilon_lower_bound": 0.1}
DEFAULT_TOLERANCE = 0.01  # a summary metric not named above


@dataclass
class RunCheck:
    run: str
    status: str  # identical | within tolerance | differs | missing
    differences: dict[str, tuple] = field(default_factory=dict)  # metric -> (committed, fresh)
    beyond: list[str] = field(default_factory=list)  # the metrics beyond their tolerance


def committed_summary(root: Path, rev: str, run: str) -> dict | None:
    """The run's summary as ``rev`` holds it (None when it holds none)."""
    path = f"summary/{run}.json"
    done = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=root, capture_output=True,
                          text=True)
    return json.loads(done.stdout) if done.returncode == 0 else None


def check_revision(root: Path, rev: str) -> None:
    """Refuse a folder outside git or a revision git does not know, by name."""
    done = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                          cwd=root, capture_output=True, text=True)
    if "not a git repository" in done.stderr:
        raise DpclipError(f"dpclip verify: {root} is not a git repository")
    if done.returncode != 0:
        raise DpclipError(f"dpclip verify: --against {rev!r} is not a revision of {root}")


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def tolerance(metric: str, holdout: int | None = None) -> float:
    """A metric's absolute tolerance; accuracy's is at least one of ``holdout`` records."""
    allowed = TOLERANCES.get(metric, DEFAULT_TOLERANCE)
    return max(allowed, 1.0 / holdout) if metric == "accuracy" and holdout else allowed


def _beyond(metric: str, committed, fresh, holdout: int | None) -> bool:
    if _missing(committed) or _missing(fresh):  # a value that appears or goes is a change
        return _missing(committed) != _missing(fresh)
    if metric == "epsilon":
        return not math.isclose(committed, fresh, rel_tol=EPSILON_RELATIVE)
    # one record's worth exactly is within (1/n computed twice may round apart)
    return abs(committed - fresh) > tolerance(metric, holdout) * (1 + 1e-9)


def check_run(run: str, committed: dict | None, fresh: dict | None,
              holdout: int | None = None) -> RunCheck:
    """Compare one run's committed and fresh summaries metric by metric (``holdout``: the
    target holdout's size, the records accuracy is measured on); summaries of other data
    (their dataset identities differ, :mod:`dpclip.summaries`) differ as a whole."""
    if committed is None or fresh is None:
        return RunCheck(run, "missing", {}, ["committed" if committed is None else "fresh"])
    (committed_data, committed), (fresh_data, fresh) = unfiled(committed), unfiled(fresh)
    if committed_data != fresh_data:
        return RunCheck(run, "differs", {"data": (committed_data, fresh_data)}, ["data"])
    differences = {k: (committed.get(k), fresh.get(k)) for k in sorted({*committed, *fresh})
                   if committed.get(k) != fresh.get(k)
                   and not (_missing(committed.get(k)) and _missing(fresh.get(k)))}
    beyond = [k for k, (c, f) in differences.items() if _beyond(k, c, f, holdout)]
    status = "identical" if not differences else "differs" if beyond else "within tolerance"
    return RunCheck(run, status, differences, beyond)


def verify(runs: list[str], layout: Layout, rev: str = "HEAD") -> list[RunCheck]:
    """Every run of ``runs`` (names) checked against ``rev``."""
    check_revision(layout.root, rev)
    holdout = holdout_records(layout)
    checks = []
    for run in runs:
        path = layout.summary(run)
        fresh = read_json(path) if path.is_file() else None
        checks.append(check_run(run, committed_summary(layout.root, rev, run), fresh, holdout))
    return checks


def holdout_records(layout: Layout) -> int | None:
    """The target holdout's size, from the prepared data (None when it is not prepared)."""
    meta = layout.prepared_meta
    return int(read_json(meta)["sizes"]["target_holdout"]) if meta.is_file() else None


def _value(v) -> str:
    return "—" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v)


def kernels_note(layout: Layout, run: str) -> str | None:
    """The CPU kernels the fresh run trained with (its record), when it says."""
    record = layout.run_dir(run) / "record.json"
    numerics = read_json(record).get("numerics") if record.is_file() else None
    if not numerics:
        return None
    return (f"trained with torch's {numerics['cpu_capability']} kernels, MKL_CBWR="
            f"{numerics['mkl_cbwr']}, ONEDNN_MAX_CPU_ISA={numerics['onednn_max_cpu_isa']}")


def verify_text(checks: list[RunCheck], rev: str, layout: Layout | None = None) -> str:
    """The report ``dpclip verify`` prints (lines of at most 120 characters)."""
    width = max([len(c.run) for c in checks] + [3])
    holdout = holdout_records(layout) if layout else None
    lines = [f"Fresh results (workspace summary/) against {rev}'s, per run:"]
    for c in checks:
        lines.append(f"  {c.run.ljust(width)}  {c.status}")
        if c.status == "missing":
            lines.append(f"  {'':{width}}    no {c.beyond[0]} summary")
        for metric in c.differences:
            committed, fresh = c.differences[metric]
            mark = "beyond" if metric in c.beyond else "within"
            allowed = "relative 1e-9" if metric == "epsilon" else \
                f"{tolerance(metric, holdout):.3g}"
            records = ""
            if metric == "accuracy" and holdout and not (_missing(committed) or _missing(fresh)):
                records = f"; {round(abs(committed - fresh) * holdout)} of {holdout} holdout records"
            lines.append(f"  {'':{width}}    {metric}: {_value(committed)} -> {_value(fresh)} "
                         f"({mark} {allowed}{records})")
        note = kernels_note(layout, c.run) if layout and c.status == "differs" else None
        if note:
            lines.append(f"  {'':{width}}    {note}")
    counts = {s: sum(c.status == s for c in checks)
              for s in ("identical", "within tolerance", "differs", "missing")}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items() if n) + ".")
    return "\n".join(lines)
