"""The ``dpclip`` commands that are no pipeline stage: ``preset``, ``compare``, ``evidence``,
``advise``, ``bench`` and ``verify``. The CLI loads this module by name when one of them runs, so that no
stage's command executes (and no stage depends on) their code."""

from __future__ import annotations

from pathlib import Path

from dpclip.errors import DpclipError
from dpclip.run_keys import configured_runs


def preset(args) -> int:
    """``dpclip preset``: list the presets, or run one (its variants and seeds)."""
    from dpclip.tools.presets import (available_presets, load_preset, run_preset, seeds_by_power,
                                write_variants)

    root = Path(args.root)
    if not args.name:
        for name in available_presets(root / "presets"):
            print(f"{name}: {load_preset(name, root / 'presets')['source']}")
        return 0
    options = dict(variants=args.variant, project=root, track=args.track,
                   datasets=Path(args.datasets) if args.datasets else None,
                   progress=not args.quiet, jobs=args.jobs)
    if args.seeds is not None and args.seeds < 1:
        raise DpclipError(f"--seeds: {args.seeds} must be at least 1")
    if args.params_only:
        for folder in write_variants(args.name, project=root, seeds=args.seeds,
                                     variants=args.variant, datasets=options["datasets"]):
            print(f"python -m flows.pipeline --params {folder}/params.yaml --root {folder} "
                  f"--workers N   # or --dask-address tcp://HOST:8786")
        return 0
    if args.power_budget is not None:
        if args.power_budget <= 0:
            raise DpclipError(f"--power-budget: {args.power_budget:g} must be above 0 minutes")
        record = seeds_by_power(args.name, args.power_budget * 60, first=args.seeds, **options)
    else:
        record = run_preset(args.name, seeds=args.seeds, **options)
    for variant, facts in record["variants"].items():
        print(f"{args.name} {variant}: {facts['wall_s']:.0f} s -> results/presets/{args.name}/"
              f"{variant}/reports/comparison.md")
    return 0


def advise(args, params, layout) -> int:
    """``dpclip advise``: the ranked answer to "which method?" on the user's data."""
    from dpclip.tools.advise import run_advice

    print(run_advice(Path(args.params), layout.root / args.out, seeds=args.seeds,
                     methods=args.methods, progress=not args.quiet, rank_on=args.rank_on))
    return 0


def compare(args) -> int:
    """``dpclip compare``: DVC experiments side by side."""
    from dpclip.reporting.compare import compare_text, dvc_experiments, select

    experiments = select(dvc_experiments(Path(args.root), args.rev, args.num),
                         args.experiments)
    print(compare_text(experiments, args.only_changed))
    return 0


def evidence(args) -> int:
    """``dpclip evidence``: the verdict report on the claims."""
    from dpclip.reporting.evidence import write_evidence

    root = Path(args.root)
    command = "dpclip evidence" + ("" if args.out == "reports/evidence.md" else
                                   f" --out {args.out}")
    findings = write_evidence(root / "presets" / "claims.yaml", root / args.results,
                              root / args.out, command)
    for f in findings:
        print(f"{f.claim['id']}: {f.verdict} ({f.reason})")
    print(f"written to {args.out} and {Path(args.out).with_suffix('.html')}")
    return 0


def bench(args, params, layout) -> int:
    """``dpclip bench``: the step times of the methods (:mod:`dpclip.tools.bench`)."""
    from dpclip.tools.bench import bench as measure

    table = measure(params, layout, args.params, args.methods, args.steps, args.rounds,
                    args.models, args.hidden, args.batch_size, memory=not args.no_memory,
                    epoch=args.epoch)
    print(table.to_string(index=False))
    text = (layout.reports / "bench.md").read_text()
    if "\n## " in text:  # the epochs' and the parts' tables, as bench.md has them
        print(text[text.index("\n## "):])
    print(f"written to {layout.reports / 'bench.md'}")
    return 0


def verify(args, params, layout) -> int:
    """``dpclip verify``: a fresh run against the committed results."""
    from dpclip.reporting.verify import verify as compare_runs, verify_text

    checks = compare_runs([k.name for k in configured_runs(params)], layout, args.against)
    print(verify_text(checks, args.against, layout))
    return 0 if all(c.status in ("identical", "within tolerance") for c in checks) else 1
