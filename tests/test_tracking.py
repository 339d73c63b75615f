"""What MLflow holds: nothing computed from a private batch without noise unless
``tracking.private_diagnostics`` asks for it."""

from __future__ import annotations

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
