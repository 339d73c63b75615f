"""Per-run caching inside the batched train and evaluate stages (dpclip.pipeline.provenance): a
change re-runs exactly the runs a per-run DVC stage would have re-run, and dvc.yaml's stages
list every input of every run, so DVC starts them whenever a run may be stale."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from conftest import PROJECT
from dpclip.pipeline.params import parse_params
from dpclip.layout import Layout
from dpclip.run_keys import configured_runs
from dpclip.pipeline import provenance
from dpclip.catalog import BY_NAME

TRAIN, AUDIT, EVALUATE = (BY_NAME[name] for name in ("train", "audit", "evaluate"))

METHODS = ["dp_sgd", "auto_s", "lm_dp_sgd"]


@pytest.fixture
def project(tmp_path, tiny_raw):
    """Hand-made inputs and outputs of three trained runs, each with its provenance."""
    return recorded_runs(tmp_path, tiny_raw, METHODS)


def recorded_runs(tmp_path, tiny_raw, methods):
    """Hand-made inputs and outputs of one trained run per method, each with its provenance."""
    layout = Layout(tmp_path)
    layout.prepared.mkdir(parents=True)
    (layout.prepared / "target_train.npz").write_bytes(b"records")
    layout.partition("iid").mkdir(parents=True)
    (layout.partition("iid") / "positions.json").write_text("[0, 1, 2]")
    layout.shadow.mkdir()
    layout.shadow_risk.write_text("{}")
    raw = tiny_raw(train={"methods": methods})

    def params(**sections):
        from conftest import merged

        return parse_params(merged(raw, sections))

    for key in configured_runs(params()):
        inputs = provenance.inputs(TRAIN, params(), key, layout)
        layout.run_dir(key.name).mkdir(parents=True)
        (layout.run_dir(key.name) / "model.pt").write_bytes(b"weights")
        (layout.run_dir(key.name) / "record.json").write_text("{}")
        layout.trace(key.name).parent.mkdir(exist_ok=True)
        layout.trace(key.name).write_text("step\n1\n")
        provenance.record(TRAIN, layout, key, inputs)
    return layout, params


def stale(layout, params) -> list[str]:
    return [key.method for key in configured_runs(params) if not provenance.is_current(
        TRAIN, params, key, layout)]


def test_recorded_runs_are_current(project):
    layout, params = project
    assert stale(layout, params()) == []


def test_one_methods_options_rerun_its_runs_only(project):
    layout, params = project
    assert stale(layout, params(methods={"auto_s": {"gamma": 0.02}})) == ["auto_s"]


def test_a_shared_training_key_reruns_every_run(project):
    layout, params = project
    assert stale(layout, params(train={"lr": 0.1})) == METHODS


def test_an_evaluation_key_reruns_no_training(project):
    layout, params = project
    assert stale(layout, params(attack={"folds": 3})) == []


def test_the_shadow_risk_reruns_only_the_method_that_reads_it(project):
    layout, params = project
    layout.shadow_risk.write_text('{"layers": {}}')
    assert stale(layout, params()) == ["lm_dp_sgd"]


def test_new_data_reruns_every_run(project):
    layout, params = project
    (layout.prepared / "target_train.npz").write_bytes(b"other records")
    assert stale(layout, params()) == METHODS


def test_an_edited_or_missing_output_makes_its_run_stale(project):
    layout, params = project
    (layout.run_dir("dp_sgd-eps8-iid-seed0") / "model.pt").write_bytes(b"edited weights")
    layout.trace("auto_s-eps8-iid-seed0").unlink()
    assert stale(layout, params()) == ["dp_sgd", "auto_s"]


def test_editing_a_methods_module_reruns_its_runs_and_shared_code_every_run(
        project, monkeypatch, tmp_path):
    layout, params = project
    package = tmp_path / "package"
    shutil.copytree(provenance.PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(provenance, "PACKAGE", package)
    assert stale(layout, params()) == []  # the same files, elsewhere
    with open(package / "methods" / "auto_s.py", "a") as module:
        module.write("\n# an edit\n")
    assert stale(layout, params()) == ["auto_s"]
    with open(package / "train" / "loop.py", "a") as module:
        module.write("\n# an edit\n")
    assert stale(layout, params()) == METHODS


def test_touching_a_helper_makes_exactly_the_runs_that_import_it_stale(tiny_raw, monkeypatch,
                                                                       tmp_path):
    """A run's code inputs are its import closure (dpclip.code_closure), not a list kept by
    hand: a helper only the DC-SGD rules import re-runs their runs only; a module the train
    stage imports through another (the artifact readers, through the run's inputs) re-runs
    every run; another stage's module (partition, report) or an attack's re-runs none. An
    attack's module makes every evaluation stale, and a helper only LiRA and RMIA import none
    of the trainings."""
    methods = ["dp_sgd", "dc_sgd_p", "dc_sgd_e"]
    package = tmp_path / "package"
    shutil.copytree(provenance.PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(provenance, "PACKAGE", package)
    layout, params = recorded_runs(tmp_path / "project", tiny_raw, methods)
    assert stale(layout, params()) == []

    def touch(relative: str) -> list[str]:
        with open(package / relative, "a") as module:
            module.write("\n# an edit\n")
        found = stale(layout, params())
        for key in configured_runs(params()):  # record again: the next edit starts clean
            provenance.record(TRAIN, layout, key, provenance.inputs(TRAIN, params(), key, layout))
        return found

    assert touch("methods/common/dc_sgd.py") == ["dc_sgd_p", "dc_sgd_e"]
    assert touch("stage_outputs.py") == methods
    assert touch("stages/partition.py") == []
    assert touch("stages/report.py") == []
    assert touch("attacks/common/signals.py") == []
    evaluated = params()
    key = configured_runs(evaluated)[0]
    before = provenance.code_files(EVALUATE, key.method, evaluated)
    assert "src/dpclip/attacks/loss.py" in before and "src/dpclip/attacks/lira.py" in before
    assert "src/dpclip/attacks/loss.py" not in provenance.code_files(TRAIN, key.method, evaluated)


def test_each_run_runs_the_stale_runs_and_force_runs_all(project):
    layout, params = project
    changed = params(methods={"auto_s": {"gamma": 0.02}})
    ran = []
    done = list(provenance.each_run(TRAIN, changed, layout, lambda key: ran.append(key.method) or {}))
    assert ran == ["auto_s"] and [r is None for _, r in done] == [True, False, True]
    ran.clear()
    list(provenance.each_run(TRAIN, changed, layout, lambda key: ran.append(key.method) or {}, force=True))
    assert ran == METHODS


def test_a_run_that_did_not_write_its_outputs_records_nothing(project):
    layout, params = project
    key = configured_runs(params())[0]
    layout.trace(key.name).unlink()
    with pytest.raises(RuntimeError, match="did not write"):
        provenance.record(TRAIN, layout, key, provenance.inputs(TRAIN, params(), key, layout))


def _covered(path: str, declared: list[str]) -> bool:
    """Whether a dvc.yaml entry names ``path`` or a folder (or section) above it."""
    return any(path == d or path.startswith(d.rstrip("/") + "/") or path.startswith(d + ".")
               for d in declared)


@pytest.mark.parametrize("stage", [TRAIN, AUDIT, EVALUATE], ids=lambda s: s.name)
def test_dvc_yaml_lists_every_input_of_every_run(stage, tiny_raw, tmp_path):
    """Else DVC would skip the stage although a run's recorded inputs changed."""
    declared = yaml.safe_load((PROJECT / "dvc.yaml").read_text())["stages"][stage.name]
    deps = [str(d).split("#")[0].strip() for d in declared["deps"]]
    params = parse_params(tiny_raw(train={"methods": METHODS}))
    for key in configured_runs(params):
        inputs = provenance.inputs(stage, params, key, Layout(tmp_path))
        for path in inputs["files"]:
            folder = path if not path.startswith(("runs/", "traces/", "data/partitions/")) \
                else str(Path(path).parent)
            assert _covered(folder, deps), f"dvc.yaml {stage.name}: no dependency on {path}"
        for name in inputs["params"]:
            assert _covered(name, declared["params"]), f"dvc.yaml {stage.name}: no {name}"
        if "tuned" in inputs:  # the run's entry of the tune stage's output
            assert _covered("tuned/tuned.json", deps), f"dvc.yaml {stage.name}: no tuned"
    for axis in ("train.methods", "privacy.target_epsilons", "partition.alphas",
                 "train.seeds"):
        assert _covered(axis, declared["params"])
    outs = declared.get("outs", []) + declared.get("metrics", []) + declared.get("plots", [])
    assert all(next(iter(o.values()))["persist"] for o in outs), "DVC would delete current runs"


def test_the_thread_count_is_recorded_as_used(tiny_raw, tmp_path):
    """Results depend on the count, so ``threads: null`` records this machine's count: a run
    made on a machine with other CPUs is not taken as current."""
    import os

    params = parse_params(tiny_raw(train={"threads": None}))
    key = configured_runs(params)[0]
    recorded = provenance.inputs(TRAIN, params, key, Layout(tmp_path))["params"]["train.threads"]
    assert params.train.threads is None and recorded == os.cpu_count()
    assert "src/dpclip/threads.py" in provenance.inputs(TRAIN, params, key, Layout(tmp_path))["files"]


def test_an_unconfigured_run_waits_outside_the_hashed_folders_and_comes_back_current(project):
    """runs/ and traces/ are hashed as wholes into dvc.lock: they must hold the configured
    runs only, whatever ran before (else a fresh clone's repro changes dvc.lock)."""
    from dpclip.runner import tidy

    layout, params = project
    fewer = params(train={"methods": ["dp_sgd"]})
    moved = tidy(TRAIN, fewer, layout)
    gone = sorted(key.name for key in configured_runs(params()) if key.method != "dp_sgd")
    assert moved == {"retired": gone, "restored": []}
    assert sorted(p.name for p in layout.run_dir("x").parent.iterdir()) == \
        [configured_runs(fewer)[0].name]
    assert sorted(p.stem for p in layout.trace("x").parent.iterdir()) == \
        [configured_runs(fewer)[0].name]
    assert (layout.retired(gone[0]) / "runs" / "model.pt").read_bytes() == b"weights"
    assert (layout.retired(gone[0]) / "traces").read_text() == "step\n1\n"
    # configured again: moved back, and current (not trained again)
    assert tidy(TRAIN, params(), layout) == {"retired": [], "restored": gone}
    assert stale(layout, params()) == []
    assert not layout.retired(gone[0]).exists()
