"""dvc.yaml is generated from the stage declarations (dpclip.pipeline.dvc_yaml): the committed
file is the generated one, each stage lists its command's code and the lock file, and the
rendering of a declaration is worked out by hand."""

from __future__ import annotations

import yaml

from conftest import PROJECT
from dpclip.pipeline.dvc_yaml import LOCK_FILE, render, render_stage, stage_code, write
from dpclip.catalog import BY_NAME, PER_ALPHA, STAGES, Output, Stage
from dpclip.code_closure import PACKAGE


def test_the_committed_dvc_yaml_is_the_generated_one():
    assert (PROJECT / "dvc.yaml").read_text() == render(), \
        "dvc.yaml differs from the stage declarations: run `make dvc.yaml`"


def test_write_writes_only_when_something_changed(tmp_path):
    target = tmp_path / "dvc.yaml"
    assert write(target) and not write(target)
    target.write_text(target.read_text().replace("      - src/dpclip/cli.py\n", "", 1))
    assert write(target) and target.read_text() == render()


def test_each_stage_lists_its_data_the_lock_file_the_cli_and_its_own_stage_only():
    stages = yaml.safe_load(render())["stages"]
    assert list(stages) == [s.name for s in STAGES]
    for name, stage in stages.items():
        deps = stage["deps"]
        assert LOCK_FILE in deps and "src/dpclip/cli.py" in deps
        assert f"src/dpclip/stages/{name}.py" in deps
        other = [d for d in deps if d.startswith("src/dpclip/stages/")
                 and d not in (f"src/dpclip/stages/{name}.py", "src/dpclip/stages/__init__.py")]
        assert name == "report" or not other, (name, other)  # report draws the overlays
        assert set(BY_NAME[name].deps) <= set(deps)
        assert [d for d in deps if d.startswith("src/")] == stage_code(BY_NAME[name])


def test_a_stage_that_runs_a_plugin_family_lists_its_folder_whole():
    """A new method file changes no line of dvc.yaml; a folder whose modules the stage's code
    does not all hold is listed file by file."""
    train = stage_code(BY_NAME["train"])
    assert "src/dpclip/methods" in train and "src/dpclip/train" in train
    assert not [f for f in train if f.startswith("src/dpclip/methods/")]
    assert "src/dpclip/attacks/base.py" in train  # the attack family's base, not its attacks
    assert "src/dpclip/attacks" not in train and "src/dpclip/attacks/lira.py" not in train
    assert "src/dpclip/attacks" in stage_code(BY_NAME["evaluate"])
    partition = stage_code(BY_NAME["partition"])
    assert "src/dpclip/methods" not in partition and \
        "src/dpclip/methods/dp_sgd.py" not in partition
    assert "src/dpclip/stages/partition.py" in partition  # not the stages folder: one stage


def test_a_folder_listed_whole_holds_only_modules_of_the_stages_code():
    from dpclip.code_closure import closure_files
    from dpclip.pipeline.dvc_yaml import code_roots

    for stage in STAGES:
        code = {f"src/dpclip/{f}" for f in closure_files(code_roots(stage))}
        for dep in stage_code(stage):
            if not dep.endswith(".py"):
                folder = PACKAGE / dep.removeprefix("src/dpclip/")
                inside = {f"src/dpclip/{p.relative_to(PACKAGE).as_posix()}"
                          for p in folder.rglob("*.py")}
                assert inside <= code, (stage.name, dep, sorted(inside - code))


def test_a_declaration_renders_as_worked_out_by_hand():
    stage = Stage(name="partition", help="", scope=PER_ALPHA, deps=("data/prepared",),
                  params=("data.seed",), notes={"data.seed": "the draw"},
                  outs=(Output("data/partitions/${item.alpha}"),
                        Output("extra", cache=False, persist=True, note="kept")))
    lines = render_stage(stage)
    code = [f"      - {p}" for p in stage_code(stage)]
    assert lines == ["  partition:", "    matrix:", "      alpha: ${partition.alphas}",
                     "    cmd: dpclip --quiet partition --alpha ${item.alpha}",
                     "    deps:", "      - data/prepared", f"      - {LOCK_FILE}", *code,
                     "    params:", "      - data.seed  # the draw",
                     "    outs:", "      - data/partitions/${item.alpha}",
                     "      - extra:  # kept", "          cache: false",
                     "          persist: true"]


def test_git_ignores_exactly_the_declared_outputs_it_does_not_track():
    """``make clean`` removes :func:`untracked_outputs`; .gitignore must ignore each of them
    and none of the outputs git tracks (summary/, overlays/)."""
    import subprocess

    from dpclip.catalog import untracked_outputs

    def ignored(path: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", "--no-index", f"{path}/x"],
                              cwd=PROJECT).returncode == 0

    tracked = [out.path for stage in STAGES for out in (*stage.outs, *stage.metrics)
               if not out.cache]
    assert tracked and not [path for path in tracked if ignored(path)]
    assert not [path for path in untracked_outputs() if not ignored(path)]
    assert "references" in untracked_outputs() and "scores" in untracked_outputs()
