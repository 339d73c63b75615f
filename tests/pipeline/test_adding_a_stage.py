"""Adding a stage is one module plus its declaration: the blocks of docs/adding-a-stage.md (a
stage run once and a per-run one), written into a copy of the package, give dvc.yaml stages
with exactly their code, subcommands, and a `dvc repro` that runs what each reads and the new
stage only; an edit of a new module makes its stage stale and no other."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import PROJECT, tiny_project_params

# one worker runs this module, so that its project is built once (tests/conftest.py)
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("adding-a-stage")]
BIN = Path(sys.executable).parent
END_OF_DECLARED = "\n)\n\n\ndef reads_from("


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (PROJECT / "docs" / "adding-a-stage.md").read_text(),
                      re.S)


def _sh(args, cwd, env) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{args}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A copy of the project whose package has the documented stage, its dvc.yaml generated."""
    project = tmp_path_factory.mktemp("stage") / "project"
    shutil.copytree(PROJECT / "src", project / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in (".gitignore", "requirements.lock"):
        shutil.copy(PROJECT / name, project)
    module, declaration, per_run_module, per_run_declaration = _blocks()
    (project / "src" / "dpclip" / "stages" / "class_balance.py").write_text(module)
    (project / "src" / "dpclip" / "stages" / "member_counts.py").write_text(per_run_module)
    spec = project / "src" / "dpclip" / "catalog.py"
    text = spec.read_text()
    assert text.count(END_OF_DECLARED) == 1
    declared = "".join("\n" + d.rstrip("\n") for d in (declaration, per_run_declaration))
    spec.write_text(text.replace(END_OF_DECLARED, declared + END_OF_DECLARED))
    (project / "params.yaml").write_text(yaml.safe_dump(tiny_project_params(), sort_keys=False))
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(project / "src")}  # the copy, not the installed package
    for args in (["git", "init", "-q"], [str(BIN / "dvc"), "init", "-q"],
                 [sys.executable, "-m", "dpclip.pipeline.dvc_yaml", "--write"]):
        _sh(args, project, env)
    return project, env


def test_the_generated_stage_lists_its_own_module_and_no_other_stage_does(project):
    root, _ = project
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    stage = stages["class_balance"]
    assert stage["cmd"] == "dpclip --quiet class_balance"
    assert {"data/prepared", "requirements.lock", "src/dpclip/cli.py",
            "src/dpclip/stages/class_balance.py"} <= set(stage["deps"])
    assert stage["outs"] == [{"stats": {"cache": False}}]
    assert [name for name, s in stages.items()
            if "src/dpclip/stages/class_balance.py" in s["deps"]] == ["class_balance"]


def test_dvc_repro_runs_prepare_and_the_new_stage_and_an_edit_stales_it_alone(project):
    root, env = project
    out = _sh([str(BIN / "dvc"), "repro", "class_balance"], root, env)
    assert "Running stage 'prepare'" in out and "Running stage 'class_balance'" in out
    assert "Running stage 'train'" not in out
    record = json.loads((root / "stats" / "class_balance.json").read_text())
    sizes = json.loads((root / "data" / "prepared" / "meta.json").read_text())["sizes"]
    for split, facts in record.items():
        assert sum(facts["counts"]) == sizes[split]
        assert facts["imbalance"] == max(facts["counts"]) / max(min(facts["counts"]), 1)
    printed = _sh(["dpclip", "class_balance"], root, env)
    assert "largest / smallest class: target_train" in printed
    module = root / "src" / "dpclip" / "stages" / "class_balance.py"
    module.write_text(module.read_text() + "\n# an edit\n")
    status = json.loads(_sh([str(BIN / "dvc"), "status", "--json"], root, env))
    stale = {name for name, changes in status.items()
             if any("src/dpclip/stages/class_balance.py" in change.get("changed deps", {})
                    for change in changes if isinstance(change, dict))}
    assert stale == {"class_balance"}


def test_a_per_run_stage_runs_each_configured_run_once_and_keeps_the_current_ones(project):
    root, env = project
    out = _sh([str(BIN / "dvc"), "repro", "member_counts"], root, env)
    assert "Running stage 'member_counts'" in out and "Running stage 'train'" not in out
    params = yaml.safe_load((root / "params.yaml").read_text())
    runs = sorted(p.name for p in (root / "member_counts").iterdir())
    assert len(runs) == (len(params["train"]["methods"]) * len(params["train"]["seeds"])
                         * len(params["privacy"]["target_epsilons"])
                         * len(params["partition"]["alphas"]))
    for run in runs:
        counts = json.loads((root / "member_counts" / run / "counts.json").read_text())
        alpha = run.split("-")[2]
        partition = json.loads((root / "data" / "partitions" / alpha / "partition.json")
                               .read_text())
        assert sum(counts["counts"]) == len(partition["positions"])
        assert (root / "member_counts" / run / "provenance.json").is_file()
    again = _sh(["dpclip", "member_counts"], root, env)
    assert again.count("up to date") == len(runs)  # each run's inputs are unchanged
    stage = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]["member_counts"]
    assert "data/partitions" in stage["deps"] and "train.seeds" in stage["params"]
    assert stage["outs"] == [{"member_counts": {"persist": True}}]
