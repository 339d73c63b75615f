"""prepare: raw data -> target train (members), target holdout (non-members, the utility test
set), shadow train and shadow holdout (public data for shadow models), stratified and seeded.

The shadow splits come from ``data.shadow_dataset`` when one is set (refused when it is the main
data: :mod:`dpclip.data.public`). Preprocessing sees public data only: fixed scaling for
images, a :class:`~dpclip.data.CsvEncoder` fitted on the public shadow_train rows for a CSV.
See docs/adding-a-dataset.md, "What the prepare stage does with it".
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np

from dpclip.config import Params
from dpclip.data import CsvTable, Dataset, fit_encoder, read_source
from dpclip.data.public import refuse_same_content, refuse_same_source
from dpclip.data.sources import dataset_label, options_of
from dpclip.data.splits import stratified_split
from dpclip.errors import DpclipError
from dpclip.files import atomic_dir, write_json, write_npz
from dpclip.hashing import file_hash, records_digest
from dpclip.layout import SPLITS, Layout

log = logging.getLogger(__name__)

IMAGE_PREPROCESSING = {"fitted_on": "nothing: fixed scaling, no statistics fitted",
                       "vocabulary": None}

Split = tuple[np.ndarray, np.ndarray, np.ndarray]  # x, y, record index in its source


def _fractions(params: Params, names: tuple[str, ...]) -> dict[str, float]:
    split = params.data.split
    chosen = {n: getattr(split, n) for n in names}
    total = sum(chosen.values())
    return {n: f / total for n, f in chosen.items()} if total > 0 else chosen


def _strata(source: Dataset | CsvTable) -> np.ndarray:
    return source.strata() if isinstance(source, CsvTable) else source.y


def _subset_split(strata: np.ndarray, fractions: dict[str, float], seed: int,
                  max_records: int | None) -> dict[str, np.ndarray]:
    """``stratified_split`` of a stratified subset of about ``max_records`` records (drawn with
    its own seed; all records when None or when there are fewer)."""
    keep = np.arange(len(strata))
    if max_records is not None and len(strata) > max_records:
        share = max_records / len(strata)
        keep = stratified_split(strata, {"kept": share, "left": 1 - share}, seed + 1000)["kept"]
    return {name: keep[part] for name, part in
            stratified_split(strata[keep], fractions, seed).items()}


def _split(params: Params, main, public) -> dict[str, tuple]:
    """{split name: (source, record indices)}; the shadow splits come from ``public`` when
    there is a separate public dataset. ``data.max_records`` caps each dataset first."""
    seed, cap = params.data.seed, params.data.max_records
    if public is None:
        parts = _subset_split(_strata(main), _fractions(params, SPLITS), seed, cap)
        return {name: (main, parts[name]) for name in SPLITS}
    parts = _subset_split(_strata(main), _fractions(params, SPLITS[:2]), seed, cap)
    public_parts = _subset_split(_strata(public), _fractions(params, SPLITS[2:]), seed + 1, cap)
    return {**{name: (main, parts[name]) for name in SPLITS[:2]},
            **{name: (public, public_parts[name]) for name in SPLITS[2:]}}


def _images(params: Params, sources: dict[str, tuple]) -> tuple[dict[str, Split], dict, dict]:
    """Image splits as loaded: pixels scaled by fixed constants, nothing fitted (``params`` is
    unused; the signature matches :func:`_csv`)."""
    main = sources["target_train"][0]
    public = sources["shadow_train"][0]
    if public.feature_shape != main.feature_shape:
        raise DpclipError(f"data.shadow_dataset: {public.name!r} has feature shape "
                          f"{public.feature_shape}, the main dataset {main.feature_shape}")
    splits = {name: (src.x[idx], src.y[idx], idx) for name, (src, idx) in sources.items()}
    return splits, {"classes": main.classes, "public_classes": public.classes,
                    "feature_shape": list(main.feature_shape),
                    "info": main.info}, dict(IMAGE_PREPROCESSING)


def _check_columns(params: Params, main: CsvTable, public: CsvTable) -> None:
    if set(public.frame.columns) != set(main.frame.columns):
        raise DpclipError(f"data.shadow_path: {params.data.shadow_path!r} has the feature "
                          f"columns {list(public.frame.columns)}, the main CSV (data.path "
                          f"{params.data.path!r}) {list(main.frame.columns)}; the public CSV "
                          f"must have the same columns")


def table_schema(params: Params):
    """The table source's options: its label column (``target``) and public schema
    (``categories``), which the encoding reads."""
    return options_of(params.data, params.data.dataset)


def _refuse_unknown_labels(params: Params, encoder, sources: dict[str, tuple]) -> None:
    """A record whose label is outside the class list cannot be encoded; a private one would
    otherwise teach the model a class that only members hold. The message names the labels of
    public splits only: for a private split it gives the count, never the members' labels."""
    schema = table_schema(params)
    target = schema.target
    origin = (f"data.categories.{target}" if target in (schema.categories or {})
              else "the public shadow_train rows")
    for name, (table, idx) in sources.items():
        unknown = encoder.unknown_labels(table, idx)
        if unknown:
            private = name.startswith("target")
            held = (f"{len(unknown)} label(s) of {target!r} (not shown: private)" if private
                    else f"the labels {unknown} of {target!r}")
            raise DpclipError(
                f"data.categories: the {name} split ({'private' if private else 'public'}) "
                f"holds {held} outside the class list {encoder.classes} (from {origin}); list "
                f"every class under data.categories.{target}")


def _csv(params: Params, sources: dict[str, tuple]) -> tuple[dict[str, Split], dict, dict]:
    """CSV splits, all encoded by one :class:`~dpclip.data.CsvEncoder` fitted on the public
    shadow_train rows (of the shadow dataset when there is one) and ``data.categories``: the
    members and the holdout are encoded with public statistics and a public vocabulary, and
    their labels must lie in the public class list."""
    table, rows = sources["shadow_train"]
    if len(rows) == 0:
        raise DpclipError(
            f"data.split.shadow_train: {params.data.split.shadow_train!r} leaves the public "
            f"shadow_train split empty, so there are no public rows to fit the CSV encoding "
            f"(medians, means, stds, vocabularies, classes) on, and fitting it on the private "
            f"rows would leak them; give data.split.shadow_train a larger fraction or name a "
            f"public CSV in data.shadow_dataset / data.shadow_path")
    encoder = fit_encoder(table, rows, table_schema(params).categories,
                          f"public shadow_train split of {table.path.name}")
    _refuse_unknown_labels(params, encoder, sources)
    splits = {}
    for name, (src, idx) in sources.items():
        encoded = encoder.transform(src, idx)
        splits[name] = (encoded.x, encoded.y, idx)
    main = sources["target_train"][0]
    return splits, {"classes": encoder.classes, "feature_shape": [len(encoder.feature_names)],
                    "info": encoder.describe(main)}, encoder.summary()


def _read(params: Params):
    """The main dataset and the separate public one (None without data.shadow_dataset),
    refused when they are the same source."""
    data = params.data
    refuse_same_source(data)
    main = read_source(data.dataset, data.path, data)
    if not data.shadow_dataset:
        return main, None
    public = read_source(data.shadow_dataset, data.shadow_path, data, key="data.shadow_path")
    shared = refuse_same_content(data, main, public)
    if shared:
        log.warning("data.shadow_dataset: %d of the public records equal a record of the main "
                    "dataset (allowed by data.shadow_max_shared %s)", shared,
                    data.shadow_max_shared)
    if isinstance(main, CsvTable):
        _check_columns(params, main, public)
    return main, public


def prepare(params: Params, layout: Layout = Layout()) -> dict:
    """Build the four splits and write them, with ``meta.json``, as one atomic folder; every
    check runs before anything is written."""
    data = params.data
    main, public = _read(params)
    sources = _split(params, main, public)
    if len(sources["target_train"][1]) == 0 or len(sources["target_holdout"][1]) == 0:
        raise DpclipError(f"data.split: the dataset ({len(_strata(main))} records) is too "
                          f"small for a non-empty target train and holdout")
    encode = _csv if isinstance(main, CsvTable) else _images
    splits, described, preprocessing = encode(params, sources)
    classes = described["classes"]
    fingerprint = data_fingerprint(params, splits)
    meta = {
        "dataset": data.dataset, "shadow_dataset": data.shadow_dataset,
        # what results are filed under (summary/<run>.json, MLflow): two datasets, or two
        # splits of one, never share it
        "dataset_id": f"{dataset_label(data)}-{fingerprint[:8]}", "fingerprint": fingerprint,
        "feature_shape": described["feature_shape"], "n_classes": len(classes),
        "classes": classes,
        # the public splits' label names: a separate public dataset may have other classes
        "public_classes": described.get("public_classes", classes), "sizes": {name: int(len(s[2])) for name, s in splits.items()},
        "seed": data.seed,
        "class_counts": {name: np.bincount(y, minlength=len(classes)).tolist()
                         for name, (_, y, _) in splits.items()},
        "preprocessing": preprocessing,
        "info": described["info"],
    }
    with atomic_dir(layout.prepared) as folder:
        for name, (x, y, idx) in splits.items():
            write_npz(folder / f"{name}.npz", x=x, y=y, index=idx)
        write_json(folder / "meta.json", meta)
    return meta


def data_fingerprint(params: Params, splits: dict) -> str:
    """SHA-256 of what the prepared data are made of: the data parameters (a named file's or
    folder's content, not its path) and each split's record indices and labels (integers: the
    same on every machine, where the scaled features' last bits may not be)."""
    written = params.data.as_written()
    files = {key: file_hash(Path(written.pop(key))) for key in ("path", "shadow_path")
             if written.get(key) is not None}
    digest = hashlib.sha256(json.dumps({"data": written, "files": files}, sort_keys=True,
                                       default=str).encode())
    for name in sorted(splits):
        _, y, index = splits[name]
        labelled = records_digest(np.asarray(index, np.int64), np.asarray(y, np.int64))
        digest.update(f"{name}\0{labelled}".encode())
    return digest.hexdigest()


def describe(meta: dict, layout: Layout) -> str:
    """The line ``dpclip prepare`` prints."""
    return f"prepared {meta['dataset']}: {meta['sizes']}"
