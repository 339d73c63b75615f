"""Reading what the stages wrote, in one place: every stage, the report, MLflow logging and the
benchmark read a stage's outputs through these functions (paths from :mod:`dpclip.layout`),
so no stage imports another stage to read its files."""

from __future__ import annotations

import json

import numpy as np

from dpclip.config import Params
from dpclip.errors import DpclipError
from dpclip.files import read_json
from dpclip.layout import Layout
from dpclip.run_keys import alpha_tag

POPULATION_SPLITS = {"public": ("shadow_train", "shadow_holdout"),
                     "shadow_train": ("shadow_train",), "shadow_holdout": ("shadow_holdout",)}


def load_split(layout: Layout, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, y, original record index) of one prepared split."""
    path = layout.split(name)
    if not path.exists():
        raise DpclipError(f"prepared split {str(path)!r} is missing: run the prepare stage first")
    with np.load(path) as f:
        return f["x"], f["y"], f["index"]


def load_partition(layout: Layout, alpha) -> dict:
    path = layout.partition(alpha_tag(alpha)) / "partition.json"
    if not path.exists():
        raise DpclipError(f"partition {str(path)!r} is missing: run the partition stage for "
                          f"alpha={alpha!r} first")
    record = json.loads(path.read_text())
    positions = np.asarray(record["positions"], dtype=np.int64)
    if len(np.unique(positions)) != len(positions):
        raise DpclipError(f"partition {str(path)!r} repeats a record: refusing to train on it")
    record["positions"] = positions
    return record


def architecture(params: Params, meta: dict) -> dict:
    """What a risk file must match: the model family, widths, input and output sizes."""
    return {"model": params.train.model, "hidden": list(params.train.hidden),
            "feature_shape": list(meta["feature_shape"]), "n_classes": int(meta["n_classes"])}


def load_risk(layout: Layout, params: Params, meta: dict, layer_names: list[str]) -> dict:
    """The risk file, checked against the model about to be trained (before any training)."""
    path = layout.shadow_risk
    if not path.exists():
        raise DpclipError(f"lm_dp_sgd needs the shadow stage's risk file {str(path)!r}: run "
                          f"`dpclip shadow` first")
    risk = read_json(path)
    expected = architecture(params, meta)
    if risk.get("architecture") != expected:
        raise DpclipError(f"the risk file {str(path)!r} was computed for the architecture "
                          f"{risk.get('architecture')}, but train.* describes {expected}: "
                          f"rerun `dpclip shadow`")
    if list(risk.get("layer_names", [])) != list(layer_names):
        raise DpclipError(f"the risk file {str(path)!r} names the layers "
                          f"{risk.get('layer_names')}, but the model has {layer_names}")
    return risk


def public_population(params: Params, layout: Layout) -> tuple[np.ndarray, np.ndarray]:
    """The public records of ``attack.population`` (offline pool and RMIA population)."""
    parts = [load_split(layout, name)[:2] for name in POPULATION_SPLITS[params.attack.population]]
    return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])


def population_source(params: Params) -> str:
    """Where RMIA's population comes from under the current ``attack`` settings (the
    reference record's ``population``; evaluate checks its signals against it)."""
    if params.attack.mode == "online":
        return "target_holdout"
    return f"public ({' + '.join(POPULATION_SPLITS[params.attack.population])})"


def load_signals(layout: Layout, run: str) -> dict | None:
    """The run's reference signals (``signals.npz``: docs/attacks.md, "Reference models,
    trained like the target") and, as ``facts``, its ``reference.json``; None when it has none."""
    path = layout.references(run) / "signals.npz"
    if not path.exists():
        return None
    with np.load(path) as signals:
        arrays = {name: signals[name] for name in signals.files}
    return {**arrays, "facts": read_json(layout.references(run) / "reference.json")}
