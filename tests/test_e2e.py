"""The real pipeline end to end on tiny settings, through both front doors: DVC (`dvc repro`,
the dpclip CLI) and Prefect (`python -m flows.pipeline`), with MLflow records."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dpclip.summaries import unfiled
from conftest import PROJECT, tiny_project_params

# one worker runs this module, so that its project is built once (tests/conftest.py)
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e-dvc")]
BIN = Path(sys.executable).parent
RUNS = ["non_private-eps8-iid-seed0", "dp_sgd-eps8-iid-seed0"]
# one ROC table per attack of the project's attack.kinds (loss, lira, rmia, and any attack a
# reader added following docs/adding-an-attack.md)
OVERLAYS = ["clip_threshold.csv", *(f"roc/{attack}.csv" for attack in
                                    tiny_project_params()["attack"]["kinds"]),
            "reliability.csv", "privacy_utility.csv"]
# plots by id: the claimed-vs-audited scatter and the curves over seeds with their bands
PLOT_IDS = ["claimed_vs_audited_epsilon", "privacy_utility_accuracy", "privacy_utility_ece",
            "privacy_utility_attack"]
OFFLINE_PAGE = Path(".dvc") / "plots" / "offline.html"
CONTRACT = {
    "privacy": {"dp_guarantee", "accountant", "target_epsilon", "epsilon", "delta",
                "sample_rate", "noise_multiplier", "steps", "adjacency", "secure_noise",
                "data_use"},
    "utility": {"accuracy", "ece", "mce", "brier", "nll"},
    "clip": {"c_initial", "c_final", "c_median", "clamp_hits_min", "clamp_hits_max",
             "clamp_updates", "clamp_share"},
}
# outputs git does not track (DVC's cache or nobody's); summary/, overlays/ and dvc.lock it does
UNTRACKED_OUTPUTS = ["data", "shadow", "runs", "traces", "timings", "metrics", "plots",
                     "figures", "reports", "audits", "references", "scores"]


def _env(tmp_path):
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    # the flow's temporary API and its database under PREFECT_HOME (prefect_artifacts reads it),
    # not a server or database the developer's environment may name
    for name in ("PREFECT_API_URL", "PREFECT_API_DATABASE_CONNECTION_URL",
                 "PREFECT_SERVER_DATABASE_CONNECTION_URL"):
        env.pop(name, None)
    for role in ("AUTHOR", "COMMITTER"):  # the project's commits in the tests
        env[f"GIT_{role}_NAME"], env[f"GIT_{role}_EMAIL"] = "dpclip tests", "tests@dpclip"
    return env


def _sh(args, cwd, env, timeout=900):
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def dvc_project(tmp_path_factory):
    return make_dvc_project(tmp_path_factory)


def make_dvc_project(tmp_path_factory, jobs: int = 1):
    """A copy of the project with tiny params, after one `dvc repro`: (temporary folder,
    project, environment, the output of the repro). Each module that changes it makes its own
    (tests/test_e2e_experiments.py), so that pytest-xdist can run them side by side. ``jobs``:
    the per-run stages' workers (``DPCLIP_JOBS``); 1, so that the ``executed`` fixture records
    every import of a stage's command (a worker ends without Python's exit handlers), and
    because workers for runs of a fraction of a second, beside the other pytest worker, made
    these modules slower (tests/pipeline/test_side_by_side.py compares the outputs of every
    per-run stage with and without workers)."""
    tmp = tmp_path_factory.mktemp("e2e")
    project, env = project_copy(tmp, tiny_project_params(), jobs)
    # the first repro runs every stage and every run: each stage's command records the dpclip
    # modules it imported (the `executed` fixture), so no stage has to run again for that
    traced = dict(env, DPCLIP_TEST_IMPORTS=str(tmp), PYTHONPATH=os.pathsep.join(
        [str(_import_recorder(tmp)), *filter(None, [env.get("PYTHONPATH")])]))
    first = _sh(repro(), project, traced)
    _leave_fresh_build(project, fresh_builds(tmp_path_factory) / fresh_build_name(tmp))
    return tmp, project, env, first


def project_copy(tmp: Path, raw: dict, jobs: int = 1) -> tuple[Path, dict]:
    """``tmp``/project: the pipeline's code and dvc.yaml with ``raw`` as params.yaml, under git
    and DVC, not yet run; and the environment to run it in."""
    project = tmp / "project"
    project.mkdir()
    shutil.copy(PROJECT / "dvc.yaml", project)
    shutil.copy(PROJECT / ".gitignore", project)
    shutil.copy(PROJECT / "requirements.lock", project)  # every stage depends on it
    shutil.copytree(PROJECT / "src", project / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (project / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    env = dict(_env(tmp), DPCLIP_JOBS=str(jobs))
    _sh(["git", "init", "-q"], project, env)
    _sh([str(BIN / "dvc"), "init", "-q"], project, env)
    # the plot templates git tracks, and the offline page `make install` wrote (if it could)
    shutil.copytree(PROJECT / ".dvc" / "plots", project / ".dvc" / "plots")
    if (project / OFFLINE_PAGE).exists():
        _sh([str(BIN / "dvc"), "config", "--local", "plots.html_template",
             "plots/offline.html"], project, env)
    return project, env


def repro() -> list[str]:
    """``dvc repro`` (what ``make run`` runs)."""
    return [str(BIN / "dvc"), "repro"]


# what git tracks of a project's outputs (UNTRACKED_OUTPUTS: the rest), with its parameters
COMMITTED = ("params.yaml", "dvc.lock", "summary", "overlays")


def committed_files(project: Path) -> dict[str, bytes]:
    """The bytes of every file of ``COMMITTED`` in ``project``, by relative path."""
    files = {}
    for name in COMMITTED:
        path = project / name
        for file in [path] if path.is_file() else sorted(path.rglob("*")):
            if file.is_file():
                files[file.relative_to(project).as_posix()] = file.read_bytes()
    return files


def fresh_builds(tmp_path_factory) -> Path:
    """Where each end-to-end module's project leaves the committed files of its first repro, a
    build from scratch, for another module to compare its own with. This session's only:
    pytest-xdist's workers keep their base folders side by side in the session's."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "fresh-builds"


def fresh_build_name(tmp: Path) -> str:
    """A project's name among the fresh builds (xdist's workers number their folders alike)."""
    return f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{tmp.name}"


def _leave_fresh_build(project: Path, folder: Path) -> None:
    staging = folder.with_name(folder.name + ".partial")  # complete or absent, for the reader
    for relative, content in committed_files(project).items():
        (staging / relative).parent.mkdir(parents=True, exist_ok=True)
        (staging / relative).write_bytes(content)
    staging.rename(folder)


RECORDER = """
import atexit, json, os, sys


def _record():  # at the exit of a stage's command: the dpclip modules it imported
    if os.path.basename(sys.argv[0]) != "dpclip":
        return
    files = sorted(m.__file__ for name, m in list(sys.modules.items())
                   if name.split(".")[0] == "dpclip" and getattr(m, "__file__", None))
    folder = os.path.join(os.environ["DPCLIP_TEST_IMPORTS"], "imports")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as out:
        json.dump({"args": sys.argv[1:], "files": files}, out)


atexit.register(_record)
"""


def _import_recorder(tmp: Path) -> Path:
    """A folder holding a ``sitecustomize`` module that records, at the exit of every
    ``dpclip`` command started with it on PYTHONPATH, the package's modules it imported."""
    folder = tmp / "import-recorder"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(RECORDER)
    return folder


def test_dvc_repro_writes_contract_metrics_and_report(dvc_project):
    _, project, _, first = dvc_project
    assert "Running stage 'report'" in first
    for run in RUNS:
        metrics = json.loads((project / "metrics" / f"{run}.json").read_text())
        assert metrics["run"] == run and metrics["dataset"] == "digits"
        for section, keys in CONTRACT.items():
            assert keys <= set(metrics[section]), section
        assert {"auc", "balanced_accuracy", "tpr_at_fpr_1pct", "tpr_at_fpr_0.1pct"} <= \
            set(metrics["mia"]["loss"])
        assert {"auc", "auc_unmatched"} <= set(metrics["mia"]["label_only"])
        # LiRA and RMIA against the reference stage's models (two, offline, by default)
        for attack in ("lira", "rmia"):
            assert {"auc", "tpr_at_fpr_0.1pct", "tpr_at_fpr_0.1pct_ci95"} <= \
                set(metrics["mia"][attack])
        assert metrics["mia"]["references"]["references"] == 2
        assert (project / "scores" / f"{run}.csv").exists()
    dp = json.loads((project / "metrics" / "dp_sgd-eps8-iid-seed0.json").read_text())
    assert dp["privacy"]["dp_guarantee"] is True and dp["privacy"]["epsilon"] <= 8
    # the audit stage's bounds, in the metrics contract's audit.<kind>
    for kind in ("whitebox", "blackbox"):
        audit = dp["audit"][kind]
        assert {"epsilon_lower_bound", "canaries", "confidence"} <= set(audit)
        assert audit["applicable"] and not audit["violated"]
        assert 0 <= audit["epsilon_lower_bound"] <= dp["privacy"]["epsilon"]
    data, summary = unfiled(json.loads(
        (project / "summary" / "dp_sgd-eps8-iid-seed0.json").read_text()))
    assert data == dp["dataset_id"] and data.startswith("digits-")  # filed under its data
    assert summary["audit_epsilon_lower_bound"] == max(
        dp["audit"][k]["epsilon_lower_bound"] for k in ("whitebox", "blackbox"))
    base = json.loads((project / "metrics" / "non_private-eps8-iid-seed0.json").read_text())
    assert base["privacy"]["epsilon"] is None and base["privacy"]["dp_guarantee"] is False
    assert base["audit"]["whitebox"] == {"kind": "whitebox", "applicable": False,
                                         "reason": "no DP claim", "epsilon_lower_bound": None}
    table = (project / "reports" / "comparison.md").read_text()
    assert all(run in table for run in RUNS)
    # what `make run` prints last: one row per configuration, no line over 120 characters
    short = (project / "reports" / "summary.txt").read_text()
    assert max(len(line) for line in short.splitlines()) <= 120
    assert [line.split()[0] for line in short.splitlines()[1:3]] == ["non_private", "dp_sgd"]
    assert "cat reports/summary.txt" in (PROJECT / "Makefile").read_text()
    for name in ("comparison.csv", "comparison.png", "clip_thresholds.png", "roc.png",
                 "roc_lira.png", "roc_rmia.png", "claimed_vs_audited_epsilon.png",
                 "privacy_utility.png", "seeds.csv", "paired_vs_dp_sgd.csv",
                 "data_use.md"):
        assert (project / "reports" / name).exists()


def test_second_repro_is_up_to_date_and_a_param_change_reruns_only_dependents(dvc_project):
    _, project, env, _ = dvc_project
    again = _sh(repro(), project, env)
    # only the check stage, which runs every time (it reads the files params.yaml names)
    assert again.count("Running stage") == 1 and "Running stage 'check'" in again
    raw = yaml.safe_load((project / "params.yaml").read_text())
    raw["evaluate"] = {"ece_bins": 10}
    (project / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    changed = _sh(repro(), project, env)
    assert "Running stage 'evaluate'" in changed and "Running stage 'report'" in changed
    assert "Running stage 'train'" not in changed and "Running stage 'prepare'" not in changed
    assert "[2/2] dp_sgd-eps8-iid-seed0: accuracy=" in changed


def test_dvc_metrics_and_plots(dvc_project):
    _, project, env, _ = dvc_project
    shown = _sh([str(BIN / "dvc"), "metrics", "show", "--json"], project, env)
    data = json.loads(shown[shown.index("{"):])
    files = next(iter(data.values()))["data"]
    assert set(files) == {f"summary/{run}.json" for run in RUNS}  # the summaries only
    _, dp = unfiled(files["summary/dp_sgd-eps8-iid-seed0.json"]["data"])
    full = json.loads((project / "metrics" / "dp_sgd-eps8-iid-seed0.json").read_text())
    assert dp["accuracy"] == full["utility"]["accuracy"]
    assert dp["epsilon"] == full["privacy"]["epsilon"]
    from dpclip.metrics import strongest_attack

    name, strongest = strongest_attack(full["mia"])  # loss, LiRA or RMIA
    assert dp["strongest_auc"] == strongest["auc"] and name in ("loss", "lira", "rmia")
    assert "mia_auc" not in dp  # one meaning: the loss attack's, in MLflow and the table
    # the attack chosen in advance (auto: LiRA, with reference models) at its honest low FPR
    assert full["mia"]["headline"]["attack"] == "lira"
    assert dp["attack_auc"] == full["mia"]["lira"]["auc"]
    assert dp["attack_tpr_at_low_fpr"] == full["mia"]["lira"]["low_fpr"]["tpr"]
    assert full["mia"]["lira"]["low_fpr"]["false_positives_allowed"] >= 10
    # the reference models trained like the target: its n, q, steps and sigma
    assert all(full["mia"]["references"]["match"]["matched"].values())
    out = _sh([str(BIN / "dvc"), "plots", "show", "--json"], project, env)
    plots = json.loads(out[out.index("{"):])["data"]
    # the overlays, each with every run in one plot and a title, and the claimed-vs-audited
    # scatter of the private runs
    assert sorted(plots) == sorted([f"overlays/{name}" for name in OVERLAYS] + PLOT_IDS)
    (audited,) = plots.pop("claimed_vs_audited_epsilon")
    assert "audit_epsilon_lower_bound" in json.dumps(audited["content"])
    for name in PLOT_IDS[1:]:  # one point per method and epsilon: dp_sgd's, no run column
        (banded,) = plots.pop(name)
        values = banded["content"]["data"]["values"]
        (series,) = {row["series"] for row in values}
        assert re.fullmatch(r"dp_sgd iid \(digits-[0-9a-f]{8}\)", series), name
    for name, renderers in plots.items():
        (renderer,) = renderers
        spec = renderer["content"]
        assert spec["title"]["text"], name
        # each series names its run and its data
        drawn = {row.get("run").rsplit(" (digits-", 1)[0]
                 for row in spec["layer"][-1]["data"]["values"]}
        private = name.endswith(("privacy_utility.csv", "clip_threshold.csv"))
        assert drawn == ({RUNS[1]} if private else set(RUNS)), name
    out = _sh([str(BIN / "dvc"), "plots", "show", "-o", "dvc_plots"], project, env)
    assert "failed" not in out.lower()
    html = (project / "dvc_plots" / "index.html").read_text()
    assert "clip_threshold" in html and "tpr" in html
    if (project / OFFLINE_PAGE).exists():  # renders offline: Vega inline, nothing from a CDN
        assert "cdn.jsdelivr" not in html and "vega-lite" in html.lower()


def test_mlflow_parent_and_children(dvc_project):
    import mlflow

    tmp, _, env, _ = dvc_project
    client = mlflow.tracking.MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("dpclip-digits")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("dpclip.kind") == "pipeline"]
    children = [r for r in runs if r.data.tags.get("dpclip.kind") == "configuration"]
    assert parents and len(children) == 2
    dp = next(r for r in children if r.data.tags["method"] == "dp_sgd")
    assert dp.data.tags["mlflow.parentRunId"] == parents[-1].info.run_id
    assert {"dataset", "alpha", "seed", "git_commit"} <= set(dp.data.tags)
    assert {"epsilon", "accuracy", "ece", "brier", "nll", "mia_auc",
            "mia_tpr_at_fpr_1pct"} <= set(dp.data.metrics)
    full = json.loads((dvc_project[1] / "metrics" / f"{RUNS[1]}.json").read_text())["mia"]
    for attack in ("lira", "rmia"):  # the calibrated attacks, from the metrics file
        assert dp.data.metrics[f"mia_{attack}_auc"] == full[attack]["auc"]
        assert dp.data.metrics[f"mia_{attack}_tpr_at_fpr_0.1pct"] == \
            full[attack]["tpr_at_fpr_0.1pct"]
        assert dp.data.metrics[f"mia_{attack}_dp_bound_margin"] == \
            full[attack]["dp_bound"]["worst_margin"]
    assert dp.data.metrics["attack_tpr_at_low_fpr"] == full["headline"]["tpr_at_low_fpr"]
    history = client.get_metric_history(dp.info.run_id, "clip_threshold")
    assert len(history) == json.loads(
        (dvc_project[1] / "metrics" / "dp_sgd-eps8-iid-seed0.json").read_text()
    )["privacy"]["steps"]
    # the child lasts as long as its training did, and each step is logged at its own time
    timing = json.loads((dvc_project[1] / "timings" / f"{RUNS[1]}.json").read_text())
    assert dp.data.metrics["train_s"] == timing["train_s"]
    assert abs(dp.info.end_time - dp.info.start_time - 1000 * timing["train_s"]) <= 2
    stamps = [m.timestamp for m in sorted(history, key=lambda m: m.step)]
    assert stamps == sorted(stamps) and len(set(stamps)) > 1
    assert dp.info.start_time <= stamps[0] and stamps[-1] <= dp.info.end_time + 2
    artifacts = {a.path for a in client.list_artifacts(dp.info.run_id)}
    assert {"trace", "checkpoint", "plots", "metrics"} <= artifacts
    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    # the model is named after its run (not "model"), the child names its URI
    info = mlflow.models.get_model_info(dp.data.tags["dpclip.model_uri"])
    assert info.signature is not None and info.name == dp.info.run_name
    assert re.fullmatch(rf"[0-9a-f]{{7}} · {RUNS[1]}", dp.info.run_name)  # unique across experiments
    assert {"summary.json", "comparison.json"} <= {
        a.path for a in client.list_artifacts(parents[-1].info.run_id)}


def test_prefect_flow_gives_the_same_results_and_mlflow_record(dvc_project):
    tmp, project, env, _ = dvc_project
    other = tmp / "prefect-root"
    other.mkdir()
    params = other / "params.yaml"
    shutil.copy(project / "params.yaml", params)  # the DVC project's current parameters
    # on a local Dask cluster of two worker processes, which start with one torch thread, the
    # tiny settings' count too (a worker's count set another way stayed 1: Dask keeps it), so
    # here the models equal DVC's whether or not a run sets train.threads itself; that it
    # does is checked in test_cli (use_threads) and test_presets (a preset's one thread)
    out = _sh([sys.executable, "-m", "flows.pipeline", "--params", str(params), "--root",
               str(other), "--workers", "2"], PROJECT, env)
    assert "Finished in state Completed" in out and not our_tracebacks(out)
    assert "Creating a new Dask cluster" in out  # it did run on Dask,
    # whose own INFO lines (the cluster's start and stop) stay out of the console
    assert "distributed.scheduler" not in out and "distributed.worker" not in out
    # one temporary Prefect API for the flow and both workers, not one each
    assert out.count("Starting temporary server") == 1
    for run in RUNS:
        a = json.loads((project / "metrics" / f"{run}.json").read_text())
        b = json.loads((other / "metrics" / f"{run}.json").read_text())
        assert a["utility"] == b["utility"] and a["privacy"] == b["privacy"]
        model = Path("runs") / run / "model.pt"
        assert (project / model).read_bytes() == (other / model).read_bytes()
        assert a["mia"]["loss"]["auc"] == b["mia"]["loss"]["auc"]
        assert a["mia"]["lira"] == b["mia"]["lira"]  # reference models trained on Dask
    # same models -> the Prefect execution reuses the DVC execution's child runs
    assert "0 new configuration(s), 2 already logged" in out
    assert "(trained, evaluated)" in out  # a new root: everything ran
    assert "'trained'" not in out  # one readable line per run, not a Python dict
    again = _sh([sys.executable, "-m", "flows.pipeline", "--params", str(params), "--root",
                 str(other), "--sequential"], PROJECT, env)
    assert again.count("(up to date)") == len(RUNS)  # provenance
    listed = prefect_artifacts(Path(env["PREFECT_HOME"]))
    assert {("dpclip-comparison", "table"), ("dpclip-report", "markdown")} <= listed
    assert ("dpclip-summary", "table") in listed  # the short table, shown first (created last)


def our_tracebacks(output: str) -> list[str]:
    """The tracebacks in ``output`` that pass through dpclip or the flows. Dask's distributed
    sometimes logs one from its own comms while the local cluster shuts down (a worker's
    stream closes under a pending send, distributed/batched.py) after the flow completed:
    noise of the engine, not a failure of the pipeline."""
    found = []
    for block in output.split("Traceback (most recent call last):")[1:]:
        lines = block.split("\n")[1:]
        frames = []
        for line in lines:  # the indented frame lines, up to the exception's own line
            if not line.startswith(" "):
                frames.append(line)
                break
            frames.append(line)
        text = "\n".join(frames)
        if "dpclip" in text or "flows/" in text:
            found.append(text)
    return found


def prefect_artifacts(home: Path) -> set[tuple[str, str]]:
    """(key, type) of the artifacts in the Prefect database that the flow's temporary API
    wrote to (under PREFECT_HOME), which Prefect's UI shows: read from the database itself, as
    a Prefect client would start Prefect's API again first (8 s here)."""
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(f"{(home / 'prefect.db').as_uri()}?mode=ro", uri=True)) as db:
        return set(db.execute("SELECT key, type FROM artifact").fetchall())


def test_prefect_serve_takes_the_schedule_from_params(tmp_path, write_params, tiny_raw):
    from flows.serve import deployment_kwargs

    path = write_params(tiny_raw(schedule={"cron": "15 4 * * 1", "timezone": "Europe/Paris"}))
    kwargs = deployment_kwargs(str(path), str(tmp_path))
    schedule = kwargs["schedules"][0]
    assert schedule.cron == "15 4 * * 1" and schedule.timezone == "Europe/Paris"
    assert kwargs["parameters"]["params_path"] == str(path.resolve())


def test_mlflow_artifacts_live_beside_the_database(dvc_project):
    tmp, project, _, _ = dvc_project
    assert any((tmp / "mlartifacts").rglob("model.pt"))  # MLflow's own name, beside mlflow.db
    assert not (project / "mlruns").exists() and not (PROJECT / "mlruns").exists()


def test_project_home_survives_dvc_temporary_experiment_folders(tmp_path):
    from dpclip.tracking import project_home

    inside = tmp_path / "proj" / ".dvc" / "tmp" / "exps" / "tmpabc123"
    assert project_home(inside) == (tmp_path / "proj").resolve()
    assert project_home(tmp_path / "proj") == (tmp_path / "proj").resolve()


@pytest.fixture(scope="module")
def executed(dvc_project) -> dict[str, set[str]]:
    """Per stage of dvc.yaml, the package's modules its command imports (``dpclip/cli.py``,
    ...): each stage's command as dvc.yaml gives it, recorded in the project's first repro,
    which ran every stage and every run."""
    import dpclip  # noqa: F401  (its folder, below)

    tmp, project, _, _ = dvc_project
    package = Path(sys.modules["dpclip"].__file__).resolve().parent.parent
    records = [json.loads(path.read_text()) for path in (tmp / "imports").glob("*.json")]
    out = {}
    for name, stage in yaml.safe_load((project / "dvc.yaml").read_text())["stages"].items():
        args = stage["cmd"].replace("${item.alpha}", "iid").split()[1:]
        (files,) = [r["files"] for r in records if r["args"] == args]  # one command each
        # the package's files as dvc.yaml names them (the installed package is this one's)
        out[name] = {Path(f).resolve().relative_to(package).as_posix() for f in files
                     if f.endswith(".py") and Path(f).resolve().is_relative_to(package)}
    return out


def _validated_only(stage: str) -> set[str]:
    """The validation of params.yaml (dpclip.pipeline.params, which the command loads by name)
    and the modules of the plugin families a stage does not run, with what they import: loaded
    only to validate params.yaml (the registries' discovery), so not the stage's code; the
    stages that read what they fill in, or run them, list them."""
    from dpclip.code_closure import closure_files, package_modules
    from dpclip.catalog import BY_NAME, PLUGIN_FAMILIES

    plugins = [module for module in package_modules() for family in PLUGIN_FAMILIES
               if family not in BY_NAME[stage].runs and module.startswith(f"dpclip.{family}.")]
    return {f"dpclip/{f}" for f in closure_files([*plugins, "dpclip.pipeline.params"])}


def _files(project: Path, deps) -> set[str]:
    """dvc.yaml's code dependencies as files under src/ (a folder: every module in it)."""
    out = set()
    for dep in deps:
        path = project / "src" / dep
        out |= {p.relative_to(project / "src").as_posix() for p in path.rglob("*.py")} \
            if path.is_dir() else {dep}
    return out


def test_every_module_a_stage_executes_is_a_dependency_of_that_stage(dvc_project, executed):
    """A docstring edit in any module a stage's command runs must make that stage stale: each
    stage's command, every dpclip module it imported, the CLI included, is among the stage's
    dependencies in dvc.yaml. Before, no stage listed cli.py, which every command runs."""
    _, project, _, _ = dvc_project
    stages = yaml.safe_load((project / "dvc.yaml").read_text())["stages"]
    for name, stage in stages.items():
        deps = _files(project, [d.removeprefix("src/") for d in stage["deps"]
                                if d.startswith("src/")])
        missing = sorted(executed[name] - _validated_only(name) - deps)
        assert "dpclip/cli.py" in executed[name] and not missing, (name, missing)


def test_a_docstring_edit_makes_exactly_the_stages_that_run_the_module_stale(dvc_project,
                                                                            executed):
    """Every module of the package edited at once (a comment appended), then `dvc status`: a
    stage is stale on a module exactly when its command imports that module, or the module
    belongs to a plugin family the stage runs (every method for train, ...), or the stage's
    code imports it inside a function not called on the tiny settings. Nothing else: no
    stage goes stale on a module it never runs (dvc.yaml once listed every method for
    prepare)."""
    from dpclip.code_closure import closure_files
    from dpclip.pipeline.dvc_yaml import code_roots
    from dpclip.catalog import BY_NAME

    _, project, env, _ = dvc_project
    sources = sorted((project / "src" / "dpclip").rglob("*.py"))
    before = {path: path.read_bytes() for path in sources}
    try:
        for path in sources:
            path.write_bytes(before[path] + b"\n# an edit that changes nothing\n")
        status = json.loads(_sh([str(BIN / "dvc"), "status", "--json"], project, env))
    finally:
        for path, text in before.items():
            path.write_bytes(text)
    stale = {name.split("@")[0]: _files(project, [path.removeprefix("src/")
                                                  for change in changes
                                                  if isinstance(change, dict)
                                                  for path in change.get("changed deps", {})
                                                  if path.startswith("src/")])
             for name, changes in status.items()}
    every = {path.relative_to(project / "src").as_posix() for path in sources}
    table = {}
    for name in executed:
        closure = {f"dpclip/{f}" for f in closure_files(code_roots(BY_NAME[name]))}
        assert executed[name] - _validated_only(name) <= stale[name], name
        assert stale[name] == closure, name  # what the command can import, nothing else
        table[name] = (len(executed[name] & stale[name]), len(stale[name]), len(every))
    print("stage: stale modules it imports on the tiny settings / stale modules / modules",
          table)
    assert set(table) == set(BY_NAME)


def test_the_evaluate_stage_writes_the_same_bytes_under_another_blas_kernel(dvc_project):
    """The committed results differed between machines in the 15th digit of the references'
    phi correlation (np.corrcoef's BLAS products; OpenBLAS picks its kernel by CPU). The
    evaluate stage again under OpenBLAS's Prescott kernel (SSE3: any x86-64 runs it) writes
    every metrics file byte for byte as the first repro did under the machine's own."""
    _, project, env, _ = dvc_project
    before = {p.name: p.read_bytes() for p in (project / "metrics").glob("*.json")}
    _sh([str(BIN / "dpclip"), "--quiet", "evaluate", "--force"], project,
        {**env, "OPENBLAS_CORETYPE": "Prescott"})
    after = {p.name: p.read_bytes() for p in (project / "metrics").glob("*.json")}
    assert before and after == before


def test_the_flows_summary_line_is_rounded_and_says_what_was_done():
    from flows.pipeline import run_line

    entry = {"run": "dp_sgd-eps8-iid-seed0", "epsilon": 7.998353310129483,
             "accuracy": 0.9166666666666666, "ece": 0.02718, "mia_auc": 0.5512345,
             "peak_ir_mia": None, "trained": True, "evaluated": True}
    assert run_line(entry) == ("dp_sgd-eps8-iid-seed0: epsilon 8.00, accuracy 0.9167, ECE "
                               "0.0272, loss attack AUC 0.551 (trained, evaluated)")
    free = {**entry, "epsilon": math.inf, "peak_ir_mia": 0.5123, "trained": False,
            "evaluated": False}
    assert run_line(free).startswith("dp_sgd-eps8-iid-seed0: epsilon -,")
    assert run_line(free).endswith("peak IR attack 0.512 (up to date)")
