"""A model of the user's own in the pipeline (train.model: path/to/file.py:factory): every
stage that builds a model builds it, the check stage fingerprints its file, and editing the
file makes exactly the runs that train it stale."""

from __future__ import annotations

import pytest
import torch

from conftest import merged, tiny_project_params
from dpclip.catalog import BY_NAME
from dpclip.cli import main
from dpclip.errors import ConfigError
from dpclip.files import read_json
from dpclip.layout import Layout
from dpclip.pipeline import provenance
from dpclip.pipeline.params import parse_params
from dpclip.run_keys import configured_runs

MODEL = '''
from torch import nn


def build(feature_shape, n_classes):
    """No layer named like dpclip's models' (fc1, head)."""
    width = 1
    for size in feature_shape:
        width *= size
    return nn.Sequential(nn.Flatten(), nn.Linear(width, 24), nn.Tanh(), nn.Linear(24, 12),
                         nn.Tanh(), nn.Linear(12, n_classes))
'''


@pytest.fixture
def project(tmp_path, write_params):
    model = tmp_path / "my_model.py"
    model.write_text(MODEL)
    raw = merged(tiny_project_params(), {
        "train": {"model": f"{model}:build", "methods": ["dp_sgd", "ww_dp_sgd", "lm_dp_sgd"],
                  "epochs": 2},
        "methods": {"ww_dp_sgd": {"probe_every": 5}},
        "attack": {"references": 0}, "audit": {"kinds": []}})
    base = ["--params", str(write_params(raw)), "--root", str(tmp_path), "--quiet"]
    return tmp_path, model, raw, base


def test_the_stages_build_the_users_model_and_an_edit_re_runs_its_runs(project):
    root, model, raw, base = project
    for stage in ("check", "prepare", "shadow", "tune", "train"):
        args = [*base, stage] if stage != "partition" else [*base, stage, "--alpha", "iid"]
        if stage == "shadow":
            assert main([*base, "partition", "--alpha", "iid"]) == 0
        assert main(args) == 0, stage
    layout = Layout(root)
    assert read_json(layout.model_source)["train.model"]["path"] == str(model)
    assert "train.model" not in read_json(layout.sources)  # prepare's input: no model
    # the shadow model (lm_dp_sgd's risks) and every run are the user's architecture
    assert set(read_json(layout.shadow_risk)["layers"]) == {"1", "3", "5"}
    params = parse_params(raw)
    for key in configured_runs(params):
        weights = torch.load(layout.run_dir(key.name) / "model.pt", weights_only=False)
        assert set(weights["state_dict"]) == {f"{i}.{w}" for i in (1, 3, 5)
                                                for w in ("weight", "bias")}
    ww = next(k for k in configured_runs(params) if k.method == "ww_dp_sgd")
    import pandas as pd

    thresholds = pd.read_csv(layout.trace(ww.name))["clip_threshold"]
    assert thresholds.nunique() > 1  # the controller probed the last hidden Linear ("3")
    train = BY_NAME["train"]
    assert all(provenance.is_current(train, params, k, layout) for k in configured_runs(params))
    model.write_text(MODEL.replace("24", "20"))  # an edit of the user's model
    assert main([*base, "check"]) == 0
    assert not any(provenance.is_current(train, params, k, layout)
                   for k in configured_runs(params))
    # prepare's output does not depend on the model: partition stays as it was
    assert BY_NAME["partition"].all_deps == ("data/prepared",)


def test_a_model_named_wrongly_is_refused_by_name(tiny_raw, tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"train.model: 'resnet50' is not one of"):
        parse_params(tiny_raw(train={"model": "resnet50"}))
    params = tmp_path / "params.yaml"
    import yaml

    params.write_text(yaml.safe_dump(merged(tiny_project_params(),
                                            {"train": {"model": "missing.py:build"}})))
    assert main(["--params", str(params), "--root", str(tmp_path), "check"]) == 2
    assert "train.model: 'missing.py:build' names no file" in capsys.readouterr().err


def test_sanitize_with_a_model_of_the_users_own_is_refused_by_name(tiny_raw):
    """Its sanitization layer goes after a layer of dpclip's own models (seen: a ValueError
    from inside training, 'the model has no layer act4')."""
    with pytest.raises(ConfigError, match=r"train.methods: 'sanitize' puts its sanitization "
                                          r"layer into one of dpclip's models"):
        parse_params(tiny_raw(train={"model": "nets.py:build",
                                     "methods": ["dp_sgd", "sanitize"]}))


def test_a_model_file_loads_once_pickles_and_imports_the_files_beside_it(tmp_path):
    """Its module is registered (MLflow's pickle format and worker processes need its classes
    by name), under a name two files of one stem cannot share, with its folder on sys.path."""
    import pickle

    from dpclip.models import build_model

    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "layers.py").write_text(
            f"from torch import nn\nWIDTH = {8 if folder == 'a' else 4}\n")
        (tmp_path / folder / "net.py").write_text(
            "from torch import nn\nimport layers\n\n"
            "class Net(nn.Module):\n"
            "    def __init__(self, d, k):\n"
            "        super().__init__()\n"
            "        self.fc = nn.Linear(d, layers.WIDTH)\n"
            "        self.out = nn.Linear(layers.WIDTH, k)\n\n"
            "    def forward(self, x):\n"
            "        return self.out(self.fc(x))\n\n"
            "def build(shape, k):\n"
            "    return Net(shape[0], k)\n")
    import sys

    sys.modules.pop("layers", None)
    a = build_model(f"{tmp_path / 'a' / 'net.py'}:build", (6,), 3, [])
    sys.modules.pop("layers", None)
    b = build_model(f"{tmp_path / 'b' / 'net.py'}:build", (6,), 3, [])
    assert a.fc.out_features == 8 and b.fc.out_features == 4  # each file its own module
    assert type(a).__module__ != type(b).__module__
    again = pickle.loads(pickle.dumps(a))
    assert torch.equal(again.fc.weight, a.fc.weight)


@pytest.mark.e2e
def test_dvc_repro_trains_the_users_model_and_an_edit_re_runs_only_what_builds_it(tmp_path):
    """As a user would: the model file named in params.yaml, `dvc repro train`, an edit of the
    file, `dvc repro train` again: prepare and partition stay, the stages that build the model
    run again."""
    from test_e2e import BIN, _sh, project_copy

    raw = merged(tiny_project_params(), {
        "train": {"model": "models/net.py:build", "methods": ["dp_sgd"], "epochs": 1}})
    project, env = project_copy(tmp_path, raw)
    (project / "models").mkdir()
    (project / "models" / "net.py").write_text(MODEL)
    first = _sh([str(BIN / "dvc"), "repro", "train"], project, env)
    assert "Running stage 'prepare'" in first and "Running stage 'train'" in first
    weights = torch.load(project / "runs" / "dp_sgd-eps8-iid-seed0" / "model.pt",
                         weights_only=False)
    assert weights["state_dict"]["1.weight"].shape == (24, 64)  # the file's layer, digits' 64
    (project / "models" / "net.py").write_text(MODEL.replace("24", "20"))
    again = _sh([str(BIN / "dvc"), "repro", "train"], project, env)
    for stage in ("prepare", "partition@iid"):  # their inputs hold no model
        assert f"Stage '{stage}' didn't change, skipping" in again
    for stage in ("shadow", "tune", "train"):
        assert f"Running stage '{stage}'" in again
    weights = torch.load(project / "runs" / "dp_sgd-eps8-iid-seed0" / "model.pt",
                         weights_only=False)
    assert weights["state_dict"]["1.weight"].shape == (20, 64)


def test_an_edit_of_a_file_beside_the_model_file_re_runs_what_builds_the_model(tmp_path,
                                                                              write_params):
    """A model file may import the Python files beside it: they are fingerprinted with it."""
    from dpclip.stages.check import check

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "net.py").write_text(MODEL)
    (tmp_path / "models" / "blocks.py").write_text("WIDTH = 8\n")
    raw = merged(tiny_project_params(), {"train": {"model": f"{tmp_path}/models/net.py:build"}})
    params, layout = parse_params(raw), Layout(tmp_path)
    check(params, layout)
    first = read_json(layout.model_source)
    assert set(first["train.model"]["beside"]) == {"blocks.py"}
    (tmp_path / "models" / "blocks.py").write_text("WIDTH = 4\n")
    check(params, layout)
    assert read_json(layout.model_source) != first


def test_the_model_file_and_the_files_beside_it_are_logged_to_mlflow(tmp_path, monkeypatch):
    import mlflow

    from dpclip.stages.check import check
    from dpclip.tracking import log_model_file

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "net.py").write_text(MODEL)
    (tmp_path / "models" / "blocks.py").write_text("WIDTH = 8\n")
    layout = Layout(tmp_path)
    check(parse_params(merged(tiny_project_params(), {
        "train": {"model": f"{tmp_path}/models/net.py:build"}})), layout)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        experiment = mlflow.create_experiment(
            "model-file", artifact_location=(tmp_path / "artifacts").as_uri())
        with mlflow.start_run(experiment_id=experiment) as run:
            log_model_file(mlflow, layout)
        client = mlflow.tracking.MlflowClient()
        logged = {a.path for a in client.list_artifacts(run.info.run_id, "model_file")}
        tags = client.get_run(run.info.run_id).data.tags
    finally:
        mlflow.set_tracking_uri(None)
    assert logged == {"model_file/net.py", "model_file/blocks.py"}
    assert tags["dpclip.model_file_sha256"] == read_json(
        layout.model_source)["train.model"]["sha256"]


def test_a_factory_that_fails_is_named_with_what_it_was_given(tmp_path):
    """What a new user met: `(d,) = feature_shape` on the digits' (1, 8, 8) failed in the
    shadow stage with a bare traceback."""
    from dpclip.errors import DpclipError
    from dpclip.models import build_model

    (tmp_path / "flat.py").write_text(
        "from torch import nn\n\ndef build(feature_shape, n_classes):\n"
        "    (d,) = feature_shape\n    return nn.Linear(d, n_classes)\n")
    with pytest.raises(DpclipError, match=r"build\(feature_shape=\(1, 8, 8\), n_classes=10\) "
                                          r"failed: ValueError: too many values to unpack"):
        build_model(f"{tmp_path / 'flat.py'}:build", (1, 8, 8), 10, [])
