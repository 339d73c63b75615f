"""prepare: raw data -> target train (members), target holdout (non-members, the utility test
set), shadow train and shadow holdout (public data for shadow models).

Splits are stratified and seeded. With ``data.shadow_dataset`` set, the shadow splits come from
that separate public dataset (e.g. Fashion-MNIST beside MNIST) and the main dataset is split
into target train / holdout only; otherwise the four splits are disjoint parts of one dataset.
"""

from __future__ import annotations

import numpy as np

from dpclip.config import Params
from dpclip.data import CsvTable, read_source
from dpclip.data.splits import stratified_split
from dpclip.errors import DpclipError
from dpclip.io import atomic_dir, write_json, write_npz
from dpclip.layout import SPLITS, Layout


def _fractions(params: Params, names: tuple[str, ...]) -> dict[str, float]:
    split = params.data.split
    chosen = {n: getattr(split, n) for n in names}
    total = sum(chosen.values())
    return {n: f / total for n, f in chosen.items()} if total > 0 else chosen


def _encoded(source, parts: dict[str, np.ndarray]):
    """Images are ready; CSV features are encoded with statistics of the public rows only."""
    if not isinstance(source, CsvTable):
        return source
    public = parts.get("shadow_train")
    fit_rows = public if public is not None and len(public) else parts["target_train"]
    dataset = source.to_dataset(fit_rows)
    dataset.info["statistics_source"] = ("shadow_train (public)" if fit_rows is public
                                         else "target_train (no public split configured)")
    return dataset


def prepare(params: Params, layout: Layout = Layout()) -> dict:
    """Build the four splits and write them, with ``meta.json``, as one atomic folder."""
    data = params.data
    main = read_source(data.dataset, data.path, data)
    if data.shadow_dataset:
        parts = stratified_split(main.y, _fractions(params, SPLITS[:2]), data.seed)
        main = _encoded(main, parts)
        public = read_source(data.shadow_dataset, data.shadow_path, data)
        public_parts = stratified_split(public.y, _fractions(params, SPLITS[2:]), data.seed + 1)
        public = _encoded(public, public_parts)
        if public.feature_shape != main.feature_shape:
            raise DpclipError(f"data.shadow_dataset: {data.shadow_dataset!r} has feature shape "
                              f"{public.feature_shape}, the main dataset "
                              f"{main.feature_shape}")
        sources = {"target_train": (main, parts["target_train"]),
                   "target_holdout": (main, parts["target_holdout"]),
                   "shadow_train": (public, public_parts["shadow_train"]),
                   "shadow_holdout": (public, public_parts["shadow_holdout"])}
    else:
        parts = stratified_split(main.y, _fractions(params, SPLITS), data.seed)
        main = _encoded(main, parts)
        sources = {name: (main, parts[name]) for name in SPLITS}
    if len(sources["target_train"][1]) == 0 or len(sources["target_holdout"][1]) == 0:
        raise DpclipError(f"data.split: the dataset ({len(main.y)} records) is too small for a "
                          f"non-empty target train and holdout")
    sizes = {name: int(len(idx)) for name, (_, idx) in sources.items()}
    meta = {
        "dataset": data.dataset, "shadow_dataset": data.shadow_dataset,
        "feature_shape": list(main.feature_shape), "n_classes": len(main.classes),
        "classes": main.classes, "sizes": sizes, "seed": data.seed,
        "class_counts": {name: np.bincount(src.y[idx], minlength=len(main.classes)).tolist()
                         for name, (src, idx) in sources.items()},
        "info": main.info,
    }
    with atomic_dir(layout.prepared) as folder:
        for name, (src, idx) in sources.items():
            write_npz(folder / f"{name}.npz", x=src.x[idx], y=src.y[idx], index=idx)
        write_json(folder / "meta.json", meta)
    return meta


def load_split(layout: Layout, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, y, original record index) of one prepared split."""
    path = layout.split(name)
    if not path.exists():
        raise DpclipError(f"prepared split {str(path)!r} is missing: run the prepare stage first")
    with np.load(path) as f:
        return f["x"], f["y"], f["index"]
