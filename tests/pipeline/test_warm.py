"""``dpclip warm``: commands forked from a warm process say and return what cold ones do, and
a command it cannot stand for runs cold. (A whole pipeline built warm gives the bytes of one
built cold: tests/test_e2e_experiments.py against tests/test_e2e.py.)"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import PROJECT

DPCLIP = str(Path(sys.executable).parent / "dpclip")
COMMANDS = f"""
{DPCLIP} --params bad.yaml validate; echo "status $?"
{DPCLIP} validate; echo "status $?"
{DPCLIP} no-such-command; echo "status $?"
exit 3
"""


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "DPCLIP_WARM"}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _project(tmp_path: Path) -> Path:
    shutil.copy(PROJECT / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "bad.yaml").write_text("train:\n  epochs: -1\n")
    (tmp_path / "commands.sh").write_text(COMMANDS)
    return tmp_path


def test_warm_commands_say_and_return_what_cold_ones_do(tmp_path):
    project = _project(tmp_path)
    cold = _run(["sh", "commands.sh"], project)
    warm = _run([DPCLIP, "warm", "--", "sh", "commands.sh"], project)
    assert warm.returncode == cold.returncode == 3  # the command's own status
    assert warm.stdout == cold.stdout
    assert [line for line in cold.stdout.splitlines() if line.startswith("status")] == \
        ["status 2", "status 0", "status 2"]  # a bad value, a good file, argparse's refusal
    assert "train.epochs: -1" in warm.stderr and "invalid choice: 'no-such-command'" in \
        warm.stderr
    assert warm.stderr.replace(
        "dpclip warm: 3 dpclip command(s) started warm\n", "") == cold.stderr
    refused = _run([DPCLIP, "warm"], project)
    assert refused.returncode == 2 and "warm: no command given" in refused.stderr


def test_a_command_the_warm_process_cannot_stand_for_runs_cold(tmp_path, monkeypatch):
    """Another environment (a variable torch or OpenMP may read at import) or another working
    directory (a path resolved at import) than the warm process's: the command runs in its
    own process (in its own directory: the relative path resolves there), and the summary says
    why."""
    from dpclip.cli import build_parser

    monkeypatch.setenv("COLUMNS", "80")  # argparse's width, here and in the commands
    project = _project(tmp_path)
    (project / "elsewhere").mkdir()
    # the first: `--help`, which imports no library cold (0.2 s against 2.8 s for `validate`)
    script = (f"FOO=1 {DPCLIP} --help; echo \"status $?\"\n"
              f"cd elsewhere && {DPCLIP} --params ../params.yaml validate; echo \"status $?\"\n")
    warm = _run([DPCLIP, "warm", "--", "sh", "-c", script], project)
    assert warm.returncode == 0
    assert warm.stdout == (f"{build_parser().format_help()}status 0\n"
                           f"params.yaml is valid\nstatus 0\n")
    assert f"0 dpclip command(s) started warm, 2 cold (another environment (FOO); another " \
           f"working directory than {project})" in warm.stderr


def test_ctrl_c_stops_a_warm_command_as_it_stops_a_cold_one(tmp_path, tiny_raw, write_params):
    """The copy joins the waiting command's process group, so the terminal's Ctrl-C (a SIGINT
    to the foreground group) reaches it as it reaches a cold command: KeyboardInterrupt, and
    the same status."""
    from conftest import prepared_project

    base = prepared_project(tmp_path, tiny_raw(train={"epochs": 100000}), write_params)
    command = [DPCLIP, *base, "train", "--method", "non_private", "--epsilon", "8",
               "--alpha", "iid", "--seed", "0"]
    statuses, outputs = {}, {}
    for way, args in (("cold", command), ("warm", [DPCLIP, "warm", "--", *command])):
        env = {k: v for k, v in os.environ.items() if k != "DPCLIP_WARM"}
        running = subprocess.Popen(args, cwd=tmp_path, env=env, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True)  # a terminal's group
        checkpoint = tmp_path / ".dpclip" / "checkpoints" / "non_private-eps8-iid-seed0.pt"
        deadline = time.monotonic() + 120
        while not checkpoint.exists() and running.poll() is None and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        assert running.poll() is None, running.communicate()[1]  # training, after 5 epochs
        os.killpg(running.pid, signal.SIGINT)
        _, outputs[way] = running.communicate(timeout=60)
        statuses[way] = running.returncode
        checkpoint.unlink()
    assert "KeyboardInterrupt" in outputs["cold"] and "KeyboardInterrupt" in outputs["warm"]
    assert statuses["warm"] == statuses["cold"] != 0
    assert "dpclip warm: 1 dpclip command(s) started warm" in outputs["warm"]


def test_the_warm_process_freezes_what_it_imported_out_of_the_collectors_reach(monkeypatch):
    """A copy's last collection (``gc.collect()`` at its exit) then scans only what its own
    command made: with every import scanned it took 0.41-0.46 s a command, nearly all of a
    light stage's 0.6 s."""
    import gc
    import socket

    from dpclip.pipeline import warm

    monkeypatch.setattr(warm, "WARM_IMPORTS", ("json",))
    listener = socket.socket(socket.AF_UNIX)
    server = warm._Server(listener, dict(os.environ), main=lambda argv: 0)
    try:
        gc.unfreeze()
        server.import_once(until=lambda: False)
        assert gc.get_freeze_count() > 1000  # the modules imported so far, every function
    finally:
        gc.unfreeze()
        server.selector.close()
        listener.close()
