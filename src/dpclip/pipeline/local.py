"""Every declared stage in order, in this process (the presets run a variant so; DVC and the
Prefect flow schedule the same stage functions themselves)."""

from __future__ import annotations

import importlib
from typing import Callable

from dpclip.layout import Layout
from dpclip.pipeline.spec import ONCE, PER_ALPHA, STAGES, Stage


def stage_options(stage: Stage, progress: bool, **given) -> dict:
    """The keyword options ``stage``'s functions take: ``progress`` where declared, and each of
    its flags' keywords found in ``given`` (``track`` for report)."""
    options = {"progress": progress} if stage.progress else {}
    options.update({f.keyword: given[f.keyword] for f in stage.flags if f.keyword in given})
    return options


def run_stages(params, layout: Layout, progress: bool = True,
               before: Callable[[Stage], None] | None = None, jobs: int = 1,
               **given) -> None:
    """Run every stage in pipeline order: once, per alpha, or every configured run that is
    not up to date, ``jobs`` runs side by side (printing each run done when ``progress``).
    ``before(stage)`` is called before each stage; ``given`` holds the flags' keywords
    (``track=False``)."""
    for stage in STAGES:
        if before is not None:
            before(stage)
        module = importlib.import_module(stage.module)
        options = stage_options(stage, progress, **given)
        if stage.scope == ONCE:
            getattr(module, stage.name)(params, layout, **options)
        elif stage.scope == PER_ALPHA:
            for alpha in params.partition.alphas:
                getattr(module, stage.name)(params, alpha, layout, **options)
        else:
            for key, result in getattr(module, f"{stage.name}_all")(params, layout, jobs=jobs,
                                                                    **options):
                if progress and result is not None:
                    print(f"  {stage.name} {key.name}", flush=True)
