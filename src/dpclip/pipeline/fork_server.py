"""A fork server for the side-by-side workers that the processes forked from its starter share.

A per-run stage's workers (:mod:`dpclip.pipeline.side_by_side`) are forked from a fork server:
a fresh interpreter that imported the stage's modules and has run nothing else (torch's OpenMP
pool does not survive a fork from a process that ran a parallel region). multiprocessing's own
fork server (``get_context("forkserver")``) belongs to the one process that started it: a
process forked from that one cannot use it (it checks the server with ``waitpid``, which only
the parent may call). So under ``dpclip warm`` (:mod:`dpclip.pipeline.warm`) every stage command
started its own and waited for a fresh interpreter to import torch before its first worker ran
(about 3 s here, five stages).

:class:`ForkServer` runs multiprocessing's own server loop (``multiprocessing.forkserver.main``:
one fork per request; the worker's pid, then its exit status, go back on a pipe) and speaks its
protocol, but keeps the server's address and "alive" pipe in an object that a forked process
inherits and uses as it is. The warm process starts one for every stage's workers as it starts,
so the stage commands it forks find theirs running; a command on its own starts its own, as
before. The warm process's server imports more (every stage's worker modules, and what the
runs import on first use) and has the warm process's environment (a command's differs at most
by variables DVC sets per stage, which no worker reads); a worker takes from the command that
asked for it what it would have inherited from it (:class:`AskingProcess`), and computes the
same bytes either way (``dpclip verify``; tests/pipeline/test_fork_server.py).

The server imports in OpenMP's passive mode (``OMP_WAIT_POLICY=PASSIVE``, unless the
environment sets a policy): two workers of two threads each on two cores, spinning as OpenMP's
threads do by default, took the default pipeline's train stage from 11.7 s (one process) to
46 s; passive (the workers only), 7.8 s. The policy changes when a thread sleeps, not what it
computes; the process that starts the server keeps its own.

"""

from __future__ import annotations

import atexit
import io
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from multiprocessing import forkserver, popen_forkserver, reduction, resource_tracker, spawn, util
from multiprocessing.context import ForkServerContext, ForkServerProcess, set_spawning_popen

from dpclip.errors import DpclipError

log = logging.getLogger(__name__)
PASSIVE_UNLESS_SET = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")  # a policy the user chose is kept
# the signals a process passes on as ignored to the process that stands in for it (a warm
# copy, a worker), the rest as a fresh interpreter starts with them
PASSED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_server: ForkServer | None = None  # this process's, or the one inherited from its starter
_requested: tuple[str, ...] = ()  # the modules this process last asked its server for


# run by the server's interpreter: import the modules (one that fails is skipped, as a worker
# would then fail on its own import; Ctrl-C cannot end the server half-way), freeze what they
# allocated out of the garbage collector's reach (a worker's collections then leave those
# pages shared with the server), then multiprocessing's own server loop
SERVER_CODE = """import gc, importlib, signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
for name in {modules!r}:
    try:
        importlib.import_module(name)
    except Exception:
        pass
gc.freeze()
signal.signal(signal.SIGINT, signal.default_int_handler)
from multiprocessing.forkserver import main
main({listener}, {alive}, [])
"""


class ForkServer:
    """A running fork server that imported ``modules``. Its workers come from :data:`WORKERS`
    (a multiprocessing context, for ``ProcessPoolExecutor``) once :func:`start_server` made it
    this process's."""

    def __init__(self, modules: tuple[str, ...]):
        self.modules, self.owner = tuple(modules), os.getpid()
        try:
            self.folder = tempfile.mkdtemp(prefix="dpclip-workers-")  # mode 0700: this user only
        except OSError as exc:
            raise DpclipError(f"cannot start the workers' fork server: {exc}") from exc
        self.address = os.path.join(self.folder, "socket")
        self.alive_w: int | None = None
        env = dict(os.environ)
        if not any(env.get(name) for name in PASSIVE_UNLESS_SET):
            env["OMP_WAIT_POLICY"] = "PASSIVE"
        try:
            with socket.socket(socket.AF_UNIX) as listener:
                listener.bind(self.address)
                listener.listen()
                # every holder of alive_w (this process, the processes forked from it, the
                # workers) keeps the server up; when the last one closes it, the server ends
                alive_r, self.alive_w = os.pipe()
                code = SERVER_CODE.format(modules=list(self.modules),
                                          listener=listener.fileno(), alive=alive_r)
                try:  # the interpreter and its flags, as multiprocessing starts its server
                    self.process = subprocess.Popen(
                        [spawn.get_executable(), *util._args_from_interpreter_flags(), "-c",
                         code], env=env, pass_fds=(listener.fileno(), alive_r),
                        stdin=subprocess.DEVNULL)
                finally:
                    os.close(alive_r)
        except OSError as exc:
            if self.alive_w is not None:
                os.close(self.alive_w)
            shutil.rmtree(self.folder, ignore_errors=True)
            raise DpclipError(f"cannot start the workers' fork server: {exc}") from exc
        atexit.register(self.close)

    def known_ended(self) -> bool:
        """Whether the server has ended, as far as this process can tell: only the process
        that started it (its parent) can ask; a process forked from that one relies on it
        having checked before the fork (:func:`drop_ended_server`)."""
        return os.getpid() == self.owner and self.process.poll() is not None

    def connect(self, fds: list[int]) -> tuple[int, int]:
        """Ask for a new worker (multiprocessing's protocol: the worker's data pipe, its status
        pipe, the alive pipe, the resource tracker and ``fds``): (status read end, data write
        end), as ``multiprocessing.forkserver.connect_to_new_process`` returns them; a
        :class:`ServerGone` when the server cannot take the request."""
        with socket.socket(socket.AF_UNIX) as client:
            try:
                client.connect(self.address)
            except OSError as exc:
                raise ServerGone(f"the workers' fork server is gone ({exc})") from exc
            parent_r, child_w = os.pipe()
            child_r, parent_w = os.pipe()
            try:
                reduction.sendfds(client, [child_r, child_w, self.alive_w,
                                           resource_tracker.getfd(), *fds])
            except BaseException as exc:
                os.close(parent_r)
                os.close(parent_w)
                if isinstance(exc, OSError):
                    raise ServerGone(f"the workers' fork server is gone ({exc})") from exc
                raise
            finally:
                os.close(child_r)
                os.close(child_w)
            return parent_r, parent_w

    def close(self) -> None:
        """Let the server end (it does once the last worker is gone) and remove its folder;
        only in the process that started it."""
        if os.getpid() != self.owner or self.alive_w is None:
            return
        os.close(self.alive_w)
        self.alive_w = None
        shutil.rmtree(self.folder, ignore_errors=True)


class _Popen(popen_forkserver.Popen):
    """multiprocessing's fork-server launch, sent to this process's :class:`ForkServer`
    rather than multiprocessing's module-global one (its ``_launch``, with
    ``connect_to_new_process`` swapped for :meth:`ForkServer.connect`)."""

    def _launch(self, process_obj):
        if _server is None:
            raise DpclipError("no fork server started for the workers (start_server)")
        data = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(spawn.get_preparation_data(process_obj._name), data)
            reduction.dump(process_obj, data)
        finally:
            set_spawning_popen(None)
        self.sentinel, write_end = _connect(self._fds)
        # this process keeps a copy of the data pipe's write end, so that the worker's copy of
        # its read end (the worker's sentinel of this process) sees EOF when this one ends
        self.finalizer = util.Finalize(self, util.close_fds, (os.dup(write_end), self.sentinel))
        try:
            with open(write_end, "wb", closefd=True) as pipe:
                pipe.write(data.getbuffer())
            self.pid = forkserver.read_signed(self.sentinel)
        except (OSError, EOFError) as exc:
            raise DpclipError(f"the workers' fork server ended before it started a worker "
                              f"({type(exc).__name__}); run the command again") from exc


def _connect(fds: list[int]) -> tuple[int, int]:
    """:meth:`ForkServer.connect` to this process's server; one inherited from the process
    this one was forked from that is gone is replaced by a server of this process's own."""
    global _server
    try:
        return _server.connect(fds)
    except ServerGone as exc:
        if _server.owner == os.getpid():
            raise DpclipError(f"{exc}; run the command again") from exc
        log.warning("%s: starting one for this command", exc)
        _server = ForkServer(_requested or _server.modules)
        return _server.connect(fds)


class _WorkerProcess(ForkServerProcess):
    _Popen = staticmethod(_Popen)


class _WorkerContext(ForkServerContext):
    Process = _WorkerProcess


WORKERS = _WorkerContext()  # the context whose processes this process's fork server forks


def available() -> bool:
    """Whether this platform has fork servers (not Windows)."""
    return "forkserver" in multiprocessing.get_all_start_methods()


def start_server(modules: tuple[str, ...]) -> ForkServer:
    """This process's fork server: the one it started or inherited from the process it was
    forked from (whatever that one imported: a module it did not, a worker imports on first
    use), else a new one importing ``modules``."""
    global _server, _requested
    _requested = tuple(modules)
    if _server is None or _server.known_ended():
        drop_ended_server()
        _server = ForkServer(modules)
    return _server


def drop_ended_server() -> None:
    """Forget this process's fork server if it has ended (the warm process calls it before
    each fork, so its copies inherit a running server or none)."""
    global _server
    if _server is not None and _server.known_ended():
        _server.close()
        _server = None


class ServerGone(DpclipError):
    """The fork server did not take a request (it ended, or was killed)."""


class AskingProcess:
    """What a worker takes from the process that asks for it (:meth:`WorkerSetting.apply`),
    which a worker forked from a server of its own process would have inherited: its standard
    output and error (the file descriptors themselves, sent as multiprocessing sends a pipe's),
    umask, CPU set and the signals it ignores (``nohup``). Pickled when the worker starts."""

    def __reduce__(self):
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        return (_setting, (reduction.DupFd(1), reduction.DupFd(2), current_umask(), cpus,
                           ignored_signals()))


@dataclass
class WorkerSetting:
    """An :class:`AskingProcess` as a worker receives it."""

    stdout: int
    stderr: int
    umask: int
    cpus: list[int] | None
    ignored: list[int]

    def apply(self) -> None:
        """Make this worker write to the asking process's streams, with its umask, CPU set
        and ignored signals."""
        sys.stdout.flush()
        sys.stderr.flush()
        for descriptor, target in ((self.stdout, 1), (self.stderr, 2)):
            if descriptor != target:
                os.dup2(descriptor, target)
                os.close(descriptor)
        sys.stdout.reconfigure(line_buffering=os.isatty(1))  # as Python sets it at start-up
        os.umask(self.umask)
        if self.cpus is not None:
            try:
                os.sched_setaffinity(0, self.cpus)
            except OSError as exc:  # a CPU set this process may not take: it keeps its own
                log.warning("worker: CPU set %s not applied (%s)", self.cpus, exc)
        start_signals(self.ignored)  # as a worker of the asking process's own server


def _setting(stdout, stderr, umask: int, cpus, ignored: list[int]) -> WorkerSetting:
    return WorkerSetting(stdout.detach(), stderr.detach(), umask, cpus, ignored)


def ignored_signals() -> list[int]:
    """Which of :data:`PASSED_SIGNALS` this process ignores (``nohup``: SIGHUP)."""
    return [int(signum) for signum in PASSED_SIGNALS
            if signal.getsignal(signum) is signal.SIG_IGN]


def start_signals(ignored) -> None:
    """Set :data:`PASSED_SIGNALS` as a fresh interpreter started with ``ignored`` ignored has
    them: those ignored, SIGINT raising KeyboardInterrupt, the others the default action."""
    for signum in PASSED_SIGNALS:
        signal.signal(signum, signal.SIG_IGN if signum in ignored else
                      signal.default_int_handler if signum == signal.SIGINT else
                      signal.SIG_DFL)


def current_umask() -> int:
    """This process's umask, read without changing it where Linux shows it; else set to a
    stricter one for a moment and put back (a file another thread creates meanwhile gets the
    stricter mode, never a looser one)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask
