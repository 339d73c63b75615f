"""The stale runs of one per-run stage (train, audit, reference, evaluate) side by side, ``jobs``
worker processes at a time, for the stage's command (``dpclip train``, what DVC runs).

Why: a default run is about a second of mostly single-threaded Python, so one process at a time
leaves the second core of a 2-core machine idle. Why the numbers stay the same: every run sets
its own thread count (``train.threads``) and seeds its own generators, so a run computes the
same bytes in any process; ``dpclip verify`` compares the results of a pipeline run with a
commit's.

The workers are forked from multiprocessing's fork server, a process that imported the stage's
module and has run nothing else. Forking the stage's own process instead would be cheaper, but
torch's OpenMP thread pool does not survive a fork: a child forked after its parent ran one
parallel region hangs in its own first one. The command starts the server before it imports
torch itself (:func:`start_server`), so the two imports overlap on two cores.

Each run writes its outputs and its provenance itself, as in one process: a run that fails
stops the runs no worker has taken yet, the runs under way finish and are kept, and the error is
raised after them.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Callable, Iterator

from dpclip.errors import DpclipError

# the worker's row for its progress bar (tqdm's position), so that bars do not overwrite each
# other on one terminal; read by dpclip.train.runs.base (not imported here: no torch yet)
PROGRESS_ROW = "DPCLIP_PROGRESS_ROW"


# the worker count when the command gives none: `dvc repro` runs the command dvc.yaml states
JOBS_VARIABLE = "DPCLIP_JOBS"


def default_jobs() -> int:
    """``$DPCLIP_JOBS`` when it is set, else one worker per CPU this process may use."""
    given = os.environ.get(JOBS_VARIABLE, "").strip()
    if given:
        if not given.isdigit() or int(given) < 1:
            raise DpclipError(f"{JOBS_VARIABLE}: {given!r} must be a whole number of at least 1")
        return int(given)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)


def _context(module: str):
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["dpclip", module])
    return context


def start_server(module: str) -> None:
    """Start the fork server now, importing ``module`` (the stage's), so that its imports run
    while this process imports its own.

    Its workers wait for work in OpenMP's passive mode (``OMP_WAIT_POLICY=PASSIVE``, unless
    the environment sets a policy): two workers of two threads each on two cores, spinning as
    OpenMP's threads do by default, took the default pipeline's train stage from 11.7 s (one
    process) to 46 s; passive, 8.8 s. The policy changes when a thread sleeps, not what it
    computes. This process keeps its own policy (it reads it when it imports torch, after)."""
    _context(module)
    from multiprocessing import forkserver

    chosen = {name: os.environ.get(name) for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if not any(chosen.values()):
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    try:
        forkserver.ensure_running()
    finally:
        if not any(chosen.values()):
            del os.environ["OMP_WAIT_POLICY"]


def _take_row(rows) -> None:
    os.environ[PROGRESS_ROW] = str(rows.get())


def run_side_by_side(run: Callable, keys: list, jobs: int, module: str) -> Iterator[tuple]:
    """Yield (key, ``run(key)``) for each of ``keys`` in their order, ``jobs`` runs at a time
    in worker processes. ``run`` must pickle (a module-level function, or a
    ``functools.partial`` of one)."""
    jobs = max(1, min(jobs, len(keys)))
    context = _context(module)
    rows = context.Queue()
    for row in range(jobs):
        rows.put(row)
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_take_row,
                               initargs=(rows,))
    try:
        futures: list[Future] = [pool.submit(run, key) for key in keys]
        for key, future in zip(keys, futures):
            yield key, future.result()
    finally:
        # after a failure: the runs no worker has taken stay stale, those under way finish
        pool.shutdown(wait=True, cancel_futures=True)
