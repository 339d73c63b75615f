"""The end-to-end tests that change the project: a new method, then a commit, a repro from
scratch and a DVC experiment. A project of their own (tests/test_e2e.py makes the same), so
that pytest-xdist runs them beside the other end-to-end tests."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from dpclip.summaries import unfiled
from test_e2e import (BIN, COMMITTED, OVERLAYS, RUNS, UNTRACKED_OUTPUTS, _sh, committed_files,
                      fresh_build_name, fresh_builds, make_dvc_project, repro)

# one worker runs this module, so that its project is built once (tests/conftest.py)
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e-experiments")]


@pytest.fixture(scope="module")
def dvc_project(tmp_path_factory):
    """Built and changed here, while tests/test_e2e.py builds its own project in another
    folder: the commit test below compares the two builds' bytes."""
    return make_dvc_project(tmp_path_factory)


def test_a_new_method_trains_and_evaluates_only_its_own_runs(dvc_project):
    """The train and evaluate stages run every configuration in one process, but a run whose
    inputs did not change is not run again (dpclip.pipeline.provenance). Last in this module: it
    adds a configuration to this module's project (only the commit-and-compare test follows)."""
    _, project, env, _ = dvc_project
    raw = yaml.safe_load((project / "params.yaml").read_text())
    raw["train"]["methods"] = ["non_private", "dp_sgd", "auto_s"]
    (project / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    out = _sh(repro(), project, env)
    assert "Running stage 'train'" in out and "Running stage 'evaluate'" in out
    for stage_runs in (out.split("Running stage 'train'")[1].split("Running stage")[0],
                       out.split("Running stage 'evaluate'")[1].split("Running stage")[0]):
        assert "[1/3] non_private-eps8-iid-seed0: up to date" in stage_runs
        assert "[2/3] dp_sgd-eps8-iid-seed0: up to date" in stage_runs
        assert "[3/3] auto_s-eps8-iid-seed0: up to date" not in stage_runs
    assert (project / "metrics" / "auto_s-eps8-iid-seed0.json").exists()
    status = _sh([str(BIN / "dvc"), "status"], project, env)
    assert status.split() == ["check:", "always", "changed"]  # it runs on every repro
    # removing it again: its evaluation leaves `dvc metrics show`, its trained model stays
    raw["train"]["methods"] = ["non_private", "dp_sgd"]
    (project / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    out = _sh(repro(), project, env)
    assert "Running stage 'train'" in out and "[2/2] dp_sgd-eps8-iid-seed0: up to date" in out
    shown = _sh([str(BIN / "dvc"), "metrics", "show", "--json"], project, env)
    assert "auto_s" not in shown and "dp_sgd-eps8-iid-seed0" in shown
    # its trained model waits outside DVC's outputs (runs/ holds the configured runs only)
    assert not (project / "runs" / "auto_s-eps8-iid-seed0").exists()
    assert not (project / "traces" / "auto_s-eps8-iid-seed0.csv").exists()
    retired = project / ".dpclip" / "retired" / "auto_s-eps8-iid-seed0"
    assert (retired / "runs" / "model.pt").exists() and (retired / "traces").exists()
    assert (retired / "audits" / "audit.json").exists()
    assert (retired / "references" / "signals.npz").exists()
    assert not (project / "audits" / "auto_s-eps8-iid-seed0").exists()


def test_a_committed_pipeline_reproduces_bit_for_bit_and_dvc_compares_experiments(
        dvc_project, tmp_path_factory):
    """Like DVC's example-get-started: dvc.lock, the summaries and the overlay tables are
    committed; a build from scratch gives the same bytes (no time in a hashed output, no
    temporary name in a model file, nothing missing from .gitignore, nothing left of the
    configuration the test before added and removed); an experiment then compares with the
    commit in `dvc exp show`, `dvc metrics diff` and `dvc plots diff`; `git checkout` and
    `dvc checkout` then bring the commit's outputs back from DVC's cache."""
    tmp, project, env, _ = dvc_project
    _sh(["git", "add", "-A"], project, env)
    _sh(["git", "commit", "-q", "-m", "pipeline"], project, env)
    tracked = _sh(["git", "ls-files"], project, env).split()
    assert "dvc.lock" in tracked and f"summary/{RUNS[1]}.json" in tracked
    assert {f"overlays/{name}" for name in OVERLAYS} <= set(tracked)
    assert not [f for f in tracked if f.split("/")[0] in UNTRACKED_OUTPUTS]
    # and nothing else: an output missing from .gitignore would be committed unchecked
    configuration = {".gitignore", ".dvcignore", "dvc.yaml", "requirements.lock"}
    assert [f for f in tracked if f.split("/")[0] not in {"src", ".dvc", *COMMITTED}
            and f not in configuration] == []
    # the build from scratch: test_e2e's project, same parameters, built in another folder
    # on the other worker meanwhile; else (this module alone) this project's outputs again
    others = sorted(path for path in fresh_builds(tmp_path_factory).glob("*")
                    if path.name != fresh_build_name(tmp) and not path.name.endswith(".partial"))
    if others:
        ours, fresh = committed_files(project), committed_files(others[0])
        assert sorted(ours) == sorted(fresh)
        assert [name for name in ours if ours[name] != fresh[name]] == []
    else:
        for name in UNTRACKED_OUTPUTS + ["summary", "overlays"]:
            shutil.rmtree(project / name, ignore_errors=True)
        _sh(repro(), project, env)
        assert _sh(["git", "status", "--porcelain"], project, env) == ""
    # what the commit's outputs were, to get them back from DVC's cache after the experiment
    kept = {path: (project / path).read_bytes() for path in (
        f"metrics/{RUNS[1]}.json", f"traces/{RUNS[1]}.csv", f"scores/{RUNS[1]}.csv",
        "reports/comparison.md")}
    # another training length: new models (an evaluation change may leave an underfit
    # model's summary as it was: ECE with 5 or 10 bins is the same when every confidence
    # falls into one bin)
    _sh([str(BIN / "dvc"), "exp", "run", "-S", "train.epochs=3", "-n", "epochs3"], project,
        env)
    shown = _sh([str(BIN / "dvc"), "exp", "show", "--json"], project, env)
    (commit,) = [r for r in json.loads(shown[shown.index("["):]) if r["rev"] != "workspace"]
    rows = [commit] + [e for x in commit.get("experiments") or [] for e in x["revs"]]
    assert len(rows) == 2 and commit["experiments"][0]["name"] == "epochs3"
    for row in rows:  # real numbers for the commit and the experiment
        _, summary = unfiled(row["data"]["metrics"][f"summary/{RUNS[1]}.json"]["data"])
        assert 0 <= summary["accuracy"] <= 1 and 0 <= summary["ece"] <= 1
    # the same comparison as a long, narrow table: every run under both names
    compared = _sh([str(BIN / "dpclip"), "compare"], project, env)
    assert max(len(line) for line in compared.splitlines()) <= 120
    assert "train.epochs: " in compared and "epochs3=3" in compared
    for run in RUNS:
        (line,) = [x for x in compared.splitlines() if x.startswith(run)]
        following = compared.splitlines()[compared.splitlines().index(line) + 1]
        assert following.lstrip().startswith("epochs3")  # the experiment's row follows
    only = _sh([str(BIN / "dpclip"), "compare", "epochs3", "--only-changed"], project, env)
    assert "Experiments: epochs3" in only
    diff = _sh([str(BIN / "dvc"), "metrics", "diff", "HEAD", "--json"], project, env)
    changed = json.loads(diff[diff.index("{"):])
    for run in RUNS:
        keys = {key.rsplit(".", 1)[-1] for key in changed[f"summary/{run}.json"]}
        assert {"accuracy", "ece"} & keys, run
    _sh([str(BIN / "dvc"), "plots", "diff", "HEAD", "-o", "diff_plots"], project, env)
    plots = _sh([str(BIN / "dvc"), "plots", "diff", "HEAD", "--json"], project, env)
    reliability = json.loads(plots[plots.index("{"):])["data"]["overlays/reliability.csv"]
    revisions = {row["rev"] for row in reliability[0]["content"]["layer"][-1]["data"]["values"]}
    assert revisions == {"HEAD", "workspace"}
    # back to the commit without training anything: git's files, then DVC's cache
    assert (project / f"metrics/{RUNS[1]}.json").read_bytes() != kept[f"metrics/{RUNS[1]}.json"]
    _sh(["git", "checkout", "params.yaml", "dvc.lock", "summary", "overlays"], project, env)
    _sh([str(BIN / "dvc"), "checkout"], project, env)
    assert {path: (project / path).read_bytes() for path in kept} == kept
    status = _sh([str(BIN / "dvc"), "status"], project, env)
    assert status.split() == ["check:", "always", "changed"]  # every other stage up to date


def test_a_second_datasets_experiment_is_kept_apart_from_the_default(dvc_project):
    """What a user saw: `dvc metrics diff main` printed digits against their CSV as a gain,
    `dvc plots diff` drew the two as one run, the report named the wrong MLflow experiment.
    Each result is now filed under its data's identity. Last in this module: it leaves the
    CSV's results in the workspace."""
    import mlflow
    from sklearn.datasets import load_breast_cancer

    _, project, env, _ = dvc_project
    load_breast_cancer(as_frame=True).frame.head(300).to_csv(project / "cancer.csv",
                                                             index=False)
    out = _sh([str(BIN / "dvc"), "exp", "run", "-n", "cancer", "-S", "data.dataset=csv",
               "-S", "data.path=cancer.csv", "-S", "data.target=target"], project, env)
    assert "MLflow: experiment 'dpclip-csv-cancer'" in out
    diff = _sh([str(BIN / "dvc"), "metrics", "diff", "HEAD", "--json"], project, env)
    changed = json.loads(diff[diff.index("{"):])
    for path, keys in changed.items():  # no row holds a number of each dataset
        for key, entry in keys.items():
            assert entry["old"] is None or entry["new"] is None, (path, key, entry)
    digits = {key.split(".")[0] for keys in changed.values() for key, entry in keys.items()
              if entry["new"] is None}
    cancer = {key.split(".")[0] for keys in changed.values() for key, entry in keys.items()
              if entry["old"] is None}
    (digits_id,), (cancer_id,) = digits, cancer
    assert digits_id.startswith("digits-") and cancer_id.startswith("csv-cancer-")
    plots = _sh([str(BIN / "dvc"), "plots", "diff", "HEAD", "--json"], project, env)
    values = json.loads(plots[plots.index("{"):])["data"]["overlays/clip_threshold.csv"][0][
        "content"]["layer"][-1]["data"]["values"]
    series = {(row["rev"], row["run"]) for row in values}
    assert {run for _, run in series} == {f"{RUNS[1]} ({digits_id})", f"{RUNS[1]} ({cancer_id})"}
    assert len({run for _, run in series}) == len(series)  # one dataset per series
    compared = _sh([str(BIN / "dpclip"), "compare"], project, env)
    assert "Not comparable" in compared and f"== data {cancer_id}" in compared
    client = mlflow.tracking.MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    for name, data in (("dpclip-digits", digits_id), ("dpclip-csv-cancer", cancer_id)):
        experiment = client.get_experiment_by_name(name)
        tags = {r.data.tags.get("dpclip.dataset_id")
                for r in client.search_runs([experiment.experiment_id])
                if r.data.tags.get("dpclip.kind") in ("pipeline", "configuration")}
        assert tags == {data}, name
