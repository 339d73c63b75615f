"""``dpclip warm -- <command>``: the dpclip commands that ``<command>`` runs start warm.

A stage's command spends two to four seconds importing torch, pandas, pydantic, Opacus,
scikit-learn and matplotlib and validating params.yaml before it does any work, and a pipeline
runs ten of them one after another: on the default pipeline that start-up is most of the wall
time. Under ``dpclip warm -- dvc repro`` (what ``make run`` runs) this process imports those
modules once, while ``<command>`` starts, and every ``dpclip`` command that ``<command>`` runs
is carried out by a process forked from it (a zygote: the fork server of
:mod:`multiprocessing`, across processes):

1. ``<command>`` gets the environment variable :data:`SOCKET_VARIABLE`, the path of a Unix
   socket in a private folder (mode 0700) that this process listens on;
2. a ``dpclip`` command that finds it (:func:`run_warm`) sends its arguments, working
   directory, environment, umask, CPU set and ignored signals, and passes its standard input,
   output and error (the file descriptors themselves, ``SCM_RIGHTS``), instead of running;
3. this process forks a copy; the copy joins the waiting command's process group (so the
   terminal's Ctrl-C reaches it as it would reach the command), takes the command's streams,
   environment and arguments, runs :func:`dpclip.cli.main` and exits as a cold interpreter
   would (threads joined, exit handlers run); its status goes back to the waiting command,
   which passes on a SIGTERM or SIGHUP it gets; a copy whose command went away is ended.

The copy executes only its own stage's code, in a process that has imported every stage's
modules and their libraries (module code that defines functions and classes): the results are
the same bytes (tests/test_e2e_experiments.py builds a project warm and compares every
committed file with tests/test_e2e.py's cold build). A command is refused, and then simply
runs as usual in its own process, when what the warm process read at import could differ from
what the command would read: another working directory, another environment (but for
:data:`PER_COMMAND_VARIABLES`), another Python or dpclip installation, or a dpclip source file
or plugin module changed since the imports. Only the user who started it can connect (the
folder's mode, and the peer's uid is checked). When ``<command>`` ends, so does this process,
after ending any copy still running, and the socket's folder is removed.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from importlib.metadata import distributions
from pathlib import Path
from typing import Callable

from dpclip.errors import DpclipError
from dpclip.pipeline import fork_server
from dpclip.pipeline.side_by_side import default_jobs
from dpclip.pipeline.fork_server import PASSED_SIGNALS
from dpclip.pipeline.spec import MLFLOW_IMPORTS, STAGES

SOCKET_VARIABLE = "DPCLIP_WARM"
# set per command by DVC (the stage; an experiment's name and base) or by a shell; no library
# reads them at import
PER_COMMAND_VARIABLES = ("PWD", "OLDPWD", "SHLVL", "_", "DVC_ROOT", "DVC_STAGE",
                         "DVC_EXP_BASELINE_REV", "DVC_EXP_NAME")
# what the stages' code imports on first use (figures, the first optimizer, the accountant,
# the attacks' metrics and tests): a worker's first run spent 0.8 to 1.8 s more than its second
# importing them (audit 2.38 against 1.07 s, reference 3.63 against 1.81, evaluate 1.99 against
# 0.56), each worker again
FIRST_USE_IMPORTS = ("matplotlib.pyplot", "torch._dynamo", "opacus", "sklearn.metrics",
                     "scipy.stats")
# what the stages import as they work (each stage's module, then what its code imports on
# first use), in the order they are needed: imported once here, so that no command imports
# them again
WARM_IMPORTS = ("dpclip.cli", "dpclip.pipeline.params", *(stage.module for stage in STAGES),
                *FIRST_USE_IMPORTS, *MLFLOW_IMPORTS)
HEADER = struct.Struct("!I")  # the length of each JSON message
UCRED = struct.Struct("iII")  # SO_PEERCRED: pid, uid, gid
STOP_WAIT_S = 10  # a copy still running when the command ends: SIGTERM, then this, SIGKILL
_in_child = False  # a forked copy runs its command itself (it would else ask the server)


def serve(command: list[str], main: Callable[[list[str]], int]) -> int:
    """Run ``command`` with warm dpclip commands (module docstring); its exit status. ``main``:
    what a copy runs with the command's arguments (:func:`dpclip.cli.main`)."""
    if not command:
        raise DpclipError("warm: no command given (e.g. dpclip warm -- dvc repro)")
    folder = tempfile.mkdtemp(prefix="dpclip-warm-")  # mode 0700: only this user
    path = os.path.join(folder, "socket")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    handlers = {}
    try:
        listener.bind(path)
        listener.listen(16)
        env = dict(os.environ, **{SOCKET_VARIABLE: path})
        try:
            running = subprocess.Popen(command, env=env)
        except OSError as exc:
            raise DpclipError(f"warm: cannot run {command[0]!r}: {exc}") from exc
        # Ctrl-C reaches the command from the terminal; SIGTERM and SIGHUP are passed on to it,
        # and this process ends when it does (so its copies and the socket's folder with it)
        handlers[signal.SIGINT] = signal.signal(signal.SIGINT, lambda *_: None)
        for signum in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) is not signal.SIG_IGN:  # nohup: stays ignored
                handlers[signum] = signal.signal(signum, lambda n, _: running.send_signal(n))
        server = _Server(listener, env, main)
        try:
            server.import_once(until=lambda: running.poll() is not None)
            while running.poll() is None:
                server.serve(timeout=0.1)
        finally:
            server.close()
            if running.poll() is None:  # this process failed: do not leave the command alone
                running.terminate()
                running.wait()
        print(server.summary(), file=sys.stderr)
        code = running.returncode
        return 128 - code if code < 0 else code  # killed by a signal: as a shell reports it
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        listener.close()
        shutil.rmtree(folder, ignore_errors=True)


def plugin_modules() -> list[str]:
    """The modules that installed plugins register (the ``dpclip.*`` entry-point groups)."""
    return sorted({entry.module for dist in distributions() for entry in dist.entry_points
                   if entry.group.startswith("dpclip")})


def source_fingerprint(plugins: list[str] = ()) -> tuple:
    """(path, size, modification time) of every dpclip source file, then of each of the
    ``plugins`` modules imported so far: a changed file changes it (a command is then refused:
    the warm process holds the old code)."""
    files = sorted(Path(_package()).rglob("*.py"))
    files += [Path(sys.modules[name].__file__) for name in plugins
              if getattr(sys.modules.get(name), "__file__", None)]
    return tuple((str(p), s.st_size, s.st_mtime_ns) for p in files for s in [p.stat()])


class _Server:
    """The warm process's side: accept commands, fork a copy for each, report its status."""

    def __init__(self, listener: socket.socket, env: dict, main: Callable[[list[str]], int]):
        self.listener, self.env, self.cwd, self.main = listener, env, os.getcwd(), main
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ)
        self.children: dict[int, socket.socket] = {}  # pid -> the waiting command's socket
        self.plugins = plugin_modules()
        self.fingerprint: tuple = ()  # of the code imported so far (empty: refuse every command)
        self.served, self.refused = 0, []  # commands run warm; refusals' reasons

    def import_once(self, until) -> None:
        """Import :data:`WARM_IMPORTS` (one that fails is skipped: a command that needs it
        fails as it would cold), or as many as come before ``until()`` is true (the command
        has ended); the headless backend that the figures choose is chosen here first. A
        command that comes meanwhile is served between two imports (the first, ``check``,
        needs only the first few; its copy imports the rest it needs itself). Then what the
        imports made is frozen out of the garbage collector's reach (``gc.freeze``)."""
        import matplotlib

        base = self.fingerprint = source_fingerprint()  # an edit during the imports shows
        _start_worker_server()
        matplotlib.use("Agg")
        for name in WARM_IMPORTS:
            if until():
                return
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001
                pass
            now = source_fingerprint(self.plugins)  # with the plugins imported by now
            self.fingerprint = now if now[:len(base)] == base else ()
            self.serve(timeout=0)
        # what the imports left is collected here, once, and the rest (reachable: modules,
        # functions, classes) is moved out of the collector's reach: a copy's last collection
        # then scans only what its command made (0.41-0.46 s a command with everything
        # scanned, measured), and its collections leave those pages shared
        gc.collect()
        gc.freeze()

    def serve(self, timeout: float) -> None:
        for key, _ in self.selector.select(timeout):
            if key.fileobj is self.listener:
                self._accept()
            else:  # a waiting command went away (or broke the protocol): end its copy
                self.selector.unregister(key.fileobj)
                self._end(key.data)
        for pid in list(self.children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                self._report(pid, os.waitstatus_to_exitcode(status))

    def summary(self) -> str:
        """What the user sees at the end: how many commands started warm, and why any did
        not."""
        text = f"dpclip warm: {self.served} dpclip command(s) started warm"
        if self.refused:
            reasons = sorted(set(self.refused))
            text += f", {len(self.refused)} cold ({'; '.join(reasons)})"
        return text

    def close(self) -> None:
        """End the copies still running (their commands are gone with ``<command>``): SIGTERM
        (and SIGCONT, should one be stopped), then SIGKILL after :data:`STOP_WAIT_S`."""
        for pid in list(self.children):
            self._end(pid)
            for _ in range(STOP_WAIT_S * 10):
                if os.waitpid(pid, os.WNOHANG)[0]:
                    break
                time.sleep(0.1)
            else:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            self._report(pid, None)

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        fds: list[int] = []
        try:
            uid = UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                               UCRED.size))[1]
            request, fds = _receive(conn, with_fds=True)
            refusal = self._refusal(uid, request, fds)
            if refusal:
                self.refused.append(refusal)
                _send(conn, {"refused": refusal})
                conn.close()
                return
            fork_server.drop_ended_server()  # the copy inherits a running one or none
            sys.stdout.flush()
            sys.stderr.flush()
            # no signal between the fork and the copy's own handlers: it waits for them
            signal.pthread_sigmask(signal.SIG_BLOCK, PASSED_SIGNALS)
            try:
                pid = os.fork()
                if pid == 0:
                    self._child(request, fds, conn)  # never returns
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, PASSED_SIGNALS)
        except Exception:  # noqa: BLE001 - that command's failure, never the server's: its
            conn.close()  # socket closes, and it says so
            return
        finally:
            for fd in fds:  # the copy has its own: the command's readers must see EOF
                os.close(fd)
        joined = _join_group(pid, request["pgrp"])  # as the copy does: no signal before it
        self.served += 1
        self.children[pid] = conn
        self.selector.register(conn, selectors.EVENT_READ, pid)
        try:
            _send(conn, {"pid": pid, "joined": joined})
        except OSError:  # the command went away: so does its copy
            self.selector.unregister(conn)
            self._end(pid)

    def _refusal(self, uid: int, request: dict, fds: list[int]) -> str | None:
        """Why a command cannot run warm (None: it can): what the warm process read at import
        could differ from what the command would read."""
        if uid != os.getuid():
            return "another user"
        if not {"argv", "cwd", "env", "pgrp", "umask", "cpus", "ignored"} <= set(request):
            return "an incomplete request"
        if len(fds) != 3:
            return "not the three standard streams"
        if (request.get("python"), request.get("dpclip")) != (sys.executable, _package()):
            return "another Python or dpclip installation"
        if request.get("cwd") != self.cwd:
            return f"another working directory than {self.cwd}"
        ignored = set(PER_COMMAND_VARIABLES)
        env = request.get("env", {})
        differing = sorted(k for k in set(env) | set(self.env)
                           if k not in ignored and env.get(k) != self.env.get(k))
        if differing:
            return f"another environment ({', '.join(differing[:5])})"
        if not self.fingerprint or source_fingerprint(self.plugins) != self.fingerprint:
            return "a dpclip source file changed since the warm imports"
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():  # pragma: no cover - GPU
            return "CUDA was initialised in the warm process"
        return None

    def _child(self, request: dict, fds: list[int], conn: socket.socket) -> None:
        """In the forked copy: become the command and exit as its interpreter would."""
        global _in_child
        _in_child, code = True, 1
        try:
            self.selector.close()
            self.listener.close()
            conn.close()
            for other in self.children.values():
                other.close()
            _join_group(0, request["pgrp"])
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            fds.clear()
            fork_server.start_signals(request["ignored"])  # what a cold command starts with
            signal.pthread_sigmask(signal.SIG_UNBLOCK, PASSED_SIGNALS)
            sys.stdout.reconfigure(line_buffering=os.isatty(1))
            os.umask(request["umask"])
            if request["cpus"] and hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, request["cpus"])
            own = {k: v for k, v in os.environ.items() if k not in self.env}
            os.environ.clear()
            os.environ.update(own)  # what the warm imports set, as a cold command's would
            os.environ.update(request["env"])
            sys.argv = list(request["argv"])
            code = self.main(sys.argv[1:])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, (int, type(None))):
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - as an uncaught exception (Ctrl-C's
            traceback.print_exc()  # KeyboardInterrupt too) ends a cold command: status 1
        finally:
            try:
                threading._shutdown()  # what a cold interpreter does at exit: threads, then
                atexit._run_exitfuncs()  # the exit handlers, then the last collection
                gc.collect()
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code if isinstance(code, int) else 1)

    def _end(self, pid: int) -> None:
        for signum in (signal.SIGTERM, signal.SIGCONT):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def _report(self, pid: int, code: int | None) -> None:
        conn = self.children.pop(pid)
        if conn in {key.fileobj for key in self.selector.get_map().values()}:
            self.selector.unregister(conn)
        try:
            if code is not None:
                _send(conn, {"exit": code})
        except OSError:
            pass
        conn.close()


def _start_worker_server() -> None:
    """Start the fork server of every stage's side-by-side workers, which the copies inherit
    (:mod:`dpclip.pipeline.fork_server`), with what their runs import on first use; none
    where the per-run stages would run no workers (one CPU, a GPU, ``DPCLIP_JOBS=1``) or it
    cannot start: a command that does start workers (the report's, on a GPU machine) then
    starts its own, as it would cold."""
    try:
        if default_jobs(device="auto") < 2:
            return
        modules = dict.fromkeys(("dpclip", *(name for stage in STAGES
                                             for name in stage.workers), *FIRST_USE_IMPORTS))
        fork_server.start_server(tuple(modules))
    except DpclipError as exc:  # no server: each command that runs workers starts its own
        print(f"dpclip warm: {exc}; no shared fork server", file=sys.stderr)


def _join_group(pid: int, pgrp: int) -> bool:
    """Put the copy ``pid`` (0: this process) into the waiting command's process group, so
    that the terminal treats it as that command (Ctrl-C, Ctrl-Z, reading standard input);
    its own group where that is not allowed (another session). Whether it joined."""
    try:
        os.setpgid(pid, pgrp)
        return True
    except OSError:
        try:
            os.setpgid(pid, 0)
        except OSError:
            pass
        return False


def _package() -> str:
    return str(Path(__file__).resolve().parents[1])


def run_warm(argv: list[str]) -> int | None:
    """Have the warm process named by :data:`SOCKET_VARIABLE` run ``dpclip <argv>``; its exit
    status, or None when there is none or it refuses (the caller then runs the command)."""
    path = os.environ.get(SOCKET_VARIABLE)
    if not path or _in_child:
        return None
    umask, ignored = fork_server.current_umask(), fork_server.ignored_signals()
    request = {"argv": [sys.argv[0], *argv], "cwd": os.getcwd(), "env": dict(os.environ),
               "pgrp": os.getpgrp(), "umask": umask, "python": sys.executable,
               "dpclip": _package(), "ignored": ignored,
               "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else []}
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
        _send(conn, request, fds=[0, 1, 2])
    except OSError:
        return None  # no warm process to ask: run cold
    replies = conn.makefile("rb")
    try:
        reply = _read_message(replies)
    except (OSError, ValueError):
        reply = {}
    if "refused" in reply:
        return None
    if "pid" not in reply:
        print("dpclip: error: the warm process (dpclip warm) ended without starting the "
              "command; run it without dpclip warm", file=sys.stderr)
        return 1
    pid = reply["pid"]

    def forward(signum, _frame):  # a signal sent to this process, not to its group
        try:
            os.kill(pid, signum)
        except OSError:
            pass

    # in this process's group, the copy gets the terminal's Ctrl-C itself: this process waits
    # for its status, as the copy handles it; in a group of its own, Ctrl-C is passed on
    for signum in PASSED_SIGNALS:  # one this process ignores, the copy ignores too
        if signum not in ignored:
            joined = signum == signal.SIGINT and reply.get("joined")
            signal.signal(signum, signal.SIG_IGN if joined else forward)
    try:
        done = _read_message(replies)
    except (OSError, ValueError):
        forward(signal.SIGTERM, None)
        print("dpclip: error: the warm process (dpclip warm) ended before the command",
              file=sys.stderr)
        return 1
    code = done["exit"]
    return 128 - code if code < 0 else code  # a signal's number, as a shell reports it


def _send(conn: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    data = HEADER.pack(len(data)) + data
    if fds:
        sent = socket.send_fds(conn, [data], fds)
        conn.sendall(data[sent:])
    else:
        conn.sendall(data)


def _read_message(stream) -> dict:
    """The next whole message from a buffered reader of the socket (replies can arrive
    together: the process id and, for a short command, its status)."""
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        raise ValueError("the connection closed")
    (size,) = HEADER.unpack(header)
    body = stream.read(size)
    if len(body) < size:
        raise ValueError("the connection closed mid-message")
    return json.loads(body)


def _receive(conn: socket.socket, with_fds: bool = False) -> tuple[dict, list[int]]:
    """One message (and, ``with_fds``, the file descriptors sent with it); ValueError when the
    connection closes before it is whole or it is no JSON object (the descriptors then
    closed)."""
    fds: list[int] = []
    if with_fds:
        data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    else:
        data = conn.recv(1 << 16)
    try:
        while len(data) < HEADER.size or \
                len(data) < HEADER.size + HEADER.unpack_from(data)[0]:
            more = conn.recv(1 << 16)
            if not more:
                raise ValueError("the connection closed mid-message")
            data += more
        message = json.loads(data[HEADER.size:HEADER.size + HEADER.unpack_from(data)[0]])
        if not isinstance(message, dict):
            raise ValueError("not a request")
        return message, fds
    except (ValueError, OSError):
        for fd in fds:
            os.close(fd)
        raise
