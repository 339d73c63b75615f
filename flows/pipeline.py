"""The dpclip pipeline as a Prefect flow: the same stage functions DVC runs, as tasks.

    python -m flows.pipeline [--params params.yaml] [--root .] [--no-track]

Configurations run one after another: the stages seed torch's global generator, so running them
in threads would make results depend on scheduling.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import flows  # noqa: F401  (environment defaults before prefect is imported)
from prefect import flow, task
from prefect.cache_policies import NONE as NO_CACHE

from dpclip import stages
from dpclip.config import load_params
from dpclip.errors import DpclipError
from dpclip.layout import Layout

# DVC caches stage outputs; Prefect only orders and retries the calls.
TASK = dict(cache_policy=NO_CACHE, retries=0)

prepare_task = task(name="prepare", **TASK)(stages.prepare)
partition_task = task(name="partition", task_run_name="partition-{alpha}", **TASK)(
    stages.partition)
shadow_task = task(name="shadow", **TASK)(stages.shadow)
train_task = task(name="train", task_run_name="train-{method}-eps{epsilon}-{alpha}-seed{seed}",
                  **TASK)(stages.train)
evaluate_task = task(name="evaluate",
                     task_run_name="evaluate-{method}-eps{epsilon}-{alpha}-seed{seed}",
                     **TASK)(stages.evaluate)
report_task = task(name="report", **TASK)(stages.report)


@flow(name="dpclip-pipeline", log_prints=True)
def pipeline(params_path: str = "params.yaml", root: str = ".", track: bool = True,
             progress: bool = False) -> list[dict]:
    """prepare -> partition (per alpha) -> shadow -> train, evaluate (per configuration)
    -> report."""
    params = load_params(params_path)  # every bad key is reported before any work
    layout = Layout(Path(root))
    prepare_task(params, layout)
    for alpha in params.partition.alphas:
        partition_task(params, alpha, layout)
    shadow_task(params, layout, progress)
    summary = []
    for key in stages.configured_runs(params):
        train_task(params, key.method, key.epsilon, key.alpha, key.seed, layout, progress)
        m = evaluate_task(params, key.method, key.epsilon, key.alpha, key.seed, layout)
        summary.append({"run": m["run"], "epsilon": m["privacy"]["epsilon"],
                        "accuracy": m["utility"]["accuracy"], "ece": m["utility"]["ece"],
                        "mia_auc": m["mia"]["loss"]["auc"],
                        "peak_ir_mia": m["mia"].get("ir", {}).get("peak_accuracy")})
        print(summary[-1])
    result = report_task(params, layout, track)
    if result.mlflow:
        from dpclip.tracking import describe

        print(describe(result.mlflow))
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.pipeline", description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--root", default=".")
    parser.add_argument("--no-track", action="store_true", help="skip MLflow logging")
    args = parser.parse_args(argv)
    try:
        load_params(args.params)  # fail fast, before Prefect starts its API
        pipeline(params_path=args.params, root=args.root, track=not args.no_track)
    except DpclipError as exc:
        print(f"dpclip: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
