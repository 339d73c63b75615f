"""Stage functions: params + input files -> output files. The CLI (DVC), the Prefect flows and
the tests all call these, and nothing else holds stage logic."""

from dpclip.stages.audit import audit, audit_all, set_aside_unconfigured_audits
from dpclip.stages.evaluate import evaluate, evaluate_all, remove_unconfigured_evaluations
from dpclip.stages.partition import partition
from dpclip.stages.prepare import prepare
from dpclip.naming import RunKey, configured_runs
from dpclip.stages.reference import (reference, reference_all,
                                      set_aside_unconfigured_references)
from dpclip.stages.report import report
from dpclip.stages.shadow import shadow
from dpclip.stages.train import set_aside_unconfigured_runs, train, train_all
from dpclip.stages.tune import tune

__all__ = ["prepare", "partition", "shadow", "tune", "train", "train_all", "audit", "audit_all",
           "reference", "reference_all", "set_aside_unconfigured_references",
           "evaluate", "evaluate_all",
           "report", "configured_runs", "RunKey", "set_aside_unconfigured_runs",
           "set_aside_unconfigured_audits",
           "remove_unconfigured_evaluations"]
