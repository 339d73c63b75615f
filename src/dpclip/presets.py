"""Paper presets: parameter overlays that reproduce a paper's setting as closely as this
machine allows (``presets/<name>.yaml``), run with ``dpclip preset NAME``.

A preset file holds ``description``, ``source`` (the paper and table), ``deviations`` (what
differs from the paper, and why), ``params`` (an overlay of params.yaml) and optionally
``variants`` (named overlays on top, e.g. one per clip threshold C, each its own pipeline run).
Each variant runs the same stage functions DVC runs, in order, in its own project folder
``results/presets/<name>/<variant>/`` (its merged ``params.yaml`` beside its outputs), so the
presets never touch the main pipeline's outputs. ``preset.json`` there records the deviations
and the wall time of each variant; :mod:`dpclip.evidence` reads the results.

``data.path`` values starting with ``../shared/datasets`` are resolved against ``--datasets``
(default: that folder beside the project), where the real MNIST, Fashion-MNIST, Adult and
Heart files are; nothing is downloaded or committed.
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from dpclip.config import load_params, with_overrides
from dpclip.errors import DpclipError
from dpclip.io import write_json, write_text
from dpclip.layout import Layout

PRESETS = Path("presets")
RESULTS = Path("results") / "presets"
DATASETS_PREFIX = "../shared/datasets"
SINGLE = "main"  # the variant name of a preset without variants


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


def _resolve_datasets(overlay: dict, datasets: Path) -> dict:
    data = dict(overlay.get("data") or {})
    for key in ("path", "shadow_path"):
        value = data.get(key)
        if isinstance(value, str) and value.startswith(DATASETS_PREFIX):
            data[key] = str(datasets / value[len(DATASETS_PREFIX):].lstrip("/"))
    return {**overlay, "data": data} if data else overlay


# reference models of a preset's LiRA / RMIA: fewer make the calibrated attacks a loose lower
# bound of what they achieve (README, "LiRA and RMIA")
PRESET_MIN_REFERENCES = 8


def variant_params(preset: dict, variant: str, base: Path, datasets: Path) -> dict:
    """The raw parameters of one variant: params.yaml, the preset's overlay, the variant's.
    A preset that runs LiRA and RMIA uses at least :data:`PRESET_MIN_REFERENCES` reference
    models."""
    raw = yaml.safe_load(base.read_text())
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


def run_variant(raw: dict, root: Path, track: bool = False, progress: bool = True) -> float:
    """Write ``root/params.yaml`` and run every stage into ``root``; the wall time in s."""
    from dpclip import stages

    params_path = root / "params.yaml"
    root.mkdir(parents=True, exist_ok=True)
    write_text(params_path, yaml.safe_dump(raw, sort_keys=False))
    params = load_params(params_path)  # validated before any work
    layout = Layout(root)
    started = time.perf_counter()
    stages.prepare(params, layout)
    for alpha in params.partition.alphas:
        stages.partition(params, alpha, layout)
    stages.shadow(params, layout, progress=progress)
    stages.tune(params, layout, progress=progress)
    for step in (lambda: stages.train_all(params, layout, progress=progress),
                 lambda: stages.audit_all(params, layout),
                 lambda: stages.reference_all(params, layout),
                 lambda: stages.evaluate_all(params, layout)):
        for key, result in step():
            if progress and result is not None:
                print(f"  {key.name}", flush=True)
    stages.report(params, layout, track=track)
    return time.perf_counter() - started


def run_preset(name: str, *, variants: list[str] | None = None, project: Path = Path("."),
               datasets: Path | None = None, track: bool = False,
               progress: bool = True) -> dict:
    """Run the preset's variants (all by default); write and return ``preset.json``."""
    preset = load_preset(name, project / PRESETS)
    datasets = (datasets or (project / DATASETS_PREFIX)).resolve()  # the runs may move
    chosen = variants or list(preset.get("variants") or {SINGLE: {}})
    out = project / RESULTS / name
    record_path = out / "preset.json"
    record = {"name": name, "source": preset["source"], "description": preset["description"],
              "deviations": preset["deviations"], "variants": {}}
    if record_path.is_file():  # variants run earlier keep their times
        from dpclip.io import read_json

        record["variants"] = read_json(record_path).get("variants", {})
    for variant in chosen:
        if progress:
            print(f"preset {name}, variant {variant}", flush=True)
        raw = variant_params(preset, variant, project / "params.yaml", datasets)
        seconds = run_variant(raw, out / variant, track=track, progress=progress)
        record["variants"][variant] = {"wall_s": round(seconds, 1)}
        write_json(record_path, record)
    return record
