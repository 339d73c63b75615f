"""The dpclip pipeline as a Prefect flow: the same stage functions DVC runs, as tasks.

    python -m flows.pipeline [--params params.yaml] [--root .] [--no-track]
                             [--workers N | --dask-address tcp://host:8786 | --sequential]

Configurations run in parallel on Dask (prefect-dask): a local cluster of N worker processes
(default: the CPUs divided by ``train.threads``, so the runs fill the machine), or an existing
cluster by address. Each configuration seeds itself and sets torch's thread count from
``train.threads`` in its worker process, so the results equal the sequential run's bit for bit
(:mod:`dpclip.threads`).
Without Dask (``--sequential``, and the served deployment) they run one after another in the
flow's process: the stages seed torch's global generator, so running them in threads would make
results depend on scheduling. A configuration whose inputs did not change
is not trained or evaluated again: the task reads its ``provenance.json``, the same input hash
that ``dvc repro`` uses (:mod:`dpclip.provenance`), and completes as "up to date". The
dependency edges are the real ones (a run's training, its audit and its reference models wait
for its partition and the shadow stage; its evaluation for those three; the report for every
evaluation): on Dask a run's reference models train beside other runs' training, and the
comparison
table and report are the flow run's artifacts.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import flows  # noqa: F401  (environment defaults before prefect is imported)
from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NONE as NO_CACHE
from prefect.states import Completed
from prefect.tasks import exponential_backoff

from dpclip.attacks import baseline_attack
from dpclip.stages.audit import audit, set_aside_unconfigured_audits
from dpclip.stages.evaluate import evaluate, remove_unconfigured_evaluations
from dpclip.stages.partition import partition
from dpclip.stages.prepare import prepare
from dpclip.stages.reference import reference, set_aside_unconfigured_references
from dpclip.stages.report import report
from dpclip.stages.shadow import shadow
from dpclip.stages.train import set_aside_unconfigured_runs, train
from dpclip.stages.tune import tune
from dpclip.config import load_params
from dpclip.errors import DpclipError
from dpclip.layout import Layout
from dpclip.naming import RunKey, configured_runs
from dpclip.provenance import AUDIT, EVALUATE, REFERENCE, TRAIN, RunStage
from dpclip.reporting.summary_table import HEADERS, LEGEND, cells

UP_TO_DATE = "up to date: its inputs and outputs match its provenance.json"


def retry_unless_bad_input(task, task_run, state) -> bool:
    """Retry what may pass on a second try (a killed process, a full disk, a locked database),
    never a rejected input (:class:`DpclipError`): the same input fails the same way."""
    try:
        state.result()
    except DpclipError:
        return False
    except Exception:  # noqa: BLE001 (any other failure may be transient)
        return True
    return True


# DVC and the provenance files decide what is current, so Prefect keeps no cache of its own.
TASK = dict(cache_policy=NO_CACHE)
RETRIED = dict(TASK, retries=2, retry_delay_seconds=exponential_backoff(backoff_factor=10),
               retry_condition_fn=retry_unless_bad_input)

prepare_task = task(name="prepare", **TASK)(prepare)
partition_task = task(name="partition", task_run_name="partition-{alpha}", **TASK)(
    partition)
shadow_task = task(name="shadow", **TASK)(shadow)
tune_task = task(name="tune", **TASK)(tune)
report_task = task(name="report", **TASK)(report)


def unless_current(stage: RunStage, params, key: RunKey, layout: Layout, run):
    """The run's recorded result, completed as "up to date", when its inputs did not change
    (the provenance `dvc repro` uses too); else ``run()``."""
    result = stage.reuse(params, key, layout)
    if result is not None:
        return Completed(message=UP_TO_DATE, data=result)
    return run()


@task(name="train", task_run_name="train-{key.name}", **RETRIED)
def train_task(params, key: RunKey, layout: Layout, progress: bool = False):
    return unless_current(TRAIN, params, key, layout, lambda: train(
        params, key.method, key.epsilon, key.alpha, key.seed, layout, progress))


@task(name="audit", task_run_name="audit-{key.name}", **RETRIED)
def audit_task(params, key: RunKey, layout: Layout):
    return unless_current(AUDIT, params, key, layout, lambda: audit(
        params, key.method, key.epsilon, key.alpha, key.seed, layout))


@task(name="reference", task_run_name="reference-{key.name}", **RETRIED)
def reference_task(params, key: RunKey, layout: Layout):
    if params.attack.references == 0:
        return Completed(message="no reference models (attack.references: 0)")
    return unless_current(REFERENCE, params, key, layout, lambda: reference(
        params, key.method, key.epsilon, key.alpha, key.seed, layout))


@task(name="evaluate", task_run_name="evaluate-{key.name}", **RETRIED)
def evaluate_task(params, key: RunKey, layout: Layout):
    return unless_current(EVALUATE, params, key, layout, lambda: evaluate(
        params, key.method, key.epsilon, key.alpha, key.seed, layout))


def overrides(dataset: str | None = None, methods: list[str] | None = None,
              target_epsilons: list[float] | None = None,
              seeds: list[int] | None = None) -> dict:
    """The run form's changes as params sections. An integral epsilon is written as YAML
    writes it (8, not 8.0), so a run keeps its name (``dp_sgd-eps8-...``) across front doors."""
    out: dict = {}
    if dataset is not None:
        out["data"] = {"dataset": dataset}
    if methods is not None:
        out.setdefault("train", {})["methods"] = list(methods)
    if seeds is not None:
        out.setdefault("train", {})["seeds"] = list(seeds)
    if target_epsilons is not None:
        out["privacy"] = {"target_epsilons": [
            int(e) if isinstance(e, float) and e.is_integer() else e for e in target_epsilons]}
    return out


def _table_rows(table) -> list[dict]:
    """The comparison table as JSON-safe rows for the UI: a missing value is None (not NaN),
    numbers are rounded to 6 significant digits (the CSV keeps them all)."""
    def cell(v):
        if isinstance(v, float):
            return None if math.isnan(v) else float(f"{v:.6g}")
        return v

    return [{k: cell(v) for k, v in row.items()} for row in table.to_dict(orient="records")]


def runs_in_processes() -> bool:
    """Whether this flow run's tasks go to worker processes (Dask), where configurations may
    run at the same time; in threads they may not (torch's global generator)."""
    from prefect.context import get_run_context

    return type(get_run_context().task_runner).__name__ == "DaskTaskRunner"


@flow(name="dpclip-pipeline", log_prints=True)
def pipeline(params_path: str = "params.yaml", root: str = ".", track: bool = True,
             progress: bool = False, dataset: str | None = None,
             methods: list[str] | None = None, target_epsilons: list[float] | None = None,
             seeds: list[int] | None = None) -> list[dict]:
    """prepare -> partition (per alpha) -> shadow -> tune -> train, audit, reference, evaluate (per
    configuration) -> report. ``dataset``, ``methods``, ``target_epsilons`` and ``seeds`` replace those of the
    parameter file for this run (validated by the same schema). On a Dask task runner the
    configurations run in parallel (:func:`with_dask`)."""
    params = load_params(params_path, overrides(dataset, methods, target_epsilons, seeds))
    layout = Layout(Path(root).resolve())  # a Dask worker elsewhere has another cwd
    # wait_for states the real edges (on Dask each run's tasks wait for their own inputs only;
    # called in order in this process, Prefect also records the tasks that ran before)
    p, out = params, layout
    prepared = prepare_task(p, out, return_state=True)
    prepared.result()
    partitioned = {alpha: partition_task(p, alpha, out, wait_for=[prepared],
                                         return_state=True)
                   for alpha in params.partition.alphas}
    shadowed = shadow_task(p, out, progress, wait_for=[prepared], return_state=True)
    for state in [*partitioned.values(), shadowed]:
        state.result()
    # the same search the tune stage runs (tune.trials 0: none); every run trains with its result
    tuned = tune_task(p, out, progress, wait_for=[shadowed], return_state=True)
    tuned.result()
    keys = configured_runs(params)
    # as the DVC stages do: outputs of runs no longer configured leave the compared folders
    set_aside_unconfigured_runs(params, layout)
    set_aside_unconfigured_audits(params, layout)
    set_aside_unconfigured_references(params, layout)
    remove_unconfigured_evaluations(params, layout)
    if runs_in_processes():  # every configuration at once; each waits for its own inputs
        pending = {}
        for key in keys:
            inputs = [partitioned[key.alpha], shadowed, tuned]
            trained = train_task.submit(p, key, out, progress, wait_for=inputs)
            audited = audit_task.submit(p, key, out, wait_for=inputs)
            referenced = reference_task.submit(p, key, out, wait_for=inputs)
            pending[key] = (trained, evaluate_task.submit(
                p, key, out, wait_for=[trained, audited, referenced]))
        done = []
        for trained, evaluation in pending.values():
            trained.wait(), evaluation.wait()
            done.append((trained.state, evaluation.state))
    else:
        done = []
        for key in keys:
            inputs = [partitioned[key.alpha], shadowed, tuned]
            trained = train_task(p, key, out, progress, wait_for=inputs, return_state=True)
            trained.result()
            audited = audit_task(p, key, out, wait_for=inputs, return_state=True)
            audited.result()
            referenced = reference_task(p, key, out, wait_for=inputs, return_state=True)
            referenced.result()
            done.append((trained, evaluate_task(p, key, out,
                                                wait_for=[trained, audited, referenced],
                                                return_state=True)))
    summary, evaluated = [], []
    for trained, state in done:
        trained.result()  # a failed run fails the flow here, after the others finished
        m = state.result()
        evaluated.append(state)
        summary.append({"run": m["run"], "epsilon": m["privacy"]["epsilon"],
                        "accuracy": m["utility"]["accuracy"], "ece": m["utility"]["ece"],
                        "mia_auc": m["mia"][baseline_attack().name]["auc"],
                        "peak_ir_mia": m["mia"].get("ir", {}).get("peak_accuracy"),
                        "trained": trained.message != UP_TO_DATE,
                        "evaluated": state.message != UP_TO_DATE})
        print(summary[-1])
    result = report_task(p, out, track, wait_for=evaluated)
    # the UI lists the newest artifact first: every column of every run, the report (which
    # opens with the short table), then the short table itself (what the terminal prints)
    create_table_artifact(table=_table_rows(result.table), key="dpclip-comparison",
                          description=f"dpclip comparison ({params.data.dataset}): every "
                                      f"column of every run")
    create_markdown_artifact(markdown=(layout.reports / "comparison.md").read_text(),
                             key="dpclip-report", description="dpclip report")
    create_table_artifact(table=[{HEADERS[k]: v for k, v in row.items()}
                                 for row in cells(result.summary)], key="dpclip-summary",
                          description=f"dpclip summary ({params.data.dataset}): one row per "
                                      f"configuration over its seeds. {LEGEND}")
    if result.mlflow:
        from dpclip.tracking import describe

        print(describe(result.mlflow))
    return summary


def local_workers(threads: int | None) -> int:
    """Worker processes that fill the machine's CPUs when each run uses ``threads`` of them
    (``train.threads``; None: all, hence one worker)."""
    cpus = os.cpu_count() or 1
    return max(1, cpus // (threads or cpus))


def with_dask(workers: int, address: str | None = None):
    """The flow on a Dask task runner: an existing cluster at ``address``, else a local
    cluster of ``workers`` processes, one task at a time each (a run sets its own threads)."""
    from prefect_dask import DaskTaskRunner

    if address:
        runner = DaskTaskRunner(address=address)
    else:
        runner = DaskTaskRunner(cluster_kwargs={"n_workers": workers, "threads_per_worker": 1,
                                                "processes": True})
    return pipeline.with_options(task_runner=runner)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--root", default=".")
    parser.add_argument("--no-track", action="store_true", help="skip MLflow logging")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int,
                       help="local Dask cluster of this many processes (default: CPUs divided "
                            "by train.threads)")
    where.add_argument("--dask-address", help="an existing Dask scheduler, tcp://host:8786")
    where.add_argument("--sequential", action="store_true",
                       help="no Dask: configurations one after another in this process")
    args = parser.parse_args(argv)
    if args.workers is not None and args.workers < 1:
        print(f"dpclip: error: --workers: {args.workers} must be at least 1", file=sys.stderr)
        return 2
    try:
        params = load_params(args.params)  # fail fast, before Prefect starts its API
        workers = args.workers or local_workers(params.train.threads)
        flow_ = pipeline if args.sequential else with_dask(workers, args.dask_address)
        flow_(params_path=args.params, root=args.root, track=not args.no_track)
    except DpclipError as exc:
        print(f"dpclip: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
