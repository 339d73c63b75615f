"""What MLflow holds: nothing computed from a private batch without noise unless
``tracking.private_diagnostics`` asks for it; and what the run's record says of the data each
component saw."""

from __future__ import annotations

import json
import logging
import re

import pandas as pd
import yaml
import pytest

from conftest import prepared_project
from dpclip.cli import main

RUN = "dp_sgd-eps8-iid-seed0"
# the report stage's short table (reports/summary.csv): a test writes one before the stage
# runs, the stage may write its own over it; what MLflow holds is compared with the file
SUMMARY_CSV = ("method,target_epsilon,alpha,seeds,epsilon,accuracy,accuracy_low,accuracy_high,"
               "ece,attack,attack_auc,attack_tpr_at_low_fpr,audit_epsilon,vs_dp_sgd\n"
               "dp_sgd,8,iid,1,7.99,0.91,0.88,0.93,0.04,lira,0.55,0.01,,\n")


def _logged_child(tmp_path, tiny_raw, write_params, monkeypatch, diagnostics: bool):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    raw = tiny_raw(train={"methods": ["dp_sgd"], "epochs": 1},
                   evaluate={"ir_attack": False},
                   tracking={"private_diagnostics": diagnostics})
    base = prepared_project(tmp_path, raw, write_params)
    spec = ["--method", "dp_sgd", "--epsilon", "8", "--alpha", "iid", "--seed", "0"]
    assert main([*base, "train", *spec]) == 0
    assert main([*base, "evaluate", *spec]) == 0
    assert main([*base, "report"]) == 0
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("dpclip-digits")
    (child,) = [r for r in client.search_runs([experiment.experiment_id])
                if r.data.tags.get("dpclip.kind") == "configuration"]
    trace_file = client.download_artifacts(child.info.run_id, f"trace/{RUN}.csv",
                                           str(tmp_path / "downloaded"))
    return client, child, pd.read_csv(trace_file)


@pytest.mark.parametrize("diagnostics", [False, True])
def test_private_batch_values_reach_mlflow_only_when_asked(tmp_path, tiny_raw, write_params,
                                                          monkeypatch, diagnostics):
    client, child, trace = _logged_child(tmp_path, tiny_raw, write_params, monkeypatch,
                                         diagnostics)
    local = pd.read_csv(tmp_path / "traces" / f"{RUN}.csv")
    assert {"train_loss", "batch_size"} <= set(local.columns)  # kept for the data owner
    loss_history = client.get_metric_history(child.info.run_id, "train_loss")
    assert bool(loss_history) is diagnostics
    assert ({"train_loss", "batch_size"} <= set(trace.columns)) is diagnostics
    assert not diagnostics or len(loss_history) == len(local)
    # released quantities are logged either way
    assert len(client.get_metric_history(child.info.run_id, "clip_threshold")) == len(local)
    tags = child.data.tags
    # outside `dvc exp run` the child's name carries a short hash of the run's inputs
    assert re.fullmatch(rf"[0-9a-f]{{7}} · {RUN}", child.info.run_name)
    assert tags["dpclip.private_diagnostics"] == str(diagnostics).lower()
    assert tags["adjacency"] == "add_remove" and tags["secure_noise"] == "false"


def test_data_use_says_what_each_component_saw(tmp_path, tiny_raw, write_params, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    raw = tiny_raw(train={"methods": ["adaclip"], "epochs": 1,
                          "early_stopping": {"rule": "slope", "window": 2, "threshold": 0.0}},
                   evaluate={"ir_attack": False})
    base = prepared_project(tmp_path, raw, write_params)
    spec = ["--method", "adaclip", "--epsilon", "8", "--alpha", "iid", "--seed", "0"]
    assert main([*base, "train", *spec]) == 0
    assert main([*base, "evaluate", *spec]) == 0
    record = json.loads((tmp_path / "runs" / "adaclip-eps8-iid-seed0" / "record.json").read_text())
    metrics = json.loads((tmp_path / "metrics" / "adaclip-eps8-iid-seed0.json").read_text())
    use = metrics["privacy"]["data_use"]
    assert use == record["privacy"]["data_use"]
    assert use["members"] == f"{record['n_members']} records of target_train (iid partition)"
    assert "noised DP step" in use["weights"]
    assert "noisy centred count" in use["clip_threshold"]
    assert use["feature_preprocessing"] == "nothing: fixed scaling, no statistics fitted"
    assert "public shadow_train split" in use["early_stopping"]
    assert metrics["privacy"]["adjacency"] == "add_remove"
    assert metrics["privacy"]["secure_noise"] is False


@pytest.mark.parametrize("model_format", ["pickle", "pt2"])
def test_a_child_describes_itself_and_its_model_predicts(tmp_path, tiny_raw, write_params,
                                                         monkeypatch, model_format):
    """What a user of the MLflow UI compares: the parameters that produced the run (``lr``,
    the method's options), the model as an MLflow model that predicts the holdout with the
    reported accuracy, the prepared splits as inputs, the standard source tags; and a second
    report links the (reused) child to its own parent instead of leaving it empty."""
    import mlflow
    import numpy as np

    from dpclip.layout import Layout
    from dpclip.stage_outputs import load_split

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("DVC_EXP_NAME", "tidy-knot")
    raw = tiny_raw(train={"methods": ["adaclip"], "epochs": 1}, evaluate={"ir_attack": False},
                   methods={"adaclip": {"target_quantile": 0.7}, "adaclip_opacus": {}},
                   tracking={"model_format": model_format})
    base = prepared_project(tmp_path, raw, write_params)
    for stage in ("train", "evaluate", "report", "report"):
        assert main([*base, stage]) == 0
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("dpclip-digits")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("dpclip.kind") == "pipeline"]
    (child,) = [r for r in runs if r.data.tags.get("dpclip.kind") == "configuration"]
    params, tags = child.data.params, child.data.tags
    assert params["lr"] == "0.5" and params["epochs"] == "1" and params["method"] == "adaclip"
    assert params["option.target_quantile"] == "0.7" and params["option.clip_lr"] == "0.05"
    assert params["delta"] == "1e-05" and params["seed"] == "0" and params["alpha"] == "iid"
    assert params["tuned"] == "False"
    assert "noise_multiplier" in child.data.metrics and "noise_multiplier" not in params
    assert tags["mlflow.source.git.commit"] == tags["git_commit"]
    assert tags["dvc.exp_name"] == "tidy-knot"
    inputs = {d.dataset.name: d for d in child.inputs.dataset_inputs}
    assert set(inputs) == {"target_train", "target_holdout", "shadow_train", "shadow_holdout"}
    assert all(d.dataset.digest for d in inputs.values())
    # both pipeline executions list the child: the second reused it
    assert len(parents) == 2 and all(
        [c.info.run_id for c in client.search_runs(
            [experiment.experiment_id], p.data.tags["dpclip.children_filter"])]
        == [child.info.run_id] for p in parents)
    # the logged model, named like the child, predicts the holdout with the accuracy the run
    # reports
    name = child.info.run_name
    assert name == "tidy-knot · adaclip-eps8-iid-seed0"  # what differs first: the UI cuts
    assert tags["dpclip.model_uri"].startswith("models:/")
    model = mlflow.pyfunc.load_model(tags["dpclip.model_uri"])
    stored = {a.path.rsplit("/", 1)[-1] for a in mlflow.artifacts.list_artifacts(
        f"runs:/{child.info.run_id}/{name}/data")}
    assert {"pt2": "model.pt2", "pickle": "model.pth"}[model_format] in stored
    x, y, _ = load_split(Layout(tmp_path), "target_holdout")
    accuracy = float(np.mean(np.asarray(model.predict(x)).argmax(axis=1) == y))
    assert accuracy == pytest.approx(child.data.metrics["accuracy"], abs=1e-9)


def test_two_dvc_experiments_stay_apart_in_the_ui(tmp_path, tiny_raw, write_params,
                                                   monkeypatch, caplog):
    """What a user saw in the MLflow UI after two DVC experiments, fixed: each child is named
    after its experiment, each logged model after its child; the experiment is tagged as
    model training and carries the saved view ``dpclip-headline`` (the configurations, the
    headline metrics as columns and in parallel coordinates); the headline metrics are each
    child's first (the compare page plots the first); the pipeline run holds the report's
    summary and comparison as MLflow tables and files; a missing summary is said, not fatal."""
    import mlflow

    from dpclip.pipeline.params import load_params
    from dpclip.layout import Layout
    from dpclip.run_keys import configured_runs
    from dpclip.tracking import (HEADLINE_METRICS, VIEW_ID, VIEW_TAG, describe, log_pipeline,
                                 model_name)

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    settings = {"methods": ["dp_sgd"], "epochs": 1}
    base = prepared_project(tmp_path, tiny_raw(train=settings, evaluate={"ir_attack": False}),
                            write_params)
    summary_csv = tmp_path / "reports" / "summary.csv"
    tables = {}
    for experiment_name, lr in (("exp-a", 0.5), ("exp-b", 0.2)):  # two trainings of one run
        write_params(tiny_raw(train={**settings, "lr": lr}, evaluate={"ir_attack": False}))
        monkeypatch.setenv("DVC_EXP_NAME", experiment_name)
        summary_csv.parent.mkdir(exist_ok=True)
        summary_csv.write_text(SUMMARY_CSV)
        for stage in ("train", "evaluate", "report"):
            assert main([*base, stage]) == 0
        tables[experiment_name] = pd.read_csv(summary_csv)

    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("dpclip-digits")
    exp_id = experiment.experiment_id
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = client.search_runs([exp_id])
    children = {r.info.run_name: r for r in runs
                if r.data.tags.get("dpclip.kind") == "configuration"}
    parents = {r.data.tags["dvc.exp_name"]: r for r in runs
               if r.data.tags.get("dpclip.kind") == "pipeline"}
    assert set(children) == {f"exp-a · {RUN}", f"exp-b · {RUN}"}
    assert {p.info.run_name.rsplit("@", 1)[-1] for p in parents.values()} == {"exp-a", "exp-b"}
    # each logged model is named after its child and comes from it
    models = client.search_logged_models([exp_id])
    assert {m.name: m.source_run_id for m in models} == {
        model_name(name): child.info.run_id for name, child in children.items()}
    for child in children.values():
        assert child.data.tags["dpclip.model_uri"] in {f"models:/{m.model_id}" for m in models}
        # the headline metrics come first: the compare page's default metric is a run's first
        metrics = list(child.data.metrics)
        headline = [m for m in HEADLINE_METRICS if m in metrics]
        assert headline[0] == "accuracy" and metrics[:len(headline)] == headline
        assert "train_s" in metrics and "train_s" not in metrics[:len(headline)]

    # the saved view: in MLflow's "Views" menu; its search lists exactly the configurations
    envelope = json.loads(experiment.tags[VIEW_TAG])
    state = json.loads(envelope["state"])
    assert envelope["name"] and isinstance(envelope["createdAt"], int)
    assert {r.info.run_name for r in client.search_runs([exp_id], state["searchFilter"])} \
        == set(children)
    assert {f"metrics.`{m}`" for m in HEADLINE_METRICS} <= set(state["selectedColumns"])
    # at 1400 px the Models column took the room of two metrics (headless Chromium)
    assert "attributes.`Models`" not in state["selectedColumns"]
    (parallel,) = [c for c in state["compareRunCharts"] if c["type"] == "PARALLEL"]
    assert parallel["selectedMetrics"] == list(HEADLINE_METRICS)
    assert parallel["selectedParams"][0] == "method"
    assert experiment.tags["mlflow.note.content"]
    assert f"viewStateShareKey={VIEW_ID}" in describe({
        "experiment": "dpclip-digits", "parent_run_id": "p", "new": [], "reused": [],
        "tracking_uri": uri, "experiment_id": exp_id, "view": VIEW_ID})

    # the pipeline run: summary.csv as an MLflow table and as the file, the comparison too
    for experiment_name, parent in parents.items():
        run_id = parent.info.run_id
        files = {a.path for a in client.list_artifacts(run_id)} | {
            a.path for a in client.list_artifacts(run_id, "report")}
        assert {"summary.json", "comparison.json", "report/summary.csv",
                "report/comparison.csv"} <= files
        stored = json.loads(open(client.download_artifacts(
            run_id, "summary.json", str(tmp_path / "dl" / experiment_name))).read())
        assert stored["columns"] == list(tables[experiment_name].columns)
        assert len(stored["data"]) == len(tables[experiment_name])
        assert {"path": "summary.json", "type": "table"} in json.loads(
            parent.data.tags["mlflow.loggedArtifacts"])

    # without reports/summary.csv the pipeline is logged all the same, and the log says so;
    # a figure drawn meanwhile (the report's worker) is logged once `figures` returns
    summary_csv.unlink()
    late = tmp_path / "reports" / "privacy_utility.png"
    late.unlink(missing_ok=True)
    params = load_params(tmp_path / "params.yaml")
    with caplog.at_level(logging.WARNING, logger="dpclip.tracking"):
        result = log_pipeline(params, Layout(tmp_path), configured_runs(params),
                              figures=lambda: late.write_bytes(b"drawn meanwhile"))
    assert result["tables"] == ["comparison.json"] and result["reused"] == [RUN]
    assert "summary.csv not in" in caplog.text
    assert "report/privacy_utility.png" in {a.path for a in client.list_artifacts(
        result["parent_run_id"], "report")}
    assert {a.path for a in client.list_artifacts(result["parent_run_id"])} >= {
        "comparison.json"}
    assert "summary.json" not in {a.path for a in client.list_artifacts(
        result["parent_run_id"])}


def test_an_epsilon_without_a_guarantee_stays_out_of_the_epsilon_columns(tmp_path, tiny_raw,
                                                                         write_params,
                                                                         monkeypatch):
    """The audit saw a `dp_guarantee: false` run's epsilon in the headline view's epsilon
    column and its epsilon-vs-accuracy chart, marked only by a tag. Such a run logs
    ``epsilon_without_guarantee`` (and ``epsilon_spent_without_guarantee`` per step), and the
    headline view shows the guarantee as a column."""
    import mlflow

    from dpclip.tracking import headline_view

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    raw = tiny_raw(train={"methods": ["adaclip_opacus"], "epochs": 1},
                   evaluate={"ir_attack": False})
    base = prepared_project(tmp_path, raw, write_params)
    spec = ["--method", "adaclip_opacus", "--epsilon", "8", "--alpha", "iid", "--seed", "0"]
    for stage in ("train", "evaluate"):
        assert main([*base, stage, *spec]) == 0
    assert main([*base, "report"]) == 0
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("dpclip-digits")
    (child,) = [r for r in client.search_runs([experiment.experiment_id])
                if r.data.tags.get("dpclip.kind") == "configuration"]
    assert child.data.tags["dp_guarantee"] == "false"
    assert "epsilon" not in child.data.metrics and "epsilon_without_guarantee" in child.data.metrics
    assert not client.get_metric_history(child.info.run_id, "epsilon_spent")
    assert client.get_metric_history(child.info.run_id, "epsilon_spent_without_guarantee")
    from dpclip.summaries import unfiled

    _, summary = unfiled(json.loads(
        (tmp_path / "summary" / "adaclip_opacus-eps8-iid-seed0.json").read_text()))
    assert summary["dp_guarantee"] is False and summary["adjacency_add_remove"] is True
    assert "tags.`dp_guarantee`" in json.loads(json.loads(headline_view())["state"])[
        "selectedColumns"]


def test_a_copied_project_writes_its_artifacts_into_the_copy(tmp_path, tiny_raw, write_params,
                                                             monkeypatch):
    """MLflow stores an experiment's artifact folder as an absolute path: a copied project
    used to log its runs into the original's folder. The copy's experiment is made anew in
    the copy; the original's runs stay, in the renamed experiment that points at them."""
    import shutil

    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    original = tmp_path / "original"
    original.mkdir()
    raw = tiny_raw(train={"methods": ["dp_sgd"], "epochs": 1}, evaluate={"ir_attack": False},
                   audit={"kinds": []}, attack={"references": 0})
    params = original / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    for stage in ("prepare", "train", "evaluate", "report"):
        args = ["--params", str(params), "--root", str(original), "--quiet", stage]
        if stage == "train":
            assert main(["--params", str(params), "--root", str(original), "--quiet",
                         "partition", "--alpha", "iid"]) == 0
        assert main(args) == 0
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    assert main(["--params", str(copy / "params.yaml"), "--root", str(copy), "--quiet",
                 "report"]) == 0
    mlflow.set_tracking_uri(f"sqlite:///{copy / 'mlflow.db'}")
    experiments = {e.name: e for e in mlflow.search_experiments()}
    current = experiments["dpclip-digits"]
    assert current.artifact_location.startswith((copy / "mlartifacts").as_uri())
    runs = mlflow.search_runs([current.experiment_id], output_format="list")
    assert runs and all(r.info.artifact_uri.startswith(copy.as_uri()) for r in runs)
    moved = [e for name, e in experiments.items() if name.startswith("dpclip-digits (artifacts")]
    assert len(moved) == 1 and str(original) in moved[0].name  # the original's runs, kept
    assert mlflow.search_runs([moved[0].experiment_id], output_format="list")


def test_each_csv_file_gets_its_own_experiment():
    """What a user saw: every CSV dataset in one experiment, "dpclip-csv"."""
    from dpclip.pipeline.params import parse_params
    from dpclip.tracking import experiment_name

    def params(**data):
        return parse_params({"data": data})

    assert experiment_name(params()) == "dpclip-digits"
    assert experiment_name(params(dataset="csv", path="data/heart.csv", target="num")) == \
        "dpclip-csv-heart"
    assert experiment_name(params(dataset="csv", path="other/adult.data", target="y")) == \
        "dpclip-csv-adult"
    assert experiment_name(params(dataset="mnist", path="datasets/mnist")) == "dpclip-mnist"


def test_logging_leaves_the_tracking_variable_as_it_was(monkeypatch):
    """mlflow.set_tracking_uri exports MLFLOW_TRACKING_URI: a process started after the report
    (another project's dvc repro) would log into this project's store."""
    import os

    from dpclip import tracking

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(tracking, "_log_pipeline",
                        lambda *a: os.environ.__setitem__("MLFLOW_TRACKING_URI", "sqlite:///x"))
    tracking.log_pipeline(None, None, [])
    assert "MLFLOW_TRACKING_URI" not in os.environ


def test_the_ui_address_is_the_tracking_servers_own_when_there_is_one():
    from dpclip.tracking import describe

    summary = {"experiment": "dpclip-digits", "parent_run_id": "p", "new": [], "reused": [],
               "experiment_id": "3", "view": None}
    local = describe({**summary, "tracking_uri": "sqlite:////x/mlflow/mlflow.db"})
    assert "MLflow UI (after `mlflow ui` in the project folder): http://127.0.0.1:5000/#/experiments/3/" in local
    served = describe({**summary, "tracking_uri": "http://10.0.0.5:5001/"})
    assert "MLflow UI: http://10.0.0.5:5001/#/experiments/3/runs?" in served


def test_the_store_is_where_a_plain_mlflow_ui_looks(tmp_path, monkeypatch):
    """Plain `mlflow ui` (and mlflow.search_runs()) in the project folder opens MLflow's
    default store, sqlite:///<cwd>/mlflow.db: the project's store is that file, not one a user
    must name with --backend-store-uri."""
    import os
    import subprocess
    import sys

    from dpclip.tracking import artifact_root, tracking_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    ours = tracking_uri(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    theirs = subprocess.run([sys.executable, "-c", "import mlflow; print(mlflow.get_tracking_uri())"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert ours == theirs.stdout.strip() == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    assert artifact_root(ours) == tmp_path.resolve() / "mlartifacts"
