"""Stage functions: params + input files -> output files. The CLI (DVC), the Prefect flows and
the tests all call these, and nothing else holds stage logic."""

from dpclip.stages.evaluate import evaluate
from dpclip.stages.partition import partition
from dpclip.stages.prepare import prepare
from dpclip.stages.report import RunKey, configured_runs, report
from dpclip.stages.shadow import shadow
from dpclip.stages.train import train

__all__ = ["prepare", "partition", "shadow", "train", "evaluate", "report", "configured_runs", "RunKey"]
