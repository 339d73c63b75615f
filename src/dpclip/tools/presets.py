"""Paper presets: parameter overlays that reproduce a paper's setting as closely as this
machine allows (``presets/<name>.yaml``), run with ``dpclip preset NAME``. Each variant runs
the stage functions DVC runs in its own folder ``results/presets/<name>/<variant>/``, side by
side (``jobs``), with :data:`PRESET_THREADS` torch thread unless the preset sets
``train.threads``; ``data.path`` values starting with :data:`DATASETS_PREFIX` are resolved
against ``--datasets``. The file's keys and why one thread: docs/tuning.md, "Paper presets".
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import yaml

from dpclip.config import with_overrides
from dpclip.errors import DpclipError
from dpclip.files import read_json, write_json, write_text
from dpclip.tools.folder_run import run_in_folder
from dpclip.pipeline.params import load_params, parse_params
from dpclip.reporting.evidence import INCONCLUSIVE, evidence
from dpclip.reporting.seed_stats import minimum_exact_seeds
from dpclip.pipeline.side_by_side import cpu_count, default_jobs as side_by_side_jobs

PRESETS = Path("presets")
RESULTS = Path("results") / "presets"
DATASETS_PREFIX = "$DATASETS"  # data.path: $DATASETS/mnist -> <--datasets>/mnist
DEFAULT_DATASETS = "datasets"
SINGLE = "main"  # the variant name of a preset without variants
PRESET_THREADS = 1  # torch threads of every preset run (a preset's train.threads wins)


def available_presets(folder: Path = PRESETS) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.yaml") if p.stem != "claims")


def load_preset(name: str, folder: Path = PRESETS) -> dict:
    path = folder / f"{name}.yaml"
    if not path.is_file():
        raise DpclipError(f"preset {name!r} does not exist: {available_presets(folder)} are "
                          f"in {folder}/")
    preset = yaml.safe_load(path.read_text()) or {}
    missing = [k for k in ("description", "source", "deviations", "params") if k not in preset]
    if missing:
        raise DpclipError(f"{path}: missing {missing}")
    return preset


TUNED_KEYS = ("train.lr", "train.clip_norm")  # what a tuning preset hands a preset it tunes


def tuned_values(name: str, variant: str, project: Path = Path(".")) -> dict[str, float]:
    """DP-SGD's values that preset ``name``'s ``dpclip tune`` chose for ``variant``, as its
    committed ``reports/tuning.csv`` states them (4 significant digits)."""
    import pandas as pd

    path = project / RESULTS / name / variant / "reports" / "tuning.csv"
    if not path.is_file():
        raise DpclipError(f"tuned_by: {name!r} has no tuning results for variant {variant!r} "
                          f"({path} is missing): run `dpclip preset {name}` first")
    rows = pd.read_csv(path)
    row = rows[rows["method"] == "dp_sgd"]
    if len(row) != 1:
        raise DpclipError(f"{path}: no single dp_sgd row to take the values from")
    pairs = (item.split(" = ") for item in str(row["values"].iloc[0]).split(", "))
    return {key: float(value) for key, value in pairs}


def tuning_problems(preset: dict, project: Path = Path(".")) -> list[str]:
    """Why a preset that trains with another preset's tuned values (``tuned_by: NAME``) may not
    run: its data section must be the tuning preset's (the public records the values were
    chosen on are then neither its members nor its test records: with Fashion-MNIST set as
    public data, the same fractions put them among the test records), and each variant's
    learning rate and C must be the values chosen for the variant of the same name."""
    source = preset.get("tuned_by")
    if source is None:
        return []
    tuning = load_preset(source, project / PRESETS)
    problems = []
    if preset["params"].get("data") != tuning["params"].get("data"):
        problems.append(f"tuned_by {source!r}: the data section differs from {source!r}'s, so "
                        f"its tuning records may be this preset's members or test records")
    for variant, overlay in (preset.get("variants") or {}).items():
        if "data" in overlay:
            problems.append(f"tuned_by {source!r}: variant {variant!r} changes the data section")
        train = {**preset["params"].get("train", {}), **overlay.get("train", {})}
        for key, value in tuned_values(source, variant, project).items():
            if key not in TUNED_KEYS:
                continue
            given = train.get(key.removeprefix("train."))
            if given != value:
                problems.append(f"tuned_by {source!r}: variant {variant!r} has {key} {given!r}, "
                                f"not the tuned {value:g}")
    return problems


def _resolve_datasets(overlay: dict, datasets: Path) -> dict:
    data = dict(overlay.get("data") or {})
    for key in ("path", "shadow_path"):
        value = data.get(key)
        if isinstance(value, str) and value.startswith(DATASETS_PREFIX):
            data[key] = str(datasets / value[len(DATASETS_PREFIX):].lstrip("/"))
    return {**overlay, "data": data} if data else overlay


# reference models of a preset's LiRA / RMIA: fewer make the calibrated attacks a loose lower
# bound of what they achieve (docs/attacks.md, "LiRA and RMIA")
PRESET_MIN_REFERENCES = 8


def variant_params(preset: dict, variant: str, base: Path, datasets: Path) -> dict:
    """The raw parameters of one variant: params.yaml with :data:`PRESET_THREADS` torch
    threads, the preset's overlay, the variant's. A preset that runs LiRA and RMIA uses at least
    :data:`PRESET_MIN_REFERENCES` reference models."""
    raw = with_overrides(yaml.safe_load(base.read_text()),
                         {"train": {"threads": PRESET_THREADS}})
    raw = with_overrides(raw, _resolve_datasets(preset["params"], datasets))
    variants = preset.get("variants") or {}
    if variant != SINGLE:
        if variant not in variants:
            raise DpclipError(f"preset variant {variant!r} is not one of {list(variants)}")
        raw = with_overrides(raw, _resolve_datasets(variants[variant], datasets))
    references = (raw.get("attack") or {}).get("references", 0)
    if isinstance(references, int) and 0 < references < PRESET_MIN_REFERENCES:
        raise DpclipError(f"preset variant {variant!r}: attack.references: {references} is too "
                          f"few for evidence: a preset with LiRA and RMIA uses at least "
                          f"{PRESET_MIN_REFERENCES} (or 0: off)")
    return raw


def write_variants(name: str, *, project: Path = Path("."), datasets: Path | None = None,
                   variants: list[str] | None = None, seeds: int | None = None) -> list[Path]:
    """Write each variant's merged ``params.yaml`` into its folder without running anything:
    each folder is then an ordinary project root, which the Prefect flow runs on Dask
    (``python -m flows.pipeline --params F/params.yaml --root F --workers N``, or
    ``--dask-address``). Returns the folders."""
    preset = load_preset(name, project / PRESETS)
    datasets = (datasets or (project / DEFAULT_DATASETS)).resolve()
    folders = []
    for variant in variants or list(preset.get("variants") or {SINGLE: {}}):
        raw = variant_params(preset, variant, project / "params.yaml", datasets)
        if seeds is not None:
            raw = with_overrides(raw, {"train": {"seeds": list(range(seeds))}})
        root = project / RESULTS / name / variant
        root.mkdir(parents=True, exist_ok=True)
        write_text(root / "params.yaml", yaml.safe_dump(raw, sort_keys=False))
        load_params(root / "params.yaml")  # validated as a run would
        folders.append(root)
    return folders


def run_preset(name: str, *, variants: list[str] | None = None, project: Path = Path("."),
               datasets: Path | None = None, track: bool = False, progress: bool = True,
               seeds: int | None = None, jobs: int | None = None) -> dict:
    """Run the preset's variants (all by default), with seeds 0 .. ``seeds`` - 1 instead of the
    preset's own when given, ``jobs`` variants at a time in processes of their own (default:
    one per CPU); write and return ``preset.json``. Runs already done are not run
    again (the per-run provenance), so more seeds only train the new ones. A variant that fails
    stops no other: the others finish and are recorded, then the first failure is raised."""
    asked = jobs
    jobs = cpu_count() if jobs is None else jobs
    if jobs < 1:
        raise DpclipError(f"--jobs: {jobs} must be at least 1")
    preset = load_preset(name, project / PRESETS)
    problems = tuning_problems(preset, project)
    if problems:
        raise DpclipError(f"preset {name!r}: " + "; ".join(problems))
    datasets = (datasets or (project / DEFAULT_DATASETS)).resolve()  # the runs may move
    chosen = variants or list(preset.get("variants") or {SINGLE: {}})
    out = project / RESULTS / name
    record_path = out / "preset.json"
    record = {"name": name, "source": preset["source"], "description": preset["description"],
              "deviations": preset["deviations"], "variants": {}}
    if record_path.is_file():  # variants run earlier keep their times; a power record is
        # rewritten by seeds_by_power alone (another number of seeds would make it stale)
        record["variants"] = read_json(record_path).get("variants", {})
    raws = {}
    for variant in chosen:  # every variant's parameters are checked before any runs
        raw = variant_params(preset, variant, project / "params.yaml", datasets)
        if seeds is not None:
            raw = with_overrides(raw, {"train": {"seeds": list(range(seeds))}})
        raws[variant] = raw
        parse_params(raws[variant])

    def finished(variant: str, seconds: float) -> None:
        if record_path.is_file():  # another process may have run other variants meanwhile
            record["variants"] = {**record["variants"],
                                  **read_json(record_path).get("variants", {})}
        earlier = record["variants"].get(variant, {})
        # wall_s: this call's; wall_s_total: every call's (runs done before are not run again)
        total = earlier.get("wall_s_total", earlier.get("wall_s", 0.0)) + seconds
        record["variants"][variant] = {"wall_s": round(seconds, 1),
                                       "wall_s_total": round(total, 1),
                                       "seeds": len(raws[variant]["train"]["seeds"]),
                                       "devices": _devices(out / variant)}
        write_json(record_path, record)

    if len(chosen) == 1 or jobs == 1:
        for variant in chosen:
            if progress:
                print(f"preset {name}, variant {variant}", flush=True)
            finished(variant, run_in_folder(raws[variant], out / variant, track=track,
                                          progress=progress,
                                          jobs=_runs_at_once(raws[variant], asked, chosen)))
    else:
        jobs = min(jobs, len(chosen))
        _run_side_by_side(name, raws, out, jobs, track, progress, finished)
    return {k: v for k, v in record.items() if v is not None}


def _runs_at_once(raw: dict, asked: int | None, chosen: list[str]) -> int:
    """A variant run alone (one chosen) has nothing beside it: its runs go side by side
    instead, ``--jobs`` at a time, else as the per-run stages' commands would (one per CPU
    with the presets' one thread, one on a GPU); variants run one after another with
    ``--jobs 1`` keep their runs in one process."""
    if len(chosen) > 1:
        return 1
    if asked is not None:
        return asked
    train = raw.get("train") or {}
    return side_by_side_jobs(train.get("threads", PRESET_THREADS), train.get("device", "auto"))


PROGRESS_LOG = "preset.log"  # in a variant's folder: its progress when run side by side


def _run_variant_logged(raw: dict, root: Path, track: bool, progress: bool) -> float:
    """:func:`~dpclip.tools.folder_run.run_in_folder` with its output (stage lines, progress bars) written to
    ``root/preset.log`` instead of the terminal it would share with the other variants."""
    import contextlib

    root.mkdir(parents=True, exist_ok=True)
    with open(root / PROGRESS_LOG, "w", buffering=1) as log, \
            contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        return run_in_folder(raw, root, track=track, progress=progress)


def _run_side_by_side(name: str, raws: dict, out: Path, jobs: int, track: bool,
                      progress: bool, finished) -> None:
    """Each variant in a process of its own, ``jobs`` at a time (spawned: no state of this
    process is shared); ``finished(variant, seconds)`` as each ends. Each variant's progress
    goes to its folder's ``preset.log``, since the bars would interleave on one terminal."""
    failures = []
    with ProcessPoolExecutor(max_workers=jobs,
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        if progress:
            print(f"preset {name}: {len(raws)} variants, {jobs} at a time, one process each; "
                  f"progress: tail -f {out}/*/{PROGRESS_LOG}", flush=True)
        futures = {pool.submit(_run_variant_logged, raw, out / variant, track, progress):
                   variant for variant, raw in raws.items()}
        for done, future in enumerate(as_completed(futures), 1):
            variant = futures[future]
            try:
                seconds = future.result()
            except Exception as exc:  # the other variants still finish and are recorded
                failures.append((variant, exc))
                print(f"preset {name}, variant {variant} failed: {exc}", flush=True)
                continue
            finished(variant, seconds)
            if progress:
                print(f"preset {name}, variant {variant}: {seconds:.0f} s ({done} of "
                      f"{len(raws)})", flush=True)
    if failures:
        variant, exc = failures[0]
        raise DpclipError(f"preset {name}, variant {variant}: {exc}") from exc


def _training_seconds(root: Path) -> float:
    """The training time of every run in a variant's folder, from the runs' timing files."""
    return sum(float(read_json(path).get("train_s") or 0.0)
               for path in sorted((root / "timings").glob("*.json")))


def _devices(root: Path) -> list[str]:
    """The devices the variant's runs trained on ("cpu", "cuda:0"), from their timing files:
    a GPU's numbers are not the CPU's (other summation orders, another noise stream)."""
    return sorted({str(read_json(path).get("device", "cpu"))
                   for path in (root / "timings").glob("*.json")})


def _needed(name: str, project: Path) -> int | None:
    """The most paired seeds an inconclusive claim on this preset needs (None: none does, or
    no estimate)."""
    wanted = [f.seeds_needed for f in evidence(project / PRESETS / "claims.yaml",
                                               project / RESULTS)
              if f.claim.get("preset") == name and f.verdict == INCONCLUSIVE]
    return max((n for n in wanted if n), default=None)


def seeds_by_power(name: str, budget_s: float, *, project: Path = Path("."),
                   first: int | None = None, **options) -> dict:
    """Run a preset with the seeds its claims need (``presets/claims.yaml``'s claims on it), within
    a budget of training time in seconds: ``first`` seeds (default: the exact test's minimum),
    then the most an inconclusive claim needs at 80% power
    (:func:`dpclip.reporting.seed_stats.seeds_needed`) as far as the budget affords, judged again;
    ``preset.json`` records what was needed, what ran and whether the budget capped it.
    docs/tuning.md, "Paper presets"."""
    seeds = first or minimum_exact_seeds()
    record = run_preset(name, project=project, seeds=seeds, **options)
    chosen = options.get("variants") or list(record["variants"])
    out = project / RESULTS / name
    needed = _needed(name, project)
    for _ in range(3):  # at most three rounds: each re-estimates the spread
        if needed is None:
            break  # decided, or no estimate: more seeds would not be targeted
        per_seed = sum(_training_seconds(out / v) for v in chosen) / seeds
        affordable = int(budget_s // per_seed) if per_seed > 0 else seeds
        target = min(needed, max(affordable, seeds))
        if target <= seeds:
            break
        seeds = target
        record = run_preset(name, project=project, seeds=seeds, **options)
        needed = _needed(name, project) or needed  # a decided claim keeps the last estimate
    record["power"] = {"seeds": seeds, "seeds_needed": needed, "budget_s": budget_s,
                       "capped": bool(needed and needed > seeds)}
    write_json(out / "preset.json", record)
    return record
