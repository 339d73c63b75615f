"""The ``dpclip`` command: one subcommand per pipeline stage, and the tools around them.

The stages' subcommands (what dvc.yaml calls) are built from their declarations
(:mod:`dpclip.catalog`); the tools that are no stage live in :mod:`dpclip.tools.commands`.

Every subcommand validates ``params.yaml`` first; a bad value stops it before any work with one
message naming the key and the value, and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from dpclip.config import BUILT_IN_MODELS
from dpclip.errors import DpclipError
from dpclip.files import write_json
from dpclip.layout import Layout
from dpclip.run_keys import RunKey, configured_runs, parse_scalar
from dpclip.pipeline.side_by_side import (JOBS_VARIABLE, configure_process, default_jobs,
                                          start_server)
from dpclip.catalog import BY_NAME, ONCE, PER_ALPHA, PER_RUN, STAGES, Stage


RUN_OPTIONS = ("method", "epsilon", "alpha", "seed")
# report's default: more workers would mostly wait for the store (SQLite takes one writer at a
# time); a choice, not a measurement
MOST_LOGGING_WORKERS = 4


def _stage_parser(sub, stage: Stage) -> None:
    """The subcommand of a declared stage: its scope's options and its own flags."""
    parser = sub.add_parser(stage.name, help=stage.help)
    if stage.scope == PER_ALPHA:
        parser.add_argument("--alpha", required=True, help="'iid' or a Dirichlet alpha")
    elif stage.scope == PER_RUN:
        _run_args(parser)
    elif stage.workers:  # report: the MLflow children
        parser.add_argument("--jobs", type=int, help="MLflow children logged side by side, "
                                                     "one worker process each (default: "
                                                     "$DPCLIP_JOBS, else one per CPU, at "
                                                     f"most {MOST_LOGGING_WORKERS})")
    for flag in stage.flags:
        parser.add_argument(flag.option, dest=flag.keyword, action="store_const",
                            const=flag.value, default=None, help=flag.help)


def _run_args(p: argparse.ArgumentParser) -> None:
    """One run's options: all four name one run; none means every configured run that is not
    up to date (one command for all, dpclip.pipeline.provenance; side by side in workers,
    dpclip.pipeline.side_by_side)."""
    p.add_argument("--method")
    p.add_argument("--epsilon", help="target epsilon, as in params.yaml")
    p.add_argument("--alpha", help="'iid' or a Dirichlet alpha")
    p.add_argument("--seed", type=int)
    p.add_argument("--force", action="store_true",
                   help="without run options: also the runs that are up to date")
    p.add_argument("--jobs", type=int, help="without run options: runs side by side, one "
                                            "worker process each (default: $DPCLIP_JOBS, "
                                            "else twice the CPUs in threads, at most one "
                                            "per CPU, and 1 on a GPU; each run keeps "
                                            "train.threads, so its numbers do not change)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpclip", description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml", help="parameter file")
    parser.add_argument("--root", default=".", help="project folder (inputs and outputs)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("validate", help="check params.yaml and exit")
    schema = sub.add_parser("schema", help="the JSON schema of params.yaml (for editors)")
    schema.add_argument("--out", help="write it to this file (default: standard output)")
    for stage in STAGES:  # one subcommand per declared stage
        _stage_parser(sub, stage)
    bench = sub.add_parser("bench", help="median step time and peak memory of each method, "
                                         "as ratios to the non-private step, Opacus's ghost "
                                         "clipping and dp_sgd (needs `dpclip prepare`)")
    bench.add_argument("--methods", nargs="*", help="default: train.methods")
    bench.add_argument("--models", nargs="*", choices=list(BUILT_IN_MODELS),
                       help="one table per model (default: train.model)")
    bench.add_argument("--hidden", nargs="*", type=int, help="default: train.hidden")
    bench.add_argument("--batch-size", type=int, help="default: train.batch_size")
    bench.add_argument("--steps", type=int, default=10, help="steps per method per round")
    bench.add_argument("--rounds", type=int, default=5)
    bench.add_argument("--epoch", action="store_true",
                       help="also time whole epochs (records per second) of non_private, "
                            "dp_sgd and Opacus's ghost clipping")
    bench.add_argument("--no-memory", action="store_true",
                       help="skip the peak-memory subprocesses (faster)")
    preset = sub.add_parser("preset", help="run a paper preset (presets/NAME.yaml) into "
                                           "results/presets/NAME/")
    preset.add_argument("name", nargs="?", help="omit to list the presets")
    preset.add_argument("--variant", action="append", help="only this variant (repeatable)")
    preset.add_argument("--datasets", help="folder of the real datasets, for $DATASETS in "
                                           "the presets' data.path (default: datasets/ in "
                                           "the project)")
    preset.add_argument("--track", action="store_true", help="also log to MLflow")
    preset.add_argument("--seeds", type=int, help="seeds 0 .. N-1 instead of the preset's")
    preset.add_argument("--jobs", type=int, help="variants run side by side, one process "
                                                 "each (default: one per CPU)")
    preset.add_argument("--params-only", action="store_true",
                        help="write each variant's params.yaml and print the commands that run "
                             "it with the Prefect flow (on Dask), without running anything")
    preset.add_argument("--power-budget", type=float, metavar="MINUTES",
                        help="run the seeds the preset's claims need at 80%% power, within "
                             "this much wall time (starting with --seeds, default 6)")
    ev = sub.add_parser("evidence", help="the verdict report: each paper claim "
                                         "(presets/claims.yaml) against the preset runs")
    ev.add_argument("--results", default="results/presets", help="the preset runs' folder")
    ev.add_argument("--out", default="reports/evidence.md", help="Markdown (HTML beside it)")
    cmp = sub.add_parser("compare", help="DVC experiments side by side: one row per run and "
                                         "experiment (a table that fits a terminal)")
    cmp.add_argument("experiments", nargs="*", metavar="EXP",
                     help="experiment names or revisions (default: the baseline, its "
                          "experiments and the workspace when it differs)")
    cmp.add_argument("--rev", action="append", help="baseline commit(s), as dvc exp show "
                                                    "--rev (default HEAD)")
    cmp.add_argument("-n", "--num", type=int, default=1,
                     help="experiments of this many commits back (dvc exp show -n)")
    cmp.add_argument("--only-changed", action="store_true",
                     help="only runs whose numbers differ between the experiments")
    adv = sub.add_parser("advise", help="which DP method for your data and budget: train the "
                                        "candidates over the seeds the paired test needs and "
                                        "print the ranked answer with intervals")
    adv.add_argument("--methods", nargs="*", help="the candidates (default: train.methods; "
                                                  "dp_sgd is always the baseline)")
    adv.add_argument("--seeds", type=int, help="default: the fewest at which the accuracy "
                                               "comparison can reach 5%% after Holm")
    adv.add_argument("--out", default="advice", help="its project folder, under --root "
                                                     "(runs there are reused)")
    adv.add_argument("--rank-on", default="auto", choices=("auto", "public", "holdout"),
                     help="the accuracy the ranking reads: the public holdout (reads no "
                          "private record), the members' private holdout, or auto: public "
                          "where every run has it")
    ver = sub.add_parser("verify", help="compare this run's summaries with a commit's, per "
                                        "metric within stated tolerances (exit 1 if any differs)")
    ver.add_argument("--against", default="HEAD", help="the revision (default HEAD)")
    return parser


def _load(module: str, name: str):
    """``name`` from ``module``, imported by name when a command needs it: what a stage's
    command executes is what dvc.yaml lists as its code (dpclip.code_closure follows imports,
    not names), so the code of the other commands (bench, verify, preset, ...) makes no stage
    stale."""
    return getattr(importlib.import_module(module), name)


def _tool(command: str):
    """The function of a command that is no pipeline stage (:mod:`dpclip.tools.commands`)."""
    return _load("dpclip.tools.commands", command)


def _check_choice(key: str, value, allowed: list) -> None:
    if value not in allowed:
        raise DpclipError(f"{key}: {value!r} is not in params.yaml ({allowed})")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_process()
    if args.command == "schema":  # needs no (valid) params.yaml
        return _schema(args.out)
    try:
        # preset reads params.yaml under its own overlays, evidence the preset runs, compare
        # DVC's experiments: none reads params.yaml here
        if args.command in ("preset", "evidence", "compare"):
            return _tool(args.command)(args)
        if _side_by_side_jobs(args, *_threads_and_device_as_written(args.params)) > 1:
            start_server(BY_NAME[args.command].workers)  # its imports beside this process's
        # by name: validating every family's sections (every method's options, ...) refuses
        # bad input and fills in defaults that only the stages running that family read, and
        # import; so that code is no dependency of the stages that run none of it
        params = _load("dpclip.pipeline.params", "load_params")(args.params)
        layout = Layout(Path(args.root))
        return _dispatch(args, params, layout)
    except DpclipError as exc:
        print(f"dpclip: error: {exc}{_after_a_failed_experiment()}", file=sys.stderr)
        return 2


def _after_a_failed_experiment() -> str:
    """Under ``dvc exp run`` in the workspace, DVC wrote the experiment's ``-S`` values into
    params.yaml and leaves them there when a stage fails: say how to put things back. Not for
    a temporary or queued experiment (DVC runs those in a copy under .dvc/tmp/exps)."""
    if not os.environ.get("DVC_EXP_NAME") or ".dvc/tmp/exps" in Path.cwd().as_posix():
        return ""
    return ("\n(dvc exp run wrote its -S values into params.yaml and leaves them there when a "
            "stage fails: `git checkout -- params.yaml` puts the committed values back, and "
            "`dvc checkout` the committed outputs)")


def _schema(out: str | None) -> int:
    import json

    if out:
        write_json(Path(out), _load("dpclip.pipeline.params", "json_schema")())
        print(f"JSON schema of params.yaml written to {out}")
    else:
        print(json.dumps(_load("dpclip.pipeline.params", "json_schema")(), indent=2))
    return 0


def _dispatch(args, params, layout) -> int:
    if args.command == "validate":
        print(f"{args.params} is valid")
        return 0
    if args.command in ("bench", "verify", "advise"):
        return _tool(args.command)(args, params, layout)
    return run_stage(BY_NAME[args.command], args, params, layout)


def run_stage(stage: Stage, args, params, layout) -> int:
    """Run one declared stage as its subcommand asks (:mod:`dpclip.runner`); print
    what its ``describe`` says. Only this stage's module is imported: its command executes no
    other stage's code."""
    runner = importlib.import_module("dpclip.runner")  # its code: dpclip.pipeline.dvc_yaml
    describe = runner.stage_module(stage).describe
    options = runner.stage_options(stage, not args.quiet, **{
        flag.keyword: getattr(args, flag.keyword) for flag in stage.flags
        if getattr(args, flag.keyword) is not None})
    if stage.scope == ONCE:
        if stage.workers:
            options["jobs"] = _side_by_side_jobs(args, params.train.threads, params.train.device)
        print(describe(runner.run_once(stage, params, layout, **options), layout))
        return 0
    if stage.scope == PER_ALPHA:
        alpha = parse_scalar(args.alpha)
        _check_choice("partition.alphas", alpha, params.partition.alphas)
        print(describe(runner.run_for_alpha(stage, params, alpha, layout), layout))
        return 0
    given = [name for name in RUN_OPTIONS if getattr(args, name) is not None]
    if given:
        key = _one_run(args, params, given)
        result, why = runner.run_one(stage, params, key, layout, force=True, **options)
        print(f"{key.name}: {why or describe(result, layout)}")
        return 0
    runs = configured_runs(params)
    jobs = _side_by_side_jobs(args, params.train.threads, params.train.device)
    done = runner.run_every(stage, params, layout, force=args.force, jobs=jobs, **options)
    for i, (key, result) in enumerate(done, 1):
        line = "up to date" if result is None else describe(result, layout)
        print(f"[{i}/{len(runs)}] {key.name}: {line}", flush=True)
    return 0


def _side_by_side_jobs(args, threads: int | None, device: str) -> int:
    """How many runs a per-run stage's command runs side by side (1: none, or one run named),
    or how many MLflow children ``report`` logs side by side (1: none, or ``--no-track``):
    ``--jobs``, else :func:`~dpclip.pipeline.side_by_side.default_jobs` for the runs'
    ``train.threads`` and ``train.device`` (report: one thread each on the CPU, at most
    :data:`MOST_LOGGING_WORKERS`)."""
    if getattr(args, "jobs", None) is not None and args.jobs < 1:
        raise DpclipError(f"--jobs: {args.jobs} must be at least 1")
    stage = BY_NAME.get(args.command)
    if stage is None or not stage.workers or getattr(args, "track", None) is False or \
            any(getattr(args, name, None) is not None for name in RUN_OPTIONS):
        return 1
    if args.jobs is not None:
        return args.jobs
    if stage.scope != PER_RUN:  # report's children: one thread of logging each, on the CPU
        jobs = default_jobs(1, "cpu")  # $DPCLIP_JOBS as given, else one per CPU, capped
        return jobs if os.environ.get(JOBS_VARIABLE, "").strip() else \
            min(jobs, MOST_LOGGING_WORKERS)
    return default_jobs(threads, device)


def _threads_and_device_as_written(path: str) -> tuple[int | None, str]:
    """params.yaml's ``train.threads`` and ``train.device`` as written, the schema's defaults
    where it gives none: read before torch is imported, to start the workers' fork server
    early (the validation that follows reports a bad file)."""
    import yaml

    from dpclip.config import TrainParams

    fields = TrainParams.model_fields
    threads, device = fields["threads"].default, fields["device"].default
    try:
        train = (yaml.safe_load(Path(path).read_text()) or {}).get("train") or {}
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        return threads, device
    written = train.get("threads", threads) if isinstance(train, dict) else threads
    written_device = train.get("device", device) if isinstance(train, dict) else device
    # a value the validation would convert or refuse ("2", "two") counts as not given here
    return (written if written is None or type(written) is int else threads,
            written_device if isinstance(written_device, str) else device)


def _one_run(args, params, given: list[str]) -> RunKey:
    """The run the four run options name, each checked against params.yaml."""
    missing = [f"--{name}" for name in RUN_OPTIONS if name not in given]
    if missing:
        raise DpclipError(f"{args.command}: one run needs --method, --epsilon, --alpha and "
                          f"--seed (missing {', '.join(missing)}); give none of them for every "
                          f"configured run")
    alpha, epsilon = parse_scalar(args.alpha), parse_scalar(args.epsilon)
    _check_choice("partition.alphas", alpha, params.partition.alphas)
    _check_choice("train.methods", args.method, params.train.methods)
    _check_choice("privacy.target_epsilons", epsilon, params.privacy.target_epsilons)
    _check_choice("train.seeds", args.seed, params.train.seeds)
    return RunKey(args.method, epsilon, alpha, args.seed)


if __name__ == "__main__":
    sys.exit(main())
