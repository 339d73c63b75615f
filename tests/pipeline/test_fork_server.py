"""The workers' fork server (dpclip.pipeline.fork_server): a process forked from the one that
started it gets its workers from it too (what the commands under ``dpclip warm`` rely on), and
starts its own when that one is gone; a worker takes the asking process's standard streams,
umask and ignored signals; the server imports in OpenMP's passive mode unless the user chose a
policy, and ends when its starter lets it; the warm process's server gives the runs' bytes."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from conftest import prepared_project
from dpclip.pipeline import fork_server
from dpclip.pipeline.side_by_side import run_side_by_side


def _process_facts() -> dict:
    mask = os.umask(0o077)
    os.umask(mask)
    return {"umask": mask, "sighup_ignored": signal.getsignal(signal.SIGHUP) is signal.SIG_IGN,
            "cpus": sorted(os.sched_getaffinity(0))}


def worker_facts(_key=None) -> dict:
    """What a worker reports of itself (module level: it goes to the worker by pickle)."""
    print("a line from the worker", flush=True)
    return {"parent": os.getppid(), "policy": os.environ.get("OMP_WAIT_POLICY"),
            **_process_facts()}


@pytest.fixture
def server(monkeypatch):
    """A fresh server, this process's for the test (the module keeps one per process)."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    started = fork_server.ForkServer(())
    monkeypatch.setattr(fork_server, "_server", started)
    yield started
    started.close()


def _in_forked_child(work) -> dict:
    """Run ``work()`` in a process forked from this one (as the warm process forks a
    command's copy); its JSON result, read back over a pipe."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's own coverage is not collected
        code = 1
        try:
            os.close(read_end)
            with os.fdopen(write_end, "w") as out:
                json.dump(work(), out)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as result:
        text = result.read()
    assert os.waitpid(pid, 0)[1] == 0, text
    return json.loads(text)


def _facts_of_two_workers() -> dict:
    facts = {"facts": dict(run_side_by_side(worker_facts, [0, 1], 2, "dpclip.io")),
             "own_server": fork_server._server.owner == os.getpid()}
    if facts["own_server"] and os.getpid() != _TEST_PROCESS:
        fork_server._server.close()  # a forked child's own: it exits with os._exit, no atexit
    return facts


_TEST_PROCESS = os.getpid()


def test_a_process_forked_from_the_starter_gets_its_workers_from_the_same_server(server):
    here = _facts_of_two_workers()
    forked = _in_forked_child(_facts_of_two_workers)
    assert {facts["parent"] for facts in here["facts"].values()} == {server.process.pid}
    assert {facts["parent"] for facts in forked["facts"].values()} == {server.process.pid}
    assert forked["own_server"] is False  # it started none of its own


def test_a_forked_process_whose_inherited_server_is_gone_starts_its_own(server):
    server.process.kill()
    server.process.wait()
    forked = _in_forked_child(_facts_of_two_workers)
    assert forked["own_server"] is True
    assert server.process.pid not in {facts["parent"] for facts in forked["facts"].values()}
    fork_server.drop_ended_server()  # as the warm process does before each fork
    assert fork_server._server is None and not os.path.exists(server.folder)


def test_a_worker_takes_the_asking_processs_output_umask_cpus_and_ignored_signals(server,
                                                                                  tmp_path):
    log = tmp_path / "asked.log"
    parent = _process_facts()
    asked = {"umask": 0o027 if parent["umask"] == 0o077 else 0o077,
             "sighup_ignored": not parent["sighup_ignored"], "cpus": parent["cpus"][:1]}

    def ask() -> dict:
        with open(log, "w") as out:
            os.dup2(out.fileno(), 1)
        sys.stdout = os.fdopen(1, "w", closefd=False)
        os.umask(asked["umask"])
        signal.signal(signal.SIGHUP, signal.SIG_IGN if asked["sighup_ignored"] else
                      signal.SIG_DFL)  # as nohup starts a command, or not
        os.sched_setaffinity(0, asked["cpus"])
        return dict(run_side_by_side(worker_facts, [0], 2, "dpclip.io"))

    facts = _in_forked_child(ask)["0"]  # its standard output is the file; the server's is not
    assert log.read_text().count("a line from the worker") == 1
    assert {k: facts[k] for k in asked} == asked
    here = dict(run_side_by_side(worker_facts, [0], 2, "dpclip.io"))[0]
    assert {k: here[k] for k in parent} == parent


def test_the_server_imports_in_passive_mode_unless_a_policy_is_chosen(server, monkeypatch):
    with ProcessPoolExecutor(1, mp_context=fork_server.WORKERS) as pool:
        assert pool.submit(worker_facts).result()["policy"] == "PASSIVE"
    assert "OMP_WAIT_POLICY" not in os.environ  # this process keeps its own
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    chosen = fork_server.ForkServer(())
    monkeypatch.setattr(fork_server, "_server", chosen)
    try:
        with ProcessPoolExecutor(1, mp_context=fork_server.WORKERS) as pool:
            assert pool.submit(worker_facts).result()["policy"] == "ACTIVE"
    finally:
        chosen.close()


def test_the_server_ends_and_its_folder_goes_when_its_starter_closes_it(server):
    server.close()
    for _ in range(100):
        if server.process.poll() is not None:
            break
        time.sleep(0.05)
    assert server.process.returncode == 0
    assert not os.path.exists(server.folder)
    replacement = fork_server.start_server(())  # an ended server is replaced
    try:
        assert replacement is not server and replacement.process.poll() is None
    finally:
        replacement.close()


def test_a_forked_process_does_not_close_its_starters_server(server):
    _in_forked_child(lambda: (server.close(), {})[1])
    assert server.process.poll() is None and os.path.exists(server.address)


def test_a_server_that_cannot_start_says_why_and_leaves_no_folder(monkeypatch, tmp_path):
    from dpclip.errors import DpclipError

    monkeypatch.setenv("TMPDIR", str(tmp_path / ("d" * 120)))  # a socket path over the limit
    (tmp_path / ("d" * 120)).mkdir()
    monkeypatch.setattr("tempfile.tempdir", None)
    with pytest.raises(DpclipError, match="cannot start the workers' fork server"):
        fork_server.ForkServer(())
    assert list((tmp_path / ("d" * 120)).iterdir()) == []


def test_the_warm_process_server_imports_every_stages_workers_and_their_first_use(monkeypatch):
    from dpclip.pipeline import warm

    started = []
    monkeypatch.setattr(fork_server, "start_server", started.append)
    monkeypatch.setenv("DPCLIP_JOBS", "2")
    warm._start_worker_server()
    assert {"dpclip", "dpclip.stages.train", "dpclip.stages.audit", "dpclip.stages.reference",
            "dpclip.stages.evaluate", "dpclip.tracking", "mlflow", "torch.export", "opacus",
            "torch._dynamo", "matplotlib.pyplot"} <= set(started[0])
    monkeypatch.setenv("DPCLIP_JOBS", "1")  # no command would start workers
    warm._start_worker_server()
    assert len(started) == 1


def _outputs(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for folder in ("runs", "traces")
            for p in sorted((root / folder).rglob("*")) if p.is_file()}


def test_runs_from_the_warm_processs_server_write_the_bytes_of_runs_in_one_process(
        tmp_path, tiny_raw, write_params, monkeypatch):
    """The production path: the server the warm process starts (every stage's modules and
    their first-use imports), used by a copy forked from this process, which starts no server
    of its own; its two workers train the bytes that one process trains."""
    from dpclip.cli import main
    from dpclip.pipeline import warm

    monkeypatch.setenv("DPCLIP_JOBS", "2")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(fork_server, "_server", None)
    raw = tiny_raw(train={"methods": ["dp_sgd", "auto_s"]})
    roots = {jobs: tmp_path / f"jobs{jobs}" for jobs in (1, 2)}
    bases = {}
    for jobs, root in roots.items():
        root.mkdir()
        bases[jobs] = prepared_project(root, raw, write_params)
    assert main([*bases[1], "train", "--jobs", "1"]) == 0
    warm._start_worker_server()
    shared = fork_server._server
    assert shared is not None
    try:
        def copy() -> dict:
            def refuse(*_args):
                raise AssertionError("the copy started a fork server of its own")
            fork_server.ForkServer.__init__ = refuse
            return {"status": main([*bases[2], "train"])}

        assert _in_forked_child(copy) == {"status": 0}
    finally:
        shared.close()
    one, two = _outputs(roots[1]), _outputs(roots[2])
    assert len(one) >= 6 and one == two
