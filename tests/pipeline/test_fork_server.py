"""The workers' fork server (dpclip.pipeline.fork_server): a process forked from the one that
started it gets its workers from it too (what the commands under ``dpclip warm`` rely on), a
worker writes to the standard streams of the process that asked for it, the server imports
in OpenMP's passive mode unless the user chose a policy, and it ends when its starter lets it."""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

from dpclip.pipeline import fork_server
from dpclip.pipeline.side_by_side import run_side_by_side


def worker_facts(_key=None) -> dict:
    """What a worker reports of itself (module level: it goes to the worker by pickle)."""
    print("a line from the worker", flush=True)
    return {"parent": os.getppid(), "policy": os.environ.get("OMP_WAIT_POLICY")}


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


def test_a_process_forked_from_the_starter_gets_its_workers_from_the_same_server(server):
    here = dict(run_side_by_side(worker_facts, [0, 1], 2, "dpclip.io"))
    forked = _in_forked_child(lambda: dict(run_side_by_side(worker_facts, [0, 1], 2,
                                                            "dpclip.io")))
    assert {facts["parent"] for facts in here.values()} == {server.process.pid}
    assert {facts["parent"] for facts in forked.values()} == {server.process.pid}
    assert fork_server._server is server  # the forked process started none of its own


def test_a_worker_writes_to_the_output_of_the_process_that_asked_for_it(server, tmp_path):
    log = tmp_path / "asked.log"

    def ask() -> dict:
        with open(log, "w") as out:
            os.dup2(out.fileno(), 1)
        sys.stdout = os.fdopen(1, "w", closefd=False)
        return dict(run_side_by_side(worker_facts, [0], 2, "dpclip.io"))

    _in_forked_child(ask)  # its standard output is the file; the server's is not
    assert log.read_text().count("a line from the worker") == 1


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
    assert fork_server.start_server(()) is not server  # an ended server is replaced


def test_a_forked_process_does_not_close_its_starters_server(server):
    _in_forked_child(lambda: (server.close(), {})[1])
    assert server.process.poll() is None and os.path.exists(server.address)


def test_the_warm_process_starts_one_server_for_every_stages_workers(monkeypatch):
    from dpclip.pipeline import warm
    from dpclip.pipeline.spec import STAGES

    started = []
    monkeypatch.setattr(fork_server, "start_server", started.append)
    monkeypatch.setenv("DPCLIP_JOBS", "2")
    warm._start_worker_server()
    assert set(started[0]) == {"dpclip", *(m for stage in STAGES for m in stage.workers),
                               *warm.FIRST_USE_IMPORTS}
    assert "dpclip.stages.train" in started[0] and "mlflow" in started[0]
    monkeypatch.setenv("DPCLIP_JOBS", "1")  # no command would start workers
    warm._start_worker_server()
    assert len(started) == 1
