"""The stage declarations (dpclip.catalog): the DAG their inputs and outputs give, worked
out by hand, and the contract every declared stage's module keeps (as the method and attack
registries' contract tests do)."""

from __future__ import annotations

import importlib
from dataclasses import replace

import pytest

from dpclip.catalog import (BY_NAME, DECLARED, ONCE, PER_ALPHA, PER_RUN, STAGES, Output,
                                  Stage, in_pipeline_order, upstream)


def test_the_edges_are_the_outputs_each_stage_reads():
    edges = {stage.name: [u.name for u in upstream(stage)] for stage in STAGES}
    assert edges == {
        "check": [], "prepare": ["check"], "partition": ["prepare"],
        "shadow": ["check", "prepare"],  # check: a model file of the user's own
        "tune": ["check", "prepare", "shadow"],
        "train": ["check", "prepare", "partition", "shadow", "tune"],
        "audit": ["check", "prepare", "partition", "shadow", "tune"],
        "reference": ["check", "prepare", "partition", "shadow", "tune"],
        "evaluate": ["prepare", "partition", "train", "audit", "reference"],
        "report": ["shadow", "tune", "train", "evaluate"]}


def test_the_order_comes_from_the_edges_not_from_the_declaration():
    shuffled = in_pipeline_order(tuple(reversed(DECLARED)))
    for i, stage in enumerate(shuffled):
        assert all(shuffled.index(u) < i for u in upstream(stage)), stage.name
    assert shuffled[0].name == "check" and shuffled[-1].name == "report"
    assert [s.name for s in STAGES] == ["check", "prepare", "partition", "shadow", "tune", "train",
                                        "audit", "reference", "evaluate", "report"]


def test_a_cycle_or_a_name_declared_twice_is_refused():
    a = Stage(name="a", help="", scope=ONCE, deps=("b_out",), outs=(Output("a_out"),))
    b = Stage(name="b", help="", scope=ONCE, deps=("a_out",), outs=(Output("b_out"),))
    with pytest.raises(ValueError, match="cycle"):
        in_pipeline_order((a, b))
    with pytest.raises(ValueError, match="twice"):
        in_pipeline_order((a, replace(a, deps=())))


def test_a_folder_dependency_reads_the_outputs_inside_it():
    """evaluate lists data/partitions, partition writes data/partitions/${item.alpha}."""
    assert BY_NAME["partition"].produces("data/partitions")
    assert BY_NAME["shadow"].produces("shadow/risk.json")
    assert not BY_NAME["shadow"].produces("shadows")


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.name)
def test_every_declared_stage_has_the_functions_its_scope_needs(stage):
    """The stage-module contract (docs/api/pipeline.md, beside :mod:`dpclip.catalog`), for every
    declared stage."""
    module = importlib.import_module(stage.module)
    assert callable(getattr(module, stage.name)) and callable(module.describe)
    assert stage.scope in (ONCE, PER_ALPHA, PER_RUN)
    if stage.scope == PER_RUN:
        assert stage.per_run is not None and stage.tidy in ("set aside", "remove")
        for pattern in stage.per_run.writes.values():  # each output of a run is a DVC output
            assert stage.produces(pattern.split("{")[0].rstrip("/")), pattern
    if stage.skipped:
        assert callable(getattr(module, stage.skipped))
    assert stage.outs or stage.metrics


def test_the_command_has_one_subcommand_per_declared_stage():
    from dpclip.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert {s.name for s in STAGES} <= set(sub.choices)
    assert "--alpha" in sub.choices["partition"].format_usage()
    assert "--seed" in sub.choices["train"].format_usage()
    assert "--no-track" in sub.choices["report"].format_usage()


def test_the_stages_package_holds_the_declared_stages_and_nothing_else():
    from dpclip.code_closure import package_modules

    modules = {m.removeprefix("dpclip.stages.") for m in package_modules()
               if m.startswith("dpclip.stages.")}
    assert modules == set(BY_NAME)
