"""partition: the label-skewed training set for one Dirichlet alpha ('iid' = no skew).

Writes ``data/partitions/<alpha>/partition.json`` (positions into the prepared target-train
split, its size, the drawn proportions, the per-class histogram) and a histogram plot.
"""

from __future__ import annotations


import numpy as np

from dpclip.stage_outputs import load_split
from dpclip.config import IID, Params
from dpclip.data.splits import dirichlet_subsample
from dpclip.files import atomic_dir, read_json, write_json
from dpclip.layout import Layout
from dpclip.run_keys import alpha_tag
from dpclip.reporting.plots import partition_histogram_figure


def partition(params: Params, alpha, layout: Layout = Layout()) -> dict:
    _, y, _ = load_split(layout, "target_train")
    meta = read_json(layout.prepared_meta)
    n_classes = int(meta["n_classes"])
    if alpha == IID:
        positions, proportions = np.arange(len(y)), None
    else:
        # one seed per (data seed, alpha): the same alpha always gives the same subset
        seed = int(np.random.SeedSequence([params.data.seed, int(float(alpha) * 1e6)])
                   .generate_state(1)[0])
        positions, proportions = dirichlet_subsample(y, n_classes, float(alpha), seed)
    histogram = np.bincount(y[positions], minlength=n_classes)
    record = {
        "alpha": None if alpha == IID else alpha, "tag": alpha_tag(alpha),
        "size": int(len(positions)), "source_size": int(len(y)),
        "fraction_kept": float(len(positions) / len(y)),
        "proportions": None if proportions is None else proportions.tolist(),
        "histogram": histogram.tolist(), "classes": meta["classes"],
        "positions": positions.tolist(),
    }
    with atomic_dir(layout.partition(alpha_tag(alpha))) as folder:
        write_json(folder / "partition.json", record)
        partition_histogram_figure(folder / "histogram.png", record)
    return record


def describe(record: dict, layout: Layout) -> str:
    """The line ``dpclip partition`` prints."""
    return f"partition {record['tag']}: {record['size']} records, histogram {record['histogram']}"
