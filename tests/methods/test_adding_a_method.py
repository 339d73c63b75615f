"""Adding a scale-only method is one new file: the example of docs/adding-a-method.md, copied
into a plugin folder of the methods package, is found, validated, trained at the matched budget, covered by
the contract and shown in the report, with no other edit."""

from __future__ import annotations


import pytest
from conftest import docs_example
from contract import (check_clip_bound, check_declaration, check_determinism,
                      check_empty_batch, check_matched_budget, check_option_validation,
                      check_resume, check_step_metrics)

from dpclip.pipeline.params import parse_params
from dpclip.errors import ConfigError, DpclipError
from dpclip.layout import Layout
from dpclip.methods import available_methods, get_method
from dpclip.stages.evaluate import evaluate
from dpclip.stages.partition import partition
from dpclip.stages.prepare import prepare
from dpclip.stages.report import report
from dpclip.stages.train import train


@pytest.fixture
def per_layer(plugin):
    """The documented module dropped into a folder the methods package searches."""
    return plugin("dpclip.methods", "per_layer", docs_example("adding-a-method.md"))


def test_an_unknown_method_lists_the_known_ones():
    with pytest.raises(DpclipError) as info:
        get_method("per_layer_typo")
    assert "'per_layer_typo'" in str(info.value)
    assert all(name in str(info.value) for name in available_methods())


def test_the_documented_method_is_found_and_keeps_the_contract(per_layer, tiny_raw,
                                                               monkeypatch, tmp_path):
    assert per_layer in available_methods()
    for check in (check_declaration, check_clip_bound, check_matched_budget,
                  check_empty_batch, check_determinism, check_step_metrics):
        check(per_layer)
    check_resume(per_layer, monkeypatch, tmp_path)
    check_option_validation(per_layer, tiny_raw)
    with pytest.raises(ConfigError, match=r"methods\.per_layer\.shrink: 0"):
        parse_params(tiny_raw(methods={"per_layer": {"shrink": 0}}))


def test_the_documented_method_runs_through_the_stages_into_the_report(per_layer, tiny_raw,
                                                                       tmp_path):
    params = parse_params(tiny_raw(train={"methods": ["dp_sgd", per_layer], "epochs": 1},
                                   evaluate={"ir_attack": False},
                                   methods={per_layer: {"shrink": 0.5}}))
    layout = Layout(tmp_path)
    prepare(params, layout)
    partition(params, "iid", layout)
    for method in params.train.methods:
        record = train(params, method, 8, "iid", 0, layout, progress=False)
        assert record["privacy"]["epsilon"] <= 8.0
        evaluate(params, method, 8, "iid", 0, layout)
    report(params, layout, track=False)
    comparison = (layout.reports / "comparison.md").read_text()
    assert "| per_layer " in comparison or "per_layer-eps8-iid-seed0" in comparison


def test_a_plugin_cannot_replace_a_registered_method_or_run_kind():
    """A class from another module under a known name is refused, not swapped in: records
    would otherwise say "dp_sgd" for a method that is not DP-SGD."""
    from dpclip.methods.base import Method, register
    from dpclip.train.runs.base import Run, register_run_kind

    impostor = type("DPSGD", (Method,), {"name": "dp_sgd", "__module__": "plugin.fake"})
    with pytest.raises(ValueError, match="already registered"):
        register(impostor)
    assert get_method("dp_sgd") is not impostor
    fake_run = type("PrivateRun", (Run,), {"kind": "private", "__module__": "plugin.fake"})
    with pytest.raises(ValueError, match="already registered"):
        register_run_kind(fake_run)


OPACUS_KIND_WITHOUT_ITS_FUNCTIONS = '''
from dpclip.methods.base import Method, clip_factors, register


@register
class HalfOpacus(Method):
    name = "half_opacus"
    run_kind = "opacus_optimizer"

    def scale(self, layer_norms):
        return clip_factors(layer_norms, self.clip_threshold)
'''


def test_the_model_a_run_trains_belongs_to_its_run_kind_not_to_the_method(plugin):
    """The method's contract is its rule and the data beside it: the model's widths, a public
    pre-training and the evaluated model's rebuild are the run kind's (sanitize's inserts its
    layer there); Opacus's optimizer functions are the opacus_optimizer kind's demand of its
    method, refused by name when a method of that kind lacks them."""
    from conftest import gaussian_records, tiny_train_config
    from dpclip.methods.base import Method
    from dpclip.train import build_run
    from dpclip.train.runs import run_class

    for hook in ("model_hidden", "needs_public_data", "rebuild_for_evaluation", "attach",
                 "opacus_step"):
        assert not hasattr(Method, hook), hook
    sanitize = run_class(get_method("sanitize").run_kind)
    options = get_method("sanitize").default_options()
    assert sanitize.model_hidden(options, [32]) == [8 * options.n, 4 * options.n,
                                                    2 * options.n, options.n]
    assert sanitize.needs_public_data(options) == (options.encoder == "frozen")
    name = plugin("dpclip.methods", "half_opacus", OPACUS_KIND_WITHOUT_ITS_FUNCTIONS)
    x, _ = gaussian_records(20)
    with pytest.raises(DpclipError, match=r"'half_opacus'.*needs attach\(\) and "
                                          r"opacus_step\(\)"):
        build_run(x.shape[1:], 3, len(x), tiny_train_config(name))


def test_a_method_that_defines_what_its_run_kind_owns_is_refused_by_name():
    """A method written as if it chose its model's widths would train train.hidden without a
    word: the class is refused where it is defined, naming the hook and where it belongs; from
    a plugin module, the command prints that one line (no traceback) and exits 2."""
    from dpclip.methods.base import Method

    with pytest.raises(DpclipError, match=r"Wide defines model_hidden \(the model a run trains "
                                        r"is its run kind's"):
        type("Wide", (Method,), {"model_hidden": classmethod(lambda cls, o, h: [64])})
    with pytest.raises(DpclipError, match=r"Typed defines Options \(a method's options are its "
                                        r"OPTIONS\)"):
        type("Typed", (Method,), {"Options": object})



MISSPELT_RUN_KIND = '''
from dpclip.methods.base import Method, clip_factors, register


@register
class Misspelt(Method):
    name = "misspelt"
    run_kind = "privat"

    def scale(self, layer_norms):
        return clip_factors(layer_norms, self.clip_threshold)
'''


def test_a_misspelt_run_kind_is_refused_when_the_parameters_are_read(plugin, tiny_raw):
    """Once it passed validate and stopped the train stage, after prepare, partition and
    shadow had run."""
    name = plugin("dpclip.methods", "misspelt", MISSPELT_RUN_KIND)
    with pytest.raises(ConfigError, match=r"train.methods: 'misspelt' .*run_kind 'privat' is "
                                          r"not one of \['opacus_optimizer', 'plain', "
                                          r"'private', 'sanitize'\]"):
        parse_params(tiny_raw(train={"methods": [name]}))


WIDE_METHOD = '''
from dpclip.methods.base import Method, clip_factors, register


@register
class Wide(Method):
    name = "wide"

    @classmethod
    def model_hidden(cls, options, hidden):
        return [64]

    def scale(self, layer_norms):
        return clip_factors(layer_norms, self.clip_threshold)
'''


def test_a_method_module_that_defines_what_its_run_kind_owns_stops_the_command_in_one_line(
        tmp_path, write_params, tiny_raw):
    """A user's module in src/dpclip/methods/ is imported when params.yaml is read: the refusal
    is the command's one error line and exit 2, not a traceback (a newcomer met one)."""
    import os
    import shutil
    import subprocess
    import sys

    from conftest import PROJECT

    src = tmp_path / "src"
    shutil.copytree(PROJECT / "src", src, ignore=shutil.ignore_patterns("__pycache__",
                                                                        "*.egg-info"))
    (src / "dpclip" / "methods" / "wide.py").write_text(WIDE_METHOD)
    params = write_params(tiny_raw())
    done = subprocess.run([sys.executable, "-m", "dpclip.cli", "--params", str(params),
                           "validate"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(src)})
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        "dpclip: error: method class Wide defines model_hidden (the model a run trains is its "
        "run kind's (dpclip.train.runs)): docs/adding-a-method.md"]


def test_a_claim_set_on_the_instance_is_refused():
    """A method written as the old per-instance way (self.dp_guarantee = False in __init__)
    would have its record say dp_guarantee: true: the claim is privacy_claim(options)."""
    from dpclip.methods.base import Method, MethodContext

    class Literal(Method):
        name = "literal"

        def __init__(self, context):
            super().__init__(context)
            self.dp_guarantee = False

    with pytest.raises(DpclipError, match=r"'literal': dp_guarantee is declared on the class"):
        Literal(MethodContext(1.0, ["fc1"]))
