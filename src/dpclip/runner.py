"""How a stage runs, one function per kind (once, per alpha, per run), for every front door:
the ``dpclip`` command (what dvc.yaml runs), the presets (every stage in this process,
:func:`run_stages`) and the Prefect flow's tasks.

Each stage's dvc.yaml code is this module's import closure with the stage's own
(:mod:`dpclip.pipeline.dvc_yaml`), so it imports what every stage needs only; the per-run
mechanism (:mod:`dpclip.pipeline.provenance`, which reads every plugin family) is loaded by
name for the per-run stages, whose modules import it themselves.
"""

from __future__ import annotations

import importlib
from typing import Callable, Iterator

from dpclip import retire
from dpclip.catalog import ONCE, PER_ALPHA, STAGES, Stage
from dpclip.layout import Layout
from dpclip.run_keys import RunKey, configured_runs

UP_TO_DATE = "up to date: its inputs and outputs match its provenance.json"


def stage_module(stage: Stage):
    """The stage's module, imported by name: a stage's command imports no other stage."""
    return importlib.import_module(stage.module)


def _provenance():
    return importlib.import_module("dpclip.pipeline.provenance")


def stage_options(stage: Stage, progress: bool, **given) -> dict:
    """The keyword options ``stage``'s function takes: ``progress`` where declared, and each of
    its flags' keywords found in ``given`` (``track`` for report)."""
    options = {"progress": progress} if stage.progress else {}
    options.update({f.keyword: given[f.keyword] for f in stage.flags if f.keyword in given})
    return options


def run_once(stage: Stage, params, layout: Layout, **options):
    return getattr(stage_module(stage), stage.name)(params, layout, **options)


def run_for_alpha(stage: Stage, params, alpha, layout: Layout):
    return getattr(stage_module(stage), stage.name)(params, alpha, layout)


def skipped(stage: Stage, params) -> str | None:
    """Why a per-run stage runs nothing (its ``skipped`` function), or None."""
    return getattr(stage_module(stage), stage.skipped)(params) if stage.skipped else None


def run_one(stage: Stage, params, key: RunKey, layout: Layout, force: bool = False,
            **options) -> tuple[dict | None, str]:
    """One run of a per-run stage: (its result, "") when it ran; (its recorded result,
    :data:`UP_TO_DATE`) when its inputs did not change, unless ``force``; (None, why) when the
    stage runs nothing."""
    why = skipped(stage, params)
    if why:
        return None, why
    if not force:
        result = _provenance().reuse(stage, params, key, layout)
        if result is not None:
            return result, UP_TO_DATE
    function = getattr(stage_module(stage), stage.name)
    return function(params, key.method, key.epsilon, key.alpha, key.seed, layout,
                    **options), ""


def tidy(stage: Stage, params, layout: Layout):
    """Before a per-run stage runs: its output folders exist (DVC declares them, even when
    empty), and the outputs of runs no longer configured (all of them when it runs nothing)
    leave them, set aside or removed as the stage declares (:mod:`dpclip.retire`)."""
    for out in (*stage.outs, *stage.metrics):
        (layout.root / out.path).mkdir(parents=True, exist_ok=True)
    configured = set() if skipped(stage, params) else \
        {key.name for key in configured_runs(params)}
    parts = stage.per_run.parts()
    if stage.tidy == "remove":
        return retire.remove(configured, parts, layout)
    return retire.set_aside(configured, parts, layout)


def run_every(stage: Stage, params, layout: Layout, force: bool = False, jobs: int = 1,
              **options) -> Iterator[tuple[RunKey, dict | None]]:
    """Every configured run of a per-run stage that is not up to date (all with ``force``), in
    this process or ``jobs`` at a time side by side; yields (run, its result, or None when it
    was up to date). Runs no longer configured leave first (:func:`tidy`)."""
    tidy(stage, params, layout)
    if skipped(stage, params):
        return iter(())
    function = getattr(stage_module(stage), stage.name)
    provenance = _provenance()
    return provenance.each_run(stage, params, layout,
                               provenance.for_key(function, params, layout, **options),
                               force, jobs)


def run_stages(params, layout: Layout, progress: bool = True,
               before: Callable[[Stage], None] | None = None, jobs: int = 1,
               **given) -> None:
    """Run every stage in pipeline order in this process: once, per alpha, or every
    configured run that is not up to date, ``jobs`` runs side by side (printing each run done
    when ``progress``). ``before(stage)`` is called before each stage; ``given`` holds the
    flags' keywords (``track=False``)."""
    for stage in STAGES:
        if before is not None:
            before(stage)
        options = stage_options(stage, progress, **given)
        if stage.scope == ONCE:
            run_once(stage, params, layout, **options)
        elif stage.scope == PER_ALPHA:
            for alpha in params.partition.alphas:
                run_for_alpha(stage, params, alpha, layout)
        else:
            for key, result in run_every(stage, params, layout, jobs=jobs, **options):
                if progress and result is not None:
                    print(f"  {stage.name} {key.name}", flush=True)
