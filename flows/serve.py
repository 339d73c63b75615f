"""Serve the pipeline on the cron schedule from params.yaml (``schedule.cron``).

    prefect server start            # in one terminal: the UI at http://127.0.0.1:4200
    python -m flows.serve           # in another: registers the deployment and waits for runs

The deployment ``dpclip-pipeline/dpclip-scheduled`` then appears in the UI, which can also
trigger it by hand ("Quick run").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import flows  # noqa: F401
from prefect.schedules import Cron

from dpclip.pipeline.params import load_params
from dpclip.errors import DpclipError
from flows.pipeline import pipeline

DEPLOYMENT = "dpclip-scheduled"


def deployment_kwargs(params_path: str, root: str) -> dict:
    """What ``serve`` is given: the schedule from params and the flow's parameters."""
    params = load_params(params_path)
    return {"name": DEPLOYMENT,
            "schedules": [Cron(params.schedule.cron, timezone=params.schedule.timezone)],
            "parameters": {"params_path": str(Path(params_path).resolve()),
                           "root": str(Path(root).resolve())},
            "tags": ["dpclip", params.data.dataset]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.serve", description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--root", default=".")
    args = parser.parse_args(argv)
    try:
        kwargs = deployment_kwargs(args.params, args.root)
    except DpclipError as exc:
        print(f"dpclip: error: {exc}", file=sys.stderr)
        return 2
    pipeline.serve(**kwargs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
