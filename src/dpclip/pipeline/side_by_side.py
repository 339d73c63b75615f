"""The stale runs of one per-run stage (train, audit, reference, evaluate) side by side, ``jobs``
worker processes at a time, for the stage's command (``dpclip train``, what DVC runs).

Why: a default run is about a second of mostly single-threaded Python, so one process at a time
leaves the second core of a 2-core machine idle. Why the numbers stay the same: every run sets
its own thread count (``train.threads``) and seeds its own generators, so a run computes the
same bytes in any process; ``dpclip verify`` compares the results of a pipeline run with a
commit's.

The workers are forked from a fork server (:mod:`dpclip.pipeline.fork_server`), a process that
imported the stage's module and has run nothing else. Forking the stage's own process instead
would be cheaper, but torch's OpenMP thread pool does not survive a fork: a child forked after
its parent ran one parallel region hangs in its own first one. A command on its own starts the
server before it imports torch itself (:func:`start_server`), so the two imports overlap on two
cores; under ``dpclip warm`` the stage commands share the one the warm process started.

Each run writes its outputs and its provenance itself, as in one process. A run that fails
stops the runs not yet handed to the workers (Python's pool hands over one run more than it
has workers), without waiting for the runs before it in the order; the runs under way finish
and are kept, and then its error is raised. Ctrl-C stops the workers at once, as it stops a run in one process (training
resumes from its last checkpoint). A worker that dies (killed for memory) ends the other
workers' runs too (Python's process pool does so), which is reported as one error.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import warnings
from contextlib import contextmanager
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Callable, Iterator

from dpclip.errors import DpclipError
from dpclip.pipeline import fork_server

# the worker's row for its progress bar (tqdm's position), so that bars do not overwrite each
# other on one terminal; read by dpclip.train.runs.base (not imported here: no torch yet)
PROGRESS_ROW = "DPCLIP_PROGRESS_ROW"

# the worker count when the command gives none: `dvc repro` runs the command dvc.yaml states
JOBS_VARIABLE = "DPCLIP_JOBS"


def cpu_count() -> int:
    """The CPUs this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)


def default_jobs(threads: int | None = None, device: str = "cpu") -> int:
    """``$DPCLIP_JOBS`` when it is set; else one worker when the runs may train on a GPU
    (``train.device`` cuda, or auto on a machine with an NVIDIA device: processes sharing one
    GPU is the user's choice, its memory the limit), and otherwise twice as many threads as
    CPUs, at most one worker per CPU: with ``train.threads`` 2 on 2 cores, 2 workers.

    Measured on 2 cores (docs/measurements.md): two workers of two threads took the default
    pipeline's train stage from 11.7 to 7.8 s, and four paper-CNN runs on MNIST (compute
    bound) from 17.9-18.2 to 16.7-16.9 s, so twice the threads does not slow the compute."""
    given = os.environ.get(JOBS_VARIABLE, "").strip()
    if given:
        if not given.isdigit() or int(given) < 1:
            raise DpclipError(f"{JOBS_VARIABLE}: {given!r} must be a whole number of at least 1")
        return int(given)
    if not fork_server.available():  # Windows
        return 1
    if device == "cuda" or (device == "auto" and Path("/dev/nvidiactl").exists()):
        return 1
    cpus = cpu_count()
    return max(1, min(cpus, 2 * cpus // (threads or cpus)))


def configure_process() -> None:
    """What a dpclip command's process reports, in the command and in each worker: log lines
    with their level and logger, Opacus's per-layer notes hidden, and Opacus's warning that
    the best RDP order is its largest filtered (the epsilon it then gives is still an upper
    bound, valid if not the tightest, and the warning repeats per search)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("opacus").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message="Optimal order is the largest alpha",
                            category=UserWarning)


def start_server(module: str, preload: tuple[str, ...] = ()) -> None:
    """Start the workers' fork server now, importing ``module`` (the stage's) and ``preload``
    (what its workers import later: each would else import it again), so that these imports
    run while this process imports its own and works; under ``dpclip warm`` the server the
    warm process started serves instead."""
    fork_server.start_server(("dpclip", module, *preload))


@contextmanager
def in_a_worker(function: Callable[[], object], module: str, what: str
                ) -> Iterator[Callable[[], object]]:
    """Run ``function()`` in one worker process while the body runs; yields a function that
    waits for its result (and raises what ``function`` raised; a worker that died, as a
    :class:`DpclipError` naming ``what``). The body failing waits for the worker too (what it
    writes is then complete), unless the body was interrupted (Ctrl-C), which stops it.
    ``function`` must pickle; ``module``: what the worker imports first, as for
    :func:`run_side_by_side`."""
    start_server(module)
    pool = _pool(1, rows=None)
    future = pool.submit(function)

    def result():
        try:
            return future.result()
        except BrokenProcessPool as exc:
            raise DpclipError(f"the worker process {what} died (killed, perhaps for memory); "
                              f"--jobs 1 does it in the command's own process") from exc

    interrupted = False
    try:
        yield result
    except (KeyboardInterrupt, SystemExit):
        interrupted = True
        raise
    finally:
        if interrupted:  # stop now, as Ctrl-C stops the command
            _stop(pool)
        pool.shutdown(wait=True, cancel_futures=True)


def _pool(workers: int, rows) -> ProcessPoolExecutor:
    """``workers`` processes from this process's fork server, each set up by
    :func:`_start_worker` (``rows``: their progress-bar rows, or None)."""
    return ProcessPoolExecutor(max_workers=workers, mp_context=fork_server.WORKERS,
                               initializer=_start_worker,
                               initargs=(rows, os.getpid(), fork_server.AskingProcess()))


def _stop(pool: ProcessPoolExecutor) -> None:
    """End the pool's workers now (Python's pool has no public way to)."""
    for process in list(getattr(pool, "_processes", {}).values()):
        process.terminate()


def _start_worker(rows, owner: int, setting: fork_server.WorkerSetting) -> None:
    """A worker's set-up: the command's standard output and error, umask, CPU set and ignored
    signals (``setting``), its progress-bar row (one of ``rows``, a queue; None: it draws no
    bar), the command's reporting, and a watch on the command's process (``owner``): the fork
    server outlives it while workers run, so a worker whose command died (killed, say) ends
    itself within a second rather than finish its run unowned and race a new command on the
    same outputs."""
    setting.apply()
    if rows is not None:
        os.environ[PROGRESS_ROW] = str(rows.get())
    configure_process()
    threading.Thread(target=_end_with, args=(owner,), daemon=True).start()


def _end_with(owner: int) -> None:
    while True:
        time.sleep(1.0)
        try:
            os.kill(owner, 0)  # signal 0: only whether the process exists
        except ProcessLookupError:
            os.kill(os.getpid(), signal.SIGTERM)
            return
        except PermissionError:  # it exists (another user's process took the id: unlikely)
            pass


def run_side_by_side(run: Callable, keys: list, jobs: int, module: str,
                     preload: tuple[str, ...] = ()) -> Iterator[tuple]:
    """Yield (key, ``run(key)``) for each of ``keys`` in their order, ``jobs`` runs at a time
    in worker processes. ``run`` must pickle (a module-level function, or a
    ``functools.partial`` of one); ``module`` and ``preload``: what the workers import first
    (:func:`start_server`)."""
    jobs = max(1, min(jobs, len(keys)))
    start_server(module, preload)  # the command started it already, unless called elsewhere
    rows = fork_server.WORKERS.Queue()
    for row in range(jobs):
        rows.put(row)
    pool = _pool(jobs, rows)
    interrupted, futures = False, []
    try:
        futures = [pool.submit(run, key) for key in keys]
        waiting = list(zip(keys, futures))
        while waiting:
            wait([future for _, future in waiting if not future.done()],
                 return_when=FIRST_COMPLETED)
            while waiting and waiting[0][1].done() and waiting[0][1].exception() is None:
                key, future = waiting.pop(0)
                yield key, future.result()
            failed = [future for _, future in waiting
                      if future.done() and future.exception() is not None]
            if failed:  # now, not after the runs before it in the order
                raise failed[0].exception()
    except BrokenProcessPool as exc:
        lost = [str(getattr(key, "name", key)) for key, future in zip(keys, futures)
                if future.done() and not future.cancelled()
                and isinstance(future.exception(), BrokenProcessPool)]
        raise DpclipError(f"a worker process of {module.rsplit('.', 1)[-1]} died (killed, "
                          f"perhaps for memory), which ended the runs under way or waiting "
                          f"({', '.join(lost) or 'none'}); the finished runs are kept. Fewer "
                          f"workers: --jobs or {JOBS_VARIABLE}") from exc
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        # after a failure: the runs not handed over stay stale, those under way finish
        if interrupted:  # stop now, as Ctrl-C stops a run in one process
            _stop(pool)
        pool.shutdown(wait=True, cancel_futures=True)
