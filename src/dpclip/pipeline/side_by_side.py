"""The stale runs of one per-run stage (train, audit, reference, evaluate) side by side, ``jobs``
worker processes at a time, for the stage's command (``dpclip train``, what DVC runs). Every run
sets its own thread count and seeds its own generators, so it computes the same bytes in any
process. The workers fork from :mod:`multiprocessing`'s fork server, which imports
:mod:`dpclip.pipeline.passive_openmp` and the stage's module first (torch's OpenMP pool does not
survive a fork of the command itself). Why, and what a failure or Ctrl-C does: docs/pipeline.md,
"What re-runs when something changes".
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import signal
import threading
import warnings
from contextlib import contextmanager
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Callable, Iterator

from dpclip.errors import DpclipError

# the worker's row for its progress bar (tqdm's position), so that bars do not overwrite each
# other on one terminal; read by dpclip.train.runs.base (not imported here: no torch yet)
PROGRESS_ROW = "DPCLIP_PROGRESS_ROW"

# the worker count when the command gives none: `dvc repro` runs the command dvc.yaml states
JOBS_VARIABLE = "DPCLIP_JOBS"

# what the workers' fork server imports first, before anything loads torch
SERVER_IMPORTS = ("dpclip.pipeline.passive_openmp", "dpclip")


def cpu_count() -> int:
    """The CPUs this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)


def default_jobs(threads: int | None = None, device: str = "cpu") -> int:
    """``$DPCLIP_JOBS`` when it is set; else one worker when the runs may train on a GPU
    (``train.device`` cuda, or auto on a machine with an NVIDIA device: processes sharing one
    GPU is the user's choice, its memory the limit), and otherwise twice as many threads as
    CPUs, at most one worker per CPU: with ``train.threads`` 2 on 2 cores, 2 workers (twice
    the threads does not slow the compute: docs/measurements.md)."""
    given = os.environ.get(JOBS_VARIABLE, "").strip()
    if given:
        if not given.isdigit() or int(given) < 1:
            raise DpclipError(f"{JOBS_VARIABLE}: {given!r} must be a whole number of at least 1")
        return int(given)
    if "forkserver" not in multiprocessing.get_all_start_methods():  # Windows
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


def start_server(modules: tuple[str, ...]) -> None:
    """Start the workers' fork server now, importing :data:`SERVER_IMPORTS` and ``modules``
    (what the workers import first), while this process goes on with its own imports and work.
    multiprocessing starts its server with a process's first worker and waits for the server's
    imports before that worker runs: so the first worker, one that does nothing, is started by a
    thread of its own."""
    context = _context()
    context.set_forkserver_preload([*SERVER_IMPORTS, *modules])
    threading.Thread(target=context.Process(target=os.getpid).start, daemon=True).start()


@functools.cache
def _context():
    """multiprocessing's fork-server context, its server importing :data:`SERVER_IMPORTS`
    (and what :func:`start_server` adds) when this process starts it, with its first worker;
    it runs until this process ends. Set up once, so that a pool does not take back what
    :func:`start_server` added before the server read it."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(SERVER_IMPORTS))
    return context


@contextmanager
def in_a_worker(function: Callable[[], object], what: str) -> Iterator[Callable[[], object]]:
    """Run ``function()`` in one worker process while the body runs; yields a function that
    waits for its result (and raises what ``function`` raised; a worker that died, as a
    :class:`DpclipError` naming ``what``). The body failing waits for the worker too (what it
    writes is then complete), unless the body was interrupted (Ctrl-C), which stops it.
    ``function`` must pickle."""
    context = _context()
    stop = context.Event()
    pool = _pool(context, 1, None, stop)
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
            stop.set()
        pool.shutdown(wait=True, cancel_futures=True)


def _pool(context, workers: int, rows, stop) -> ProcessPoolExecutor:
    """``workers`` processes of the fork-server ``context``, each set up by
    :func:`_start_worker` (``rows``: their progress-bar rows, or None; ``stop``: an event that
    ends them)."""
    return ProcessPoolExecutor(max_workers=workers, mp_context=context,
                               initializer=_start_worker, initargs=(rows, os.getpid(), stop))


def _start_worker(rows, owner: int, stop) -> None:
    """A worker's set-up: its progress-bar row (one of ``rows``, a queue; None: it draws no
    bar), the command's reporting, and a watch that ends it when the command sets ``stop``
    (Ctrl-C) or has died (``owner``: nothing else ends a worker whose command was killed, so
    it ends itself within a second rather than finish its run unowned and race a new command
    on the same outputs)."""
    if rows is not None:
        os.environ[PROGRESS_ROW] = str(rows.get())
    configure_process()
    threading.Thread(target=_end_with, args=(owner, stop), daemon=True).start()


def _end_with(owner: int, stop) -> None:
    while not stop.wait(1.0):
        try:
            os.kill(owner, 0)  # signal 0: only whether the process exists
        except ProcessLookupError:
            break
        except PermissionError:  # it exists (another user's process took the id: unlikely)
            pass
    os.kill(os.getpid(), signal.SIGTERM)


def run_side_by_side(run: Callable, keys: list, jobs: int, what: str) -> Iterator[tuple]:
    """Yield (key, ``run(key)``) for each of ``keys`` in their order, ``jobs`` runs at a time
    in worker processes. ``run`` must pickle (a module-level function, or a
    ``functools.partial`` of one); ``what``: the runs' stage, which an error names."""
    jobs = max(1, min(jobs, len(keys)))
    context = _context()
    rows, stop = context.Queue(), context.Event()
    for row in range(jobs):
        rows.put(row)
    pool = _pool(context, jobs, rows, stop)
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
        raise DpclipError(f"a worker process of {what} died (killed, perhaps for memory), "
                          f"which ended the runs under way or waiting "
                          f"({', '.join(lost) or 'none'}); the finished runs are kept. Fewer "
                          f"workers: --jobs or {JOBS_VARIABLE}") from exc
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        # after a failure: the runs not handed over stay stale, those under way finish
        if interrupted:  # stop now, as Ctrl-C stops a run in one process
            stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
