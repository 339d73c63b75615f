"""Where ``dvc repro``'s seconds go: ``dvc repro 2>&1 | python -m dpclip.reporting.stage_times``.

Passes DVC's output through unchanged and notes when each "Running stage 'NAME':" line arrives;
a stage's time is the gap to the next stage's line (or to the end of the output), so it includes
the stage's process start and imports and DVC's own bookkeeping for it. At the end it prints the
time per stage kind (matrix cells summed: ``partition`` is every ``partition@...`` cell), how
many runs it computed (the ``[i/n] <run>: ...`` lines of ``dpclip train`` and ``dpclip
evaluate``, runs that were up to date left out; the cells for other stages) and the mean per
run, and writes the table to ``.dpclip/stage_times.json`` (outside every DVC output: a file
added to ``reports/`` after DVC recorded it made the report stage stale). Skipped (cached)
stages take no time and are not listed; DVC's start-up before the first stage is its own row.
The Makefile runs it under ``pipefail``, so a failed repro still fails ``make run``.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

STAGE_LINE = re.compile(r"Running stage '([^']+)'")
# a run's line, after a progress bar's carriage return or cursor-up (a bar on a row of its
# own: runs side by side) when there is one
RUN_LINE = re.compile(r"(?:^|\r|\x1b\[A)\[\d+/\d+\] \S+: (?!up to date)")


def stage_seconds(events: list[tuple[float, str]], end: float) -> list[tuple[str, float]]:
    """(stage, seconds) from (arrival time, stage name) events, each until the next one."""
    bounds = [t for t, _ in events[1:]] + [end]
    return [(name, stop - start) for (start, name), stop in zip(events, bounds)]


def summarise(per_stage: list[tuple[str, float]], total: float,
              runs: dict[str, int] | None = None) -> list[dict]:
    """Per stage kind (the name before '@'): runs (``runs[stage]`` where the stage reported
    its runs, else one per cell), seconds, mean per run, share of total."""
    runs = runs or {}
    kinds: dict[str, list[float]] = defaultdict(list)
    counts: dict[str, int] = defaultdict(int)
    for name, seconds in per_stage:
        kind = name.split("@")[0]
        kinds[kind].append(seconds)
        counts[kind] += runs.get(name, 1)
    return [{"stage": kind, "runs": counts[kind], "seconds": round(sum(times), 1),
             "per_run": round(sum(times) / counts[kind], 2) if counts[kind] else None,
             "share": round(sum(times) / total, 3) if total > 0 else 0.0}
            for kind, times in kinds.items()]


def format_table(rows: list[dict], total: float) -> str:
    lines = [f"{'stage':<12}{'runs':>6}{'seconds':>9}{'per run':>10}{'share':>8}"]
    lines += [f"{r['stage']:<12}{r['runs']:>6}{r['seconds']:>9.1f}"
              f"{'-' if r['per_run'] is None else format(r['per_run'], '.2f'):>10}"
              f"{100 * r['share']:>7.0f}%" for r in rows]
    lines.append(f"{'total':<12}{'':>6}{total:>9.1f}")
    return "\n".join(lines)


RECORD = Path(".dpclip") / "stage_times.json"


def main(stream=sys.stdin, out=sys.stdout, record: Path = RECORD) -> int:
    start = time.monotonic()
    events: list[tuple[float, str]] = []
    runs: dict[str, int] = {}
    for line in stream:
        out.write(line)
        out.flush()
        match = STAGE_LINE.search(line)
        if match:
            events.append((time.monotonic() - start, match.group(1)))
        elif events and RUN_LINE.search(line):
            runs[events[-1][1]] = runs.get(events[-1][1], 0) + 1
    total = time.monotonic() - start
    if not events:
        return 0
    rows = summarise([("dvc start-up", events[0][0]), *stage_seconds(events, total)], total,
                     runs)
    out.write("\nWhere the time went (stage start to the next stage's start, imports and DVC "
              "bookkeeping included):\n" + format_table(rows, total) + "\n")
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"total_s": round(total, 1), "stages": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
