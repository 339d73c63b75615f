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
that ``dvc repro`` uses (:mod:`dpclip.pipeline.provenance`), and completes as "up to date". The
dependency edges are the real ones (a run's training, its audit and its reference models wait
for its partition and the shadow stage; its evaluation for those three; the report for every
evaluation): on Dask a run's reference models train beside other runs' training, and the
comparison
table and report are the flow run's artifacts.
"""

from __future__ import annotations

import argparse
import contextlib
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
from dpclip.errors import DpclipError
from dpclip.layout import Layout
from dpclip.run_keys import RunKey, configured_runs
from dpclip.pipeline.params import load_params
from dpclip.catalog import ONCE, PER_ALPHA, PER_RUN, STAGES, Stage, upstream
from dpclip.runner import UP_TO_DATE, run_one, stage_module, stage_options, tidy
from dpclip.reporting.summary_table import HEADERS, LEGEND, cells

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

def _once_task(stage: Stage):
    """A stage run once (or once per alpha) as a task: its stage function itself."""
    function = getattr(stage_module(stage), stage.name)
    name = f"{stage.name}-{{alpha}}" if stage.scope == PER_ALPHA else stage.name
    return task(name=stage.name, task_run_name=name, **TASK)(function)


def _per_run_task(stage: Stage):
    """A per-run stage as a task on one run: completed as "up to date" when the run's inputs
    did not change (the provenance `dvc repro` uses too), or when the stage says why it has
    nothing to do (``skipped``); else the stage function on that run."""

    def run(params, key: RunKey, layout: Layout, progress: bool = False):
        result, why = run_one(stage, params, key, layout, **stage_options(stage, progress))
        return Completed(message=why, data=result) if why else result

    run.__name__ = run.__qualname__ = f"{stage.name}_run"
    return task(name=stage.name, task_run_name=f"{stage.name}-{{key.name}}", **RETRIED)(run)


TASKS = {stage.name: (_per_run_task if stage.scope == PER_RUN else _once_task)(stage)
         for stage in STAGES}


def waits_for(stage: Stage, states: dict, key: RunKey | None = None) -> list:
    """The states ``stage`` waits for (on ``key``'s run, or on every run when None): those of
    the stages whose outputs it reads, per alpha and per run where they run so."""
    out = []
    for before in upstream(stage):
        done = states[before.name]
        if before.scope == ONCE:
            out.append(done)
        elif key is None:
            out += list(done.values())
        else:
            out.append(done[key.alpha if before.scope == PER_ALPHA else key])
    return out


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
    keys = configured_runs(params)
    per_run = [stage for stage in STAGES if stage.scope == PER_RUN]
    states: dict = {}
    for stage in STAGES:
        if stage.scope == PER_RUN:  # run together, before the first stage that reads them
            continue
        if any(before.scope == PER_RUN for before in upstream(stage)):
            _per_run_stages(params, layout, keys, per_run, states, progress)
        options = stage_options(stage, progress, track=track)
        run = TASKS[stage.name]
        if stage.scope == PER_ALPHA:
            states[stage.name] = {alpha: run(params, alpha, layout, return_state=True,
                                             wait_for=waits_for(stage, states))
                                  for alpha in params.partition.alphas}
        else:
            states[stage.name] = run(params, layout, **options, return_state=True,
                                     wait_for=waits_for(stage, states))
        for state in (states[stage.name].values() if stage.scope == PER_ALPHA
                      else [states[stage.name]]):
            state.result()
    _per_run_stages(params, layout, keys, per_run, states, progress)  # if no stage reads them
    summary = []
    for key in keys:
        trained, state = states["train"][key], states["evaluate"][key]
        m = state.result()
        summary.append({"run": m["run"], "epsilon": m["privacy"]["epsilon"],
                        "accuracy": m["utility"]["accuracy"], "ece": m["utility"]["ece"],
                        "mia_auc": m["mia"][baseline_attack().name]["auc"],
                        "peak_ir_mia": m["mia"].get("ir", {}).get("peak_accuracy"),
                        "trained": trained.message != UP_TO_DATE,
                        "evaluated": state.message != UP_TO_DATE})
        print(run_line(summary[-1]))
    result = states["report"].result()
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


def _short(value, digits: int) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.{digits}f}"


def run_line(entry: dict) -> str:
    """One run of the flow's summary as the terminal shows it: rounded, and what was done."""
    done = [what for what in ("trained", "evaluated") if entry[what]] or ["up to date"]
    peak = "" if entry["peak_ir_mia"] is None else \
        f", peak IR attack {_short(entry['peak_ir_mia'], 3)}"
    return (f"{entry['run']}: epsilon {_short(entry['epsilon'], 2)}, accuracy "
            f"{_short(entry['accuracy'], 4)}, ECE {_short(entry['ece'], 4)}, "
            f"{baseline_attack().name} attack AUC {_short(entry['mia_auc'], 3)}{peak} "
            f"({', '.join(done)})")


def _per_run_stages(params, layout: Layout, keys: list[RunKey], stages: list[Stage],
                    states: dict, progress: bool) -> None:
    """Every configuration's per-run stages, each waiting for its own inputs. On Dask they are
    all submitted at once; in this process they run run by run. A failed run fails the flow
    after the others finished. Outputs of runs no longer configured leave the compared
    folders first, as in the DVC stages."""
    if states.get(stages[0].name) is not None:
        return
    for stage in stages:
        tidy(stage, params, layout)
        states[stage.name] = {}
    parallel = runs_in_processes()
    for key in keys:
        for stage in stages:
            call = TASKS[stage.name]
            args = (params, key, layout, *([progress] if stage.progress else []))
            wait = waits_for(stage, states, key)
            if parallel:
                states[stage.name][key] = call.submit(*args, wait_for=wait)
            else:
                states[stage.name][key] = call(*args, wait_for=wait, return_state=True)
                states[stage.name][key].result()
    if parallel:
        for stage in stages:
            for key, future in states[stage.name].items():
                future.wait()
                states[stage.name][key] = future.state
    for stage in stages:
        for state in states[stage.name].values():
            state.result()


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


@contextlib.contextmanager
def one_temporary_api():
    """Without a Prefect API (``PREFECT_API_URL`` unset), Prefect starts a temporary local one in
    every process that reports to it: this flow's and each Dask worker's of a local cluster, a
    server and a database check each (about 4.5 s of CPU a start, measured on two cores). Start
    one here and point this process and the workers, which inherit the environment, at it.
    Nothing is started where Prefect would start none: an API is configured (environment or
    profile), or temporary servers are turned off (``PREFECT_SERVER_EPHEMERAL_ENABLED``)."""
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    if PREFECT_API_URL.value() or not get_current_settings().server.ephemeral.enabled:
        yield
        return
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    server.start(timeout=int(os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"]))
    before = os.environ.get("PREFECT_API_URL")  # set after Prefect read its settings
    os.environ["PREFECT_API_URL"] = server.api_url
    try:
        with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
            yield
    finally:
        try:  # what this process has still to send goes first (else retried against a stopped
            # server for a minute or more), as Prefect's own test harness does
            from prefect.events.worker import EventsWorker
            from prefect.logging.handlers import APILogWorker

            APILogWorker.drain_all(timeout=10)
            EventsWorker.drain_all(timeout=10)
        finally:
            if before is None:
                os.environ.pop("PREFECT_API_URL", None)
            else:
                os.environ["PREFECT_API_URL"] = before
            server.stop()


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
        local_cluster = not (args.sequential or args.dask_address)
        with one_temporary_api() if local_cluster else contextlib.nullcontext():
            flow_(params_path=args.params, root=args.root, track=not args.no_track)
    except DpclipError as exc:
        print(f"dpclip: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
