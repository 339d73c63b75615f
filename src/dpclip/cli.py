"""The ``dpclip`` command: one subcommand per stage (what dvc.yaml calls).

Every subcommand validates ``params.yaml`` first; a bad value stops it before any work with one
message naming the key and the value, and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from pathlib import Path

from dpclip.config import json_schema, load_params
from dpclip.errors import DpclipError
from dpclip.io import write_json
from dpclip.layout import Layout
from dpclip.naming import configured_runs, parse_scalar, run_name


RUN_OPTIONS = ("method", "epsilon", "alpha", "seed")


def _run_args(p: argparse.ArgumentParser) -> None:
    """One run's options: all four name one run; none means every configured run that is not
    up to date (one process for all, dpclip.provenance)."""
    p.add_argument("--method")
    p.add_argument("--epsilon", help="target epsilon, as in params.yaml")
    p.add_argument("--alpha", help="'iid' or a Dirichlet alpha")
    p.add_argument("--seed", type=int)
    p.add_argument("--force", action="store_true",
                   help="without run options: also the runs that are up to date")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpclip", description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml", help="parameter file")
    parser.add_argument("--root", default=".", help="project folder (inputs and outputs)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("validate", help="check params.yaml and exit")
    schema = sub.add_parser("schema", help="the JSON schema of params.yaml (for editors)")
    schema.add_argument("--out", help="write it to this file (default: standard output)")
    sub.add_parser("prepare", help="build the target and shadow splits")
    partition = sub.add_parser("partition", help="Dirichlet label skew for one alpha")
    partition.add_argument("--alpha", required=True, help="'iid' or a Dirichlet alpha")
    sub.add_parser("shadow", help="per-layer MIA risk from a shadow model on public data")
    sub.add_parser("tune", help="the same number of hyperparameter trials for every method "
                                "and target epsilon, on public data (tune.trials)")
    _run_args(sub.add_parser("train", help="train one run, or every run that is not up to "
                                           "date"))
    _run_args(sub.add_parser("audit", help="one-run privacy audit (lower bound on epsilon) of "
                                           "one run, or of every run that is not up to date"))
    _run_args(sub.add_parser("reference", help="the reference models of LiRA and RMIA for one "
                                               "run, or for every run that is not up to date"))
    _run_args(sub.add_parser("evaluate", help="evaluate one trained run, or every run that is "
                                              "not up to date"))
    bench = sub.add_parser("bench", help="median step time and peak memory of each method, "
                                         "as ratios to the non-private step, Opacus's ghost "
                                         "clipping and dp_sgd (needs `dpclip prepare`)")
    bench.add_argument("--methods", nargs="*", help="default: train.methods")
    bench.add_argument("--models", nargs="*", choices=["mlp", "cnn", "paper_cnn"],
                       help="one table per model (default: train.model)")
    bench.add_argument("--hidden", nargs="*", type=int, help="default: train.hidden")
    bench.add_argument("--batch-size", type=int, help="default: train.batch_size")
    bench.add_argument("--steps", type=int, default=10, help="steps per method per round")
    bench.add_argument("--rounds", type=int, default=5)
    bench.add_argument("--profile", action="store_true",
                       help="also time each part of dp_sgd's step (forward, output gradients, "
                            "per-sample norms, scaling, weighted sum, noise, optimizer)")
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
    ver = sub.add_parser("verify", help="compare this run's summaries with a commit's, per "
                                        "metric within stated tolerances (exit 1 if any differs)")
    ver.add_argument("--against", default="HEAD", help="the revision (default HEAD)")
    rep = sub.add_parser("report", help="comparison table, figures, MLflow record")
    rep.add_argument("--no-track", action="store_true", help="skip MLflow logging")
    return parser


# each stage function's module, imported when its command runs (a command loads one stage)
STAGE_MODULES = {"train_all": "train", "audit_all": "audit", "reference_all": "reference",
                 "evaluate_all": "evaluate"}


def _stage(function: str):
    """The stage function ``function`` (``prepare``, ``train_all``, ...) from its module."""
    module = importlib.import_module(f"dpclip.stages.{STAGE_MODULES.get(function, function)}")
    return getattr(module, function)


def _load(module: str, name: str):
    """``name`` from ``module``, imported by name when a command needs it: what a stage's
    command executes is what dvc.yaml lists as its code (dpclip.code_closure follows imports,
    not names), so the code of the other commands (bench, verify, preset, ...) makes no stage
    stale."""
    return getattr(importlib.import_module(module), name)


def _tool(command: str):
    """The function of a command that is no pipeline stage (:mod:`dpclip.commands`)."""
    return _load("dpclip.commands", command)


def _check_choice(key: str, value, allowed: list) -> None:
    if value not in allowed:
        raise DpclipError(f"{key}: {value!r} is not in params.yaml ({allowed})")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("opacus").setLevel(logging.WARNING)  # per-layer mode notes at INFO
    if args.command == "schema":  # needs no (valid) params.yaml
        return _schema(args.out)
    if args.command == "preset":  # reads params.yaml under its own overlays
        return _tool("preset")(args)
    if args.command == "evidence":  # reads the preset runs, not params.yaml
        return _tool("evidence")(args)
    if args.command == "compare":  # reads DVC's experiments, not params.yaml
        return _tool("compare")(args)
    try:
        params = load_params(args.params)
        layout = Layout(Path(args.root))
        return _dispatch(args, params, layout)
    except DpclipError as exc:
        print(f"dpclip: error: {exc}", file=sys.stderr)
        return 2


def _schema(out: str | None) -> int:
    import json

    if out:
        write_json(Path(out), json_schema())
        print(f"JSON schema of params.yaml written to {out}")
    else:
        print(json.dumps(json_schema(), indent=2))
    return 0


def _dispatch(args, params, layout) -> int:
    if args.command == "validate":
        print("params.yaml is valid")
        return 0
    if args.command == "prepare":
        meta = _stage("prepare")(params, layout)
        print(f"prepared {meta['dataset']}: {meta['sizes']}")
        return 0
    if args.command == "shadow":
        rec = _stage("shadow")(params, layout, progress=not args.quiet)
        if not rec.get("needed", True):
            print(f"no shadow model: {rec['reason']}")
            return 0
        risks = ", ".join(f"{n} {v['error_rate']:.3f}" for n, v in rec["layers"].items())
        kept = "up to date, kept: " if rec.get("kept") else ""
        print(f"shadow model ({kept}holdout accuracy {rec['shadow_accuracy']:.4f}): per-layer "
              f"MIA error rate ({rec['risk_eval']}): {risks}")
        return 0
    if args.command == "tune":
        rec = _stage("tune")(params, layout, progress=not args.quiet)
        print(_tuning_summary(rec))
        return 0
    if args.command in ("bench", "verify"):
        return _tool(args.command)(args, params, layout)
    if args.command == "report":
        result = _stage("report")(params, layout, track=not args.no_track)
        print((layout.reports / "summary.txt").read_text(), end="")
        print(f"Every column of every run: {layout.reports / 'comparison.md'}")
        if result.mlflow:
            print(_load("dpclip.tracking", "describe")(result.mlflow))
        return 0
    if args.command == "partition":
        alpha = parse_scalar(args.alpha)
        _check_choice("partition.alphas", alpha, params.partition.alphas)
        rec = _stage("partition")(params, alpha, layout)
        print(f"partition {rec['tag']}: {rec['size']} records, histogram {rec['histogram']}")
        return 0
    given = [name for name in RUN_OPTIONS if getattr(args, name) is not None]
    if given:
        return _one_run(args, params, layout, given)
    runs = configured_runs(params)
    if args.command == "train":
        done = _stage("train_all")(params, layout, progress=not args.quiet, force=args.force)
    else:
        # only this command's stage is imported: its command executes no other stage's code
        done = _stage(f"{args.command}_all")(params, layout, force=args.force)
    for i, (key, result) in enumerate(done, 1):
        line = "up to date" if result is None else _summary(args.command, result)
        print(f"[{i}/{len(runs)}] {key.name}: {line}", flush=True)
    return 0


def _one_run(args, params, layout, given: list[str]) -> int:
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
    if args.command == "train":
        result = _stage("train")(params, args.method, epsilon, alpha, args.seed, layout,
                              progress=not args.quiet)
    else:
        result = _stage(args.command)(params, args.method, epsilon, alpha, args.seed, layout)
    name = run_name(args.method, epsilon, alpha, args.seed)
    print(f"{name}: {_summary(args.command, result)}")
    return 0


def _tuning_summary(record: dict) -> str:
    """One line per tuned (method, epsilon): the default's and the tuned accuracy, the values."""
    if not record["trials"]:
        return "tune.trials is 0: no search; training uses the values in params.yaml"
    lines = [f"{record['trials']} trials each ({record['sampler']}, seed {record['seed']}), "
             f"objective: {record['objective']}"]
    for method, by_eps in record["runs"].items():
        for tag, e in by_eps.items():
            values = ", ".join(f"{k.split('.')[-1]}={v:.4g}" for k, v in e["values"].items())
            default = "refused" if e["default_accuracy"] is None else \
                f"{e['default_accuracy']:.4f}"
            lines.append(f"{method} {tag}: accuracy {e['accuracy']:.4f} (params.yaml's "
                         f"values: {default}) with {values}")
    return "\n".join(lines)


def _summary(command: str, result: dict) -> str:
    """One line on a trained run's record or an evaluated run's metrics."""
    if command == "audit":
        return "; ".join(
            f"{kind} " + (f"eps >= {r['epsilon_lower_bound']:.3f} (claimed "
                          f"{r['claimed_epsilon']:.3f}{', REFUTED' if r['violated'] else ''})"
                          if r["applicable"] else f"not applicable ({r['reason']})")
            for kind, r in result.items())
    if command == "reference":
        first = result["models"][0] if result["models"] else {}
        return (f"{result['references']} {result['mode']} reference models of "
                f"{first.get('n_train')} records each (the target: "
                f"{result['target_plan']['n_train']}), q={result['target_plan']['sample_rate']:.4g},"
                f" {result['target_plan']['steps']} steps, from {result['pool_size']} records "
                f"({result['pool']})")
    if command == "train":
        eps = result["privacy"]["epsilon"]
        eps_text = "inf" if eps is None else f"{eps:.3f}"
        return f"epsilon={eps_text}, {result['time']['train_s']:.1f} s"
    ir = result["mia"].get("ir")
    peak = f" peak_ir_mia={ir['peak_accuracy']:.4f} ({ir['peak_layer']})" if ir else ""
    return (f"accuracy={result['utility']['accuracy']:.4f} ece={result['utility']['ece']:.4f} "
            f"mia_auc={result['mia']['loss']['auc']:.4f}{peak}")


if __name__ == "__main__":
    sys.exit(main())
