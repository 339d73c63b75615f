"""``cifar10``: the 60,000 32x32 colour images of CIFAR-10 from the python pickle batches
(``data_batch_1`` .. ``data_batch_5`` and ``test_batch``, together) in ``data.path`` (or its
``cifar-10-batches-py`` folder); pixels scaled by 1/255."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from dpclip.data.dataset import Dataset
from dpclip.data.sources.base import DataSource, register
from dpclip.errors import DpclipError

BATCHES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
           "truck"]


@register
class Cifar10(DataSource):
    name = "cifar10"
    kind = "arrays"
    description = "CIFAR-10 colour images (python pickle batches)"
    needs_path = True
    path_help = "the folder of python pickle batches"

    def read(self, path: str | None, data, key: str) -> Dataset:
        root = Path(path)
        if (root / "cifar-10-batches-py").is_dir():
            root = root / "cifar-10-batches-py"
        present = [b for b in BATCHES if (root / b).exists()]
        if not present:
            raise DpclipError(f"{key}: {path!r} holds none of the CIFAR-10 batches {BATCHES}")
        xs, ys = [], []
        for batch in present:
            try:
                with open(root / batch, "rb") as fh:
                    entry = pickle.load(fh, encoding="latin1")
                xs.append(np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
                ys.append(np.asarray(entry["labels"], dtype=np.int64))
            except (OSError, pickle.UnpicklingError, KeyError, ValueError, EOFError) as exc:
                raise DpclipError(f"{key}: {str(root / batch)!r} is not a CIFAR-10 python "
                                  f"batch: {exc}") from exc
        x = np.concatenate(xs).astype(np.float32) / 255.0
        return Dataset("cifar10", x, np.concatenate(ys), CLASSES, (3, 32, 32),
                       {"source": str(root), "batches": present})
