"""Runs of a per-run stage side by side in worker processes (dpclip.pipeline.side_by_side):
the same bytes as one process, failures reported after the runs under way finish, and the
worker count checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import prepared_project
from dpclip.cli import main
from dpclip.errors import ConfigError, DpclipError
from dpclip.pipeline.side_by_side import PROGRESS_ROW, in_a_worker, run_side_by_side


def _outputs(root: Path) -> dict[str, bytes]:
    """Every file the per-run stages wrote that DVC hashes, but for their figures (PNG files
    carry no number of their own), and the report's files, its figures too (drawn in a worker
    with two jobs, in the command's process with one)."""
    folders = ("runs", "traces", "audits", "references", "metrics", "scores", "plots/roc",
               "plots/reliability", "reports")
    return {str(p.relative_to(root)): p.read_bytes() for folder in folders
            for p in sorted((root / folder).rglob("*")) if p.is_file()}


# what differs between two stores' records of the same child: ids, times, where it is stored
_STORE_TAGS = {"mlflow.parentRunId", "dpclip.pipelines", "dpclip.model_uri",
               "mlflow.log-model.history"}


def _logged_model(client, run) -> tuple:
    """The child's logged model (its tag dpclip.model_uri): its name, whether the child logged
    it, and its files."""
    model = client.get_logged_model(run.data.tags["dpclip.model_uri"].removeprefix("models:/"))
    files = sorted(item.path for item in client.list_logged_model_artifacts(model.model_id))
    return model.name, model.source_run_id == run.info.run_id, files


def _children(root: Path) -> dict[str, dict]:
    """Each configuration child of the project's MLflow store: its name, parameters, metrics
    (last values but the training's wall times, and the number of steps), tags but the
    store's own, inputs, artifact paths and logged model."""
    import mlflow

    from dpclip.tracking import TIMING_METRICS

    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("dpclip-digits")

    def artifacts(run_id: str, folder: str | None = None) -> list[str]:
        return [path for item in client.list_artifacts(run_id, folder) for path in (
            artifacts(run_id, item.path) if item.is_dir else [item.path])]

    return {run.data.tags["dpclip.run"]: {
        "name": run.info.run_name, "params": run.data.params,
        "metrics": {k: v for k, v in run.data.metrics.items() if k not in TIMING_METRICS},
        "steps": len(client.get_metric_history(run.info.run_id, "clip_threshold")),
        "tags": {k: v for k, v in run.data.tags.items() if k not in _STORE_TAGS},
        "inputs": sorted(i.dataset.digest for i in run.inputs.dataset_inputs),
        "artifacts": sorted(artifacts(run.info.run_id)),
        "model": _logged_model(client, run)}
        for run in client.search_runs([experiment.experiment_id])
        if run.data.tags.get("dpclip.kind") == "configuration"}


def test_runs_side_by_side_write_the_bytes_of_runs_in_one_process(tmp_path, tiny_raw,
                                                                   write_params, capsys,
                                                                   monkeypatch):
    """Each run sets its own thread count and seeds, so two workers write the same models,
    traces, audits, reference models' signals and metrics as one process, in every per-run
    stage; the lines come in the configured order. The report's MLflow children, logged by
    two workers, hold what one process logs."""
    from dpclip.tracking import model_name

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # each project's own store
    raw = tiny_raw(train={"methods": ["dp_sgd", "auto_s"]},
                   attack={"references": 2})
    roots = {jobs: tmp_path / f"jobs{jobs}" for jobs in (1, 2)}
    bases = {}
    for jobs, root in roots.items():
        root.mkdir()
        bases[jobs] = prepared_project(root, raw, write_params)
        for stage in ("train", "audit", "reference", "evaluate", "report"):
            assert main([*bases[jobs], stage, "--jobs", str(jobs)]) == 0
    out = capsys.readouterr().out
    assert out.count("[1/2] dp_sgd-eps8-iid-seed0") == out.count("[2/2] auto_s-eps8") == 8
    one, two = _outputs(roots[1]), _outputs(roots[2])
    assert len(one) > 10 and one.keys() == two.keys()
    assert [name for name in one if one[name] != two[name]] == []
    logged = {jobs: _children(root) for jobs, root in roots.items()}
    assert sorted(logged[1]) == ["auto_s-eps8-iid-seed0", "dp_sgd-eps8-iid-seed0"]
    child = logged[1]["dp_sgd-eps8-iid-seed0"]
    assert child["steps"] > 0 and "accuracy" in child["metrics"]
    assert "checkpoint/model.pt" in child["artifacts"] and child["model"][1]
    assert child["model"][0] == model_name(child["name"])
    assert "MLmodel" in child["model"][2]
    differing = {(run, part) for run in logged[1] for part in logged[1][run]
                 if logged[1][run][part] != logged[2][run][part]}
    assert differing == set(), [(k, v, logged[2][r][p].get(k)) for r, p in differing
                                for k, v in logged[1][r][p].items()
                                if logged[2][r][p].get(k) != v]
    # a child that fails in a worker is named in one clear error (a new store: nothing reused)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'another.db'}")
    (roots[2] / "runs" / "auto_s-eps8-iid-seed0" / "model.pt").unlink()
    capsys.readouterr()
    assert main([*bases[2], "report", "--jobs", "2"]) == 2
    assert "MLflow: logging auto_s-eps8-iid-seed0 failed (FileNotFoundError" in \
        capsys.readouterr().err


def whose(path: str, delay: float = 0.0) -> int:
    """After ``delay`` seconds, write this process's id into ``path``; return it (a function
    for a worker)."""
    import os
    import time

    time.sleep(delay)
    Path(path).write_text(str(os.getpid()))
    return os.getpid()


def fail(_path: str) -> None:
    raise ConfigError(["report.figures: cannot draw"])


def test_in_a_worker_runs_beside_the_body_and_raises_what_the_function_raised(tmp_path):
    import functools
    import os

    with in_a_worker(functools.partial(whose, str(tmp_path / "pid")), "writing") as done:
        assert done() != os.getpid()
    assert (tmp_path / "pid").read_text() == str(done())
    with in_a_worker(functools.partial(fail, ""), "drawing") as done:
        with pytest.raises(ConfigError, match="cannot draw"):
            done()


def test_in_a_worker_finishes_its_work_when_the_body_fails_and_stops_on_ctrl_c(tmp_path):
    import functools
    import time

    finished = tmp_path / "finished"
    with pytest.raises(ValueError, match="the store failed"):
        with in_a_worker(functools.partial(whose, str(finished), 1.0), "w"):
            raise ValueError("the store failed")
    assert finished.exists()  # what it writes is complete, not cut off half-way
    stopped = tmp_path / "stopped"
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with in_a_worker(functools.partial(whose, str(stopped), 30.0), "w"):
            time.sleep(0.5)  # the worker is under way
            raise KeyboardInterrupt
    assert time.monotonic() - started < 20 and not stopped.exists()


def test_the_report_logs_one_child_per_cpu_at_most_four_unless_told(monkeypatch):
    from argparse import Namespace

    from dpclip import cli
    from dpclip.pipeline import side_by_side

    monkeypatch.delenv("DPCLIP_JOBS", raising=False)
    args = Namespace(command="report", jobs=None, track=None)
    for cpus, jobs in ((1, 1), (2, 2), (16, 4)):
        monkeypatch.setattr(side_by_side, "cpu_count", lambda: cpus)
        assert cli._side_by_side_jobs(args, 2, "cuda") == jobs  # the runs' device: no matter
    monkeypatch.setenv("DPCLIP_JOBS", "8")
    assert cli._side_by_side_jobs(args, 2, "cpu") == 8  # as given
    assert cli._side_by_side_jobs(Namespace(command="report", jobs=3, track=None), 2,
                                  "cpu") == 3
    assert cli._side_by_side_jobs(Namespace(command="report", jobs=3, track=False), 2,
                                  "cpu") == 1  # --no-track: nothing to log


def test_a_worker_count_below_one_is_refused(tmp_path, tiny_raw, write_params, capsys):
    base = prepared_project(tmp_path, tiny_raw(), write_params)
    assert main([*base, "train", "--jobs", "0"]) == 2
    assert "--jobs: 0 must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_the_worker_count_dvc_cannot_pass_comes_from_the_environment(tmp_path, tiny_raw,
                                                                      write_params, capsys,
                                                                      monkeypatch):
    """`dvc repro` runs dvc.yaml's command as written: ``DPCLIP_JOBS`` sets the default."""
    from dpclip.pipeline.side_by_side import default_jobs

    monkeypatch.setenv("DPCLIP_JOBS", "3")
    assert default_jobs() == 3
    monkeypatch.delenv("DPCLIP_JOBS")
    assert default_jobs() >= 1
    base = prepared_project(tmp_path, tiny_raw(), write_params)
    monkeypatch.setenv("DPCLIP_JOBS", "two")
    assert main([*base, "train"]) == 2
    assert "DPCLIP_JOBS: 'two' must be a whole number of at least 1" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_the_default_count_fills_twice_the_cpus_with_threads_and_keeps_a_gpu_to_one(
        monkeypatch):
    """Measured: two workers of two threads on two cores beat one, compute-bound runs
    included (docs/measurements.md); on a GPU one process, unless asked for more."""
    from dpclip.pipeline import side_by_side

    monkeypatch.delenv("DPCLIP_JOBS", raising=False)
    monkeypatch.setattr(side_by_side, "cpu_count", lambda: 2)
    assert [side_by_side.default_jobs(t, "cpu") for t in (1, 2, 4, None)] == [2, 2, 1, 2]
    monkeypatch.setattr(side_by_side, "cpu_count", lambda: 16)
    assert [side_by_side.default_jobs(t, "cpu") for t in (1, 2, 4, None)] == [16, 16, 8, 2]
    assert side_by_side.default_jobs(2, "cuda") == 1
    monkeypatch.setenv("DPCLIP_JOBS", "4")
    assert side_by_side.default_jobs(2, "cuda") == 4


# in a fresh process (its fork server starts with the environment given): what two workers
# read of OpenMP's wait policy (os.getenv in each), then what the command itself reads
POLICY_CHECK = """
import os
from dpclip.pipeline.side_by_side import run_side_by_side
keys = ["OMP_WAIT_POLICY", "GOMP_SPINCOUNT"]
print(sorted(set(run_side_by_side(os.getenv, keys, 2, "train"))), os.getenv(keys[0]))
"""


@pytest.mark.parametrize("given, workers", [
    ({}, "[('GOMP_SPINCOUNT', None), ('OMP_WAIT_POLICY', 'PASSIVE')] None"),
    ({"OMP_WAIT_POLICY": "ACTIVE"},
     "[('GOMP_SPINCOUNT', None), ('OMP_WAIT_POLICY', 'ACTIVE')] ACTIVE"),
    ({"GOMP_SPINCOUNT": "1000"}, "[('GOMP_SPINCOUNT', '1000'), ('OMP_WAIT_POLICY', None)] None")])
def test_the_workers_wait_passively_unless_the_environment_chose_a_policy(given, workers):
    """Two spinning workers on two cores took the train stage from 11.7 to 46 s: the workers'
    fork server sets OpenMP's passive wait before anything loads torch (OpenMP reads it once),
    unless the environment chose a policy; the command keeps its own."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    done = subprocess.run([sys.executable, "-c", POLICY_CHECK], env={**env, **given},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == workers


@pytest.mark.parametrize("written, read", [("threads: 4", 4), ("threads: null", None),
                                           ("threads: '2'", None), ("threads: two", None),
                                           ("[not, a, mapping]", None)])
def test_the_thread_count_read_before_validation_is_a_whole_number_or_none(tmp_path, written,
                                                                         read):
    """The command reads train.threads before torch (to start the workers' server early):
    what the validation would convert or refuse must not crash that arithmetic."""
    from dpclip.cli import _threads_and_device_as_written

    params = tmp_path / "params.yaml"
    params.write_text(f"train:\n  {written}\n" if "threads" in written else written)
    assert _threads_and_device_as_written(str(params)) == (read, "auto")


# in a fresh process: the workers' server started early with a module that takes 2 s to
# import, then two runs, each saying whose child its worker is and whether it found that
# module imported (inherited from the server)
EARLY_START = """
import os, time
from dpclip.pipeline.side_by_side import run_side_by_side, start_server
from probe import facts
os.environ["COMMAND_PID"] = str(os.getpid())  # the server's environment: the workers'
started = time.monotonic()
start_server(("slow_import",))
print(time.monotonic() - started)
print(sorted(set(result for _, result in run_side_by_side(facts, [0, 1], 2, "train"))))
"""
PROBE = """
import os, sys
def facts(_key):
    return os.getppid() != int(os.environ["COMMAND_PID"]), "slow_import" in sys.modules
"""


def test_the_server_starts_early_without_waiting_for_its_imports(tmp_path):
    """The command starts the workers' fork server before it imports torch itself, so that
    the two imports overlap: starting it returns at once, and the workers are forked from it
    with what it imported."""
    import os
    import subprocess
    import sys

    (tmp_path / "slow_import.py").write_text("import time\ntime.sleep(2)\n")
    (tmp_path / "probe.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-c", EARLY_START], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    seconds, facts = done.stdout.splitlines()
    assert float(seconds) < 1.0 and facts == "[(True, True)]"


def mark_and_maybe_fail(key: tuple) -> dict:
    """Key (folder, i): run 0 is slow, run 1 fails at once, the others are quick; each run
    that ends well leaves a file named after it."""
    import time

    folder, i = key
    if i == 1:
        raise DpclipError("run 1 failed")
    time.sleep(1.5 if i == 0 else 0.2)
    (Path(folder) / str(i)).write_text("done")
    return {"i": i}


def test_a_failure_stops_the_runs_not_taken_without_waiting_for_the_runs_before_it(tmp_path):
    """Run 1 fails while run 0 still runs: the runs not yet handed to the workers are not run
    (the pool does not go on working through the list while run 0 is awaited), and run 0,
    under way, finishes and is kept."""
    keys = [(str(tmp_path), i) for i in range(12)]
    with pytest.raises(DpclipError, match="run 1 failed"):
        list(run_side_by_side(mark_and_maybe_fail, keys, 2, "train"))
    ran = sorted(int(p.name) for p in tmp_path.iterdir())
    # the pool queues one run beyond its two workers, and a few more can go while the error
    # travels back; waiting for run 0 first, the other worker ran 2 .. 8 or 9 meanwhile
    assert ran[0] == 0 and len(ran) <= 6, ran


def die_on_one(key: int) -> dict:
    import os
    import signal

    if key == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer would
    return {"key": key}


def test_a_worker_that_dies_gives_one_clear_error():
    with pytest.raises(DpclipError, match="a worker process of train died .* --jobs or "
                                          "DPCLIP_JOBS"):
        list(run_side_by_side(die_on_one, [0, 1, 2], 2, "train"))


def fail_on_two(key: int) -> dict:
    """A run function for the workers (module level: it goes to them by pickle)."""
    if key == 2:
        raise ConfigError([f"train.lr: {key} is bad"])
    return {"key": key, "row": PROGRESS_ROW}


def test_a_failed_run_raises_its_own_error_and_the_runs_before_it_come_in_order():
    done = []
    with pytest.raises(ConfigError) as raised:
        for key, result in run_side_by_side(fail_on_two, [0, 1, 2, 3], 2, "train"):
            done.append((key, result["key"]))
    assert done == [(0, 0), (1, 1)][:len(done)]  # those done before the failure came back
    assert raised.value.problems == ["train.lr: 2 is bad"]  # the exception, unpickled whole
    assert isinstance(raised.value, DpclipError)


def test_the_bar_rows_are_the_ones_the_training_loop_reads():
    from dpclip.train.runs import base

    assert base.PROGRESS_ROW == PROGRESS_ROW
