"""What MLflow holds: nothing computed from a private batch without noise unless
``tracking.private_diagnostics`` asks for it; and what the run's record says of the data each
component saw."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from conftest import prepared_project
from dpclip.cli import main

RUN = "dp_sgd-eps8-iid-seed0"


def _logged_child(tmp_path, tiny_raw, write_params, monkeypatch, diagnostics: bool):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
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
    from dpclip.stages.prepare import load_split

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
    # the logged model predicts the holdout with the accuracy the run reports
    model = mlflow.pyfunc.load_model(f"runs:/{child.info.run_id}/model")
    stored = {a.path.rsplit("/", 1)[-1] for a in mlflow.artifacts.list_artifacts(
        f"runs:/{child.info.run_id}/model/data")}
    assert {"pt2": "model.pt2", "pickle": "model.pth"}[model_format] in stored
    x, y, _ = load_split(Layout(tmp_path), "target_holdout")
    accuracy = float(np.mean(np.asarray(model.predict(x)).argmax(axis=1) == y))
    assert accuracy == pytest.approx(child.data.metrics["accuracy"], abs=1e-9)
