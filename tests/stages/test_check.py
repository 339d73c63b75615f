"""The check stage: a file params.yaml names is a dependency after all (an edited CSV re-runs
prepare under `dvc repro`, an unchanged one does not), and a bad parameter stops `dvc repro`
before DVC deletes any stage's outputs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import PROJECT, merged, tiny_project_params

from dpclip.errors import DpclipError
from dpclip.layout import Layout
from dpclip.pipeline.params import parse_params
from dpclip.stages.check import check

BIN = Path(sys.executable).parent


def _sh(args, cwd, env, ok=True) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if ok:
        assert done.returncode == 0, f"{args}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    else:
        assert done.returncode != 0, f"{args} succeeded:\n{done.stdout[-3000:]}"
    return done.stdout + done.stderr


def _write_csv(path: Path, n: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 3))
    rows = ["a,b,c,label"] + [f"{a:.4f},{b:.4f},{c:.4f},{int(a + b > 0)}" for a, b, c in x]
    path.write_text("\n".join(rows) + "\n")


def test_check_fingerprints_the_named_files_and_refuses_a_path_that_names_nothing(tmp_path):
    _write_csv(tmp_path / "mine.csv", 50)
    raw = {"data": {"dataset": "csv", "path": str(tmp_path / "mine.csv"), "target": "label"}}
    record = check(parse_params(raw), Layout(tmp_path))
    import hashlib

    expected = hashlib.sha256((tmp_path / "mine.csv").read_bytes()).hexdigest()
    assert record == {"data.path": {"path": str(tmp_path / "mine.csv"), "sha256": expected}}
    assert json.loads(Layout(tmp_path).sources.read_text()) == record
    assert check(parse_params({}), Layout(tmp_path)) == {}  # digits: no file named
    raw["data"]["path"] = str(tmp_path / "gone.csv")
    with pytest.raises(DpclipError, match=r"data\.path: .*gone\.csv' names no file"):
        check(parse_params(raw), Layout(tmp_path))


def test_check_says_which_named_file_changed_and_what_runs_again(tmp_path, caplog):
    """`dvc status` cannot see a file a parameter names: the check stage says it."""
    import logging

    _write_csv(tmp_path / "mine.csv", 50)
    params = parse_params({"data": {"dataset": "csv", "path": str(tmp_path / "mine.csv"),
                                    "target": "label"}})
    with caplog.at_level(logging.INFO, logger="dpclip.stages.check"):
        check(params, Layout(tmp_path))
        check(params, Layout(tmp_path))
        assert "changed since the last check" not in caplog.text  # first, then unchanged
        _write_csv(tmp_path / "mine.csv", 60)
        check(params, Layout(tmp_path))
    assert "data.path changed since the last check: prepare and every stage after it run " \
        "again" in caplog.text


@pytest.mark.e2e
def test_an_edited_csv_re_runs_prepare_and_a_bad_parameter_deletes_nothing(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    for name in ("dvc.yaml", ".gitignore", "requirements.lock"):
        shutil.copy(PROJECT / name, project)
    shutil.copytree(PROJECT / "src", project / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    _write_csv(project / "mine.csv", 500)
    raw = merged(tiny_project_params(), {"data": {"dataset": "csv", "path": "mine.csv",
                                                  "target": "label"}})
    (project / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(project / "src")}
    for args in (["git", "init", "-q"], [str(BIN / "dvc"), "init", "-q"]):
        _sh(args, project, env)
    dvc = str(BIN / "dvc")
    meta = project / "data" / "prepared" / "meta.json"
    first = _sh([dvc, "repro", "partition"], project, env)
    assert "Running stage 'check'" in first and "Running stage 'prepare'" in first
    assert sum(json.loads(meta.read_text())["sizes"].values()) == 500
    again = _sh([dvc, "repro", "partition"], project, env)
    assert "Running stage 'check'" in again and "Running stage 'prepare'" not in again
    _write_csv(project / "mine.csv", 300)  # the user cuts their file
    edited = _sh([dvc, "repro", "partition"], project, env)
    assert "Running stage 'prepare'" in edited and "Running stage 'partition" in edited
    assert sum(json.loads(meta.read_text())["sizes"].values()) == 300
    # a bad parameter: refused by the check stage, every output still there, unchanged
    before = {p: p.read_bytes() for p in (project / "data").rglob("*") if p.is_file()}
    raw["data"]["seed"] = -1
    (project / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    failed = _sh([dvc, "repro", "partition"], project, env, ok=False)
    assert "data.seed: -1" in failed and "Running stage 'prepare'" not in failed
    assert {p: p.read_bytes() for p in (project / "data").rglob("*") if p.is_file()} == before
    # a data error found by prepare (every label the same): the last good splits stay
    raw["data"]["seed"] = 0
    (project / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    (project / "mine.csv").write_text("a,b,c,label\n" + "1,2,3,0\n" * 300)
    failed = _sh([dvc, "repro", "partition"], project, env, ok=False)
    assert "Running stage 'prepare'" in failed and "at least two classes" in failed
    assert {p: p.read_bytes() for p in (project / "data" / "prepared").rglob("*")
            if p.is_file()} == {p: b for p, b in before.items() if "prepared" in p.parts}
