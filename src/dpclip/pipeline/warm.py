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
   directory and environment, and passes its standard input, output and error (the file
   descriptors themselves, ``SCM_RIGHTS``), instead of running;
3. this process forks; the child takes the command's standard streams, environment and
   arguments, runs :func:`dpclip.cli.main` in its own process group, and exits with its status,
   which goes back to the waiting command; a signal the waiting command gets (Ctrl-C,
   SIGTERM) goes to the child, and a child whose command went away is ended.

The child executes only its own stage's code, with the very modules a cold command imports:
the results are the same bytes (``tests/pipeline/test_warm.py`` compares a warm build with a
cold one). A command is refused, and then simply runs as usual in its own process, when what
the warm process read at import could differ from what the command would read: another
working directory, another environment (but for the variables DVC sets per stage and the
shell's own, :data:`PER_COMMAND_VARIABLES`), or a dpclip source file changed since the
imports. Only the user who started it can connect (the folder's mode, and the peer's uid is
checked). Nothing outlives ``<command>``: the socket's folder is removed when it ends.
"""

from __future__ import annotations

import atexit
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
import traceback
from pathlib import Path

from dpclip.errors import DpclipError
from dpclip.pipeline.spec import MLFLOW_IMPORTS

SOCKET_VARIABLE = "DPCLIP_WARM"
# set per command by DVC (the stage's name and root) or by a shell: not read at import
PER_COMMAND_VARIABLES = ("PWD", "OLDPWD", "SHLVL", "_", "DVC_ROOT", "DVC_STAGE")
# what the stages import as they work (each stage's module, then what its code imports on
# first use): imported once here, so that no command imports them again
WARM_IMPORTS = ("dpclip.cli", "dpclip.pipeline.params", "dpclip.stages.check",
                "dpclip.stages.prepare", "dpclip.stages.partition", "dpclip.stages.shadow",
                "dpclip.stages.tune", "dpclip.stages.train", "dpclip.stages.audit",
                "dpclip.stages.reference", "dpclip.stages.evaluate", "dpclip.stages.report",
                "matplotlib.pyplot", "torch._dynamo", "opacus", "sklearn.metrics", "scipy.stats", *MLFLOW_IMPORTS)
HEADER = struct.Struct("!I")  # the length of each JSON message
_in_child = False  # a forked child runs its command itself (it would else ask the server)


def serve(command: list[str]) -> int:
    """Run ``command`` with warm dpclip commands (module docstring); its exit status."""
    if not command:
        raise DpclipError("warm: no command given (e.g. dpclip warm -- dvc repro)")
    folder = tempfile.mkdtemp(prefix="dpclip-warm-")  # mode 0700: only this user
    path = os.path.join(folder, "socket")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        listener.listen(16)
        env = dict(os.environ, **{SOCKET_VARIABLE: path})
        try:
            running = subprocess.Popen(command, env=env)
        except OSError as exc:
            raise DpclipError(f"warm: cannot run {command[0]!r}: {exc}") from exc
        server = _Server(listener, env)
        interrupted = signal.signal(signal.SIGINT, lambda *_: None)  # the command handles it
        try:
            server.import_once(until=lambda: running.poll() is not None)
            while running.poll() is None:
                server.serve(timeout=0.1)
        finally:
            signal.signal(signal.SIGINT, interrupted)
            server.close()
        print(server.summary(), file=sys.stderr)
        code = running.returncode
        return 128 - code if code < 0 else code  # killed by a signal: as a shell reports it
    finally:
        listener.close()
        shutil.rmtree(folder, ignore_errors=True)


def source_fingerprint() -> tuple:
    """(path, size, modification time) of every dpclip source file: a changed file changes
    it (a command is then refused: the warm process holds the old code)."""
    root = Path(__file__).resolve().parents[1]
    return tuple((str(p), s.st_size, s.st_mtime_ns)
                 for p in sorted(root.rglob("*.py")) for s in [p.stat()])


class _Server:
    """The warm process's side: accept commands, fork a child for each, report its status."""

    def __init__(self, listener: socket.socket, env: dict):
        self.listener, self.env, self.cwd = listener, env, os.getcwd()
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ)
        self.children: dict[int, socket.socket] = {}  # pid -> the waiting command's socket
        self.fingerprint: tuple = ()
        self.served, self.refused = 0, []  # commands run warm; refusals' reasons

    def import_once(self, until) -> None:
        """Import :data:`WARM_IMPORTS` (a missing optional library is skipped), or as many as
        come before ``until()`` is true (the command has ended); the headless backend that the
        figures choose is chosen here first. A command that comes meanwhile is served between
        two imports (the first, ``check``, needs only the first few; its copy imports the rest
        it needs itself)."""
        import matplotlib

        self.fingerprint = source_fingerprint()  # before the imports: an edit meanwhile shows
        matplotlib.use("Agg")
        for name in WARM_IMPORTS:
            if until():
                return
            try:
                importlib.import_module(name)
            except ImportError:
                pass
            self.serve(timeout=0)

    def serve(self, timeout: float) -> None:
        for key, _ in self.selector.select(timeout):
            if key.fileobj is self.listener:
                self._accept()
            else:  # a waiting command went away (or broke the protocol): end its child
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
        """End the children still running (their commands are gone with ``<command>``)."""
        for pid in list(self.children):
            self._end(pid)
            os.waitpid(pid, 0)
            self._report(pid, None)

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        fds: list[int] = []
        try:
            uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                      struct.calcsize("3i")))[1]
            request, fds = _receive(conn, with_fds=True)
            refusal = self._refusal(uid, request, fds)
            if refusal:
                self.refused.append(refusal)
                _send(conn, {"refused": refusal})
                conn.close()
                return
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                self._child(request, fds)  # never returns
        except (OSError, ValueError):
            conn.close()
            return
        finally:
            for fd in fds:  # the child has its copies: the command's readers must see EOF
                os.close(fd)
        self.served += 1
        self.children[pid] = conn
        self.selector.register(conn, selectors.EVENT_READ, pid)
        try:
            _send(conn, {"pid": pid})
        except OSError:  # the command went away: so does its child
            self._end(pid)

    def _refusal(self, uid: int, request: dict, fds: list[int]) -> str | None:
        if uid != os.getuid():
            return "another user"
        if len(fds) != 3:
            return "not the three standard streams"
        if request.get("cwd") != self.cwd:
            return f"another working directory than {self.cwd}"
        ignored = set(PER_COMMAND_VARIABLES)
        env = request.get("env", {})
        differing = sorted(k for k in set(env) | set(self.env)
                           if k not in ignored and env.get(k) != self.env.get(k))
        if differing:
            return f"another environment ({', '.join(differing[:5])})"
        if source_fingerprint() != self.fingerprint:
            return "a dpclip source file changed since the warm imports"
        return None

    def _child(self, request: dict, fds: list[int]) -> None:
        """In the forked child: become the command and exit with its status."""
        global _in_child
        _in_child, code = True, 1
        try:
            self.selector.close()
            self.listener.close()
            for conn in self.children.values():
                conn.close()
            os.setpgid(0, 0)  # signals reach it through the waiting command only
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            sys.stdout.reconfigure(line_buffering=os.isatty(1))
            os.environ.clear()
            os.environ.update(request["env"])
            sys.argv = list(request["argv"])
            from dpclip.cli import main

            code = main(sys.argv[1:])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, (int, type(None))):
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - as an uncaught exception ends a cold command
            traceback.print_exc()
        finally:
            try:
                atexit._run_exitfuncs()  # what a cold command's interpreter runs at exit
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code if isinstance(code, int) else 1)

    def _end(self, pid: int) -> None:
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def _report(self, pid: int, code: int | None) -> None:
        conn = self.children.pop(pid)
        self.selector.unregister(conn)
        try:
            if code is not None:
                _send(conn, {"exit": code})
        except OSError:
            pass
        conn.close()


def run_warm(argv: list[str]) -> int | None:
    """Have the warm process named by :data:`SOCKET_VARIABLE` run ``dpclip <argv>``; its exit
    status, or None when there is none or it refuses (the caller then runs the command)."""
    path = os.environ.get(SOCKET_VARIABLE)
    if not path or _in_child:
        return None
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
        _send(conn, {"argv": [sys.argv[0], *argv], "cwd": os.getcwd(),
                     "env": dict(os.environ)}, fds=[0, 1, 2])
        reply, _ = _receive(conn)
    except (OSError, ValueError):
        return None
    if "pid" not in reply:
        return None
    pid = reply["pid"]

    def forward(signum, _frame):
        try:
            os.killpg(pid, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)
    try:
        done, _ = _receive(conn)
    except (OSError, ValueError):
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


def _receive(conn: socket.socket, with_fds: bool = False) -> tuple[dict, list[int]]:
    """One message (and, ``with_fds``, the file descriptors sent with it); ValueError when the
    connection closes before it is whole or it is no JSON (the descriptors then closed)."""
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
        return json.loads(data[HEADER.size:HEADER.size + HEADER.unpack_from(data)[0]]), fds
    except (ValueError, OSError):
        for fd in fds:
            os.close(fd)
        raise
