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
