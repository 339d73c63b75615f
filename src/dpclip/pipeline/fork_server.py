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
before. A worker is the same either way: forked from a server that imported the same modules
with the same environment, it computes the same bytes (``dpclip verify``).

The server imports in OpenMP's passive mode (``OMP_WAIT_POLICY=PASSIVE``, unless the
environment sets a policy): two workers of two threads each on two cores, spinning as OpenMP's
threads do by default, took the default pipeline's train stage from 11.7 s (one process) to
46 s; passive (the workers only), 7.8 s. The policy changes when a thread sleeps, not what it
computes; the process that starts the server keeps its own.

Each worker writes to the standard output and error of the process that asked for it, not the
server's (they differ under ``dpclip warm``, whose copies take the waiting command's streams).
"""

from __future__ import annotations

import atexit
import io
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from multiprocessing import forkserver, popen_forkserver, reduction, resource_tracker, spawn, util
from multiprocessing.context import ForkServerContext, ForkServerProcess, set_spawning_popen

from dpclip.errors import DpclipError

PASSIVE_UNLESS_SET = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")  # a policy the user chose is kept
_server: ForkServer | None = None  # this process's, or the one inherited from its starter


class ForkServer:
    """A running fork server that imported ``modules``. Its workers come from :data:`WORKERS`
    (a multiprocessing context, for ``ProcessPoolExecutor``) once :func:`start_server` made it
    this process's."""

    def __init__(self, modules: tuple[str, ...]):
        self.modules, self.owner = tuple(modules), os.getpid()
        self.folder = tempfile.mkdtemp(prefix="dpclip-workers-")  # mode 0700: this user only
        self.address = os.path.join(self.folder, "socket")
        env = dict(os.environ)
        if not any(env.get(name) for name in PASSIVE_UNLESS_SET):
            env["OMP_WAIT_POLICY"] = "PASSIVE"
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(self.address)
            listener.listen()
            # every holder of alive_w (this process, the processes forked from it, the
            # workers) keeps the server up; when the last one closes it, the server ends
            alive_r, self.alive_w = os.pipe()
            code = (f"from multiprocessing.forkserver import main; "
                    f"main({listener.fileno()}, {alive_r}, {list(self.modules)!r})")
            try:
                self.process = subprocess.Popen([sys.executable, "-c", code], env=env,
                                                pass_fds=(listener.fileno(), alive_r),
                                                stdin=subprocess.DEVNULL)
            except OSError as exc:
                os.close(self.alive_w)
                shutil.rmtree(self.folder, ignore_errors=True)
                raise DpclipError(f"cannot start the workers' fork server: {exc}") from exc
            finally:
                os.close(alive_r)
        atexit.register(self.close)

    def ended(self) -> bool:
        """Whether the server has ended (asked by its starter, its parent; a process forked
        from the starter cannot ask, and relies on the starter having checked)."""
        return os.getpid() == self.owner and self.process.poll() is not None

    def connect(self, fds: list[int]) -> tuple[int, int]:
        """Ask for a new worker (multiprocessing's protocol: the worker's data pipe, its status
        pipe, the alive pipe, the resource tracker and ``fds``): (status read end, data write
        end), as ``multiprocessing.forkserver.connect_to_new_process`` returns them."""
        with socket.socket(socket.AF_UNIX) as client:
            try:
                client.connect(self.address)
            except OSError as exc:
                raise DpclipError(f"the workers' fork server is gone ({exc}); run the command "
                                  f"again") from exc
            parent_r, child_w = os.pipe()
            child_r, parent_w = os.pipe()
            try:
                reduction.sendfds(client, [child_r, child_w, self.alive_w,
                                           resource_tracker.getfd(), *fds])
            except BaseException:
                os.close(parent_r)
                os.close(parent_w)
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
        self.sentinel, write_end = _server.connect(self._fds)
        # the worker reads a copy of the data pipe's write end as its parent's sentinel
        self.finalizer = util.Finalize(self, util.close_fds, (os.dup(write_end), self.sentinel))
        with open(write_end, "wb", closefd=True) as pipe:
            pipe.write(data.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


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
    global _server
    if _server is None or _server.ended():
        _server = ForkServer(modules)
    return _server


def drop_ended_server() -> None:
    """Forget this process's fork server if it has ended (the warm process calls it before
    each fork, so its copies inherit a running server or none)."""
    global _server
    if _server is not None and _server.ended():
        _server.close()
        _server = None


class StandardStreams:
    """This process's standard output and error, passed to a worker with it
    (:func:`attach_streams`): each end is sent as a file descriptor, as multiprocessing sends
    a pipe's."""

    def __reduce__(self):
        return (_streams, (reduction.DupFd(1), reduction.DupFd(2)))


def _streams(stdout, stderr) -> tuple[int, int]:
    return stdout.detach(), stderr.detach()


def attach_streams(streams: tuple[int, int]) -> None:
    """In a worker: write to the standard output and error ``streams`` (from
    :class:`StandardStreams`) from now on."""
    sys.stdout.flush()
    sys.stderr.flush()
    for descriptor, target in zip(streams, (1, 2)):
        os.dup2(descriptor, target)
        os.close(descriptor)
