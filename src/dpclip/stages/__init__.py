"""Stage functions: params + input files -> output files. The CLI (DVC), the Prefect flows and
the tests all call these, and nothing else holds stage logic.

``dpclip.stages.<function>`` is loaded on first use from the module that defines it
(PEP 562), so that a process running one stage imports that stage's code only, and a stage's
code dependencies (:mod:`dpclip.code_closure`) do not include every other stage."""

from __future__ import annotations

import importlib

# function -> the module that defines it
WHERE = {
    "prepare": "prepare", "partition": "partition", "shadow": "shadow", "tune": "tune",
    "train": "train", "train_all": "train", "set_aside_unconfigured_runs": "train",
    "audit": "audit", "audit_all": "audit", "set_aside_unconfigured_audits": "audit",
    "reference": "reference", "reference_all": "reference",
    "set_aside_unconfigured_references": "reference",
    "evaluate": "evaluate", "evaluate_all": "evaluate",
    "remove_unconfigured_evaluations": "evaluate",
    "report": "report",
}
__all__ = [*WHERE, "configured_runs", "RunKey"]


def __getattr__(name: str):
    if name in ("configured_runs", "RunKey"):
        return getattr(importlib.import_module("dpclip.naming"), name)
    if name not in WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{WHERE[name]}"), name)
