"""dvc.yaml is generated from the stage declarations (dpclip.pipeline.dvc_yaml): the committed
file is the generated one, each stage lists its command's code and the lock file, and the
rendering of a declaration is worked out by hand."""

from __future__ import annotations

import yaml

from conftest import PROJECT
from dpclip.pipeline.dvc_yaml import LOCK_FILE, render, render_stage, stage_code, write
from dpclip.pipeline.spec import BY_NAME, PER_ALPHA, STAGES, Output, Stage


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


def test_a_stage_that_runs_a_plugin_family_lists_every_module_of_it():
    train = stage_code(BY_NAME["train"])
    assert {"src/dpclip/methods/dp_sgd.py", "src/dpclip/methods/ww_dp_sgd.py"} <= set(train)
    assert "src/dpclip/attacks/lira.py" not in train  # train runs no attack
    assert "src/dpclip/attacks/lira.py" in stage_code(BY_NAME["evaluate"])
    assert "src/dpclip/methods/dp_sgd.py" not in stage_code(BY_NAME["partition"])


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
