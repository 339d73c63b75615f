"""``digits``: scikit-learn's bundled 8x8 handwritten digits (1797 images, 10 classes; no
download, the default). Pixel values are integers 0..16, scaled to [0, 1] by that fixed
maximum."""

from __future__ import annotations

import numpy as np

from dpclip.data.dataset import Dataset
from dpclip.data.sources.base import DataSource, register


@register
class Digits(DataSource):
    name = "digits"
    kind = "arrays"
    description = "scikit-learn's bundled 8x8 handwritten digits (no download)"

    def read(self, path: str | None, data, key: str) -> Dataset:
        from sklearn.datasets import load_digits  # on use: scikit-learn loads slowly

        bunch = load_digits()
        x = (bunch.images.astype(np.float32) / 16.0)[:, None, :, :]
        return Dataset("digits", x, bunch.target, [str(c) for c in range(10)], (1, 8, 8),
                       {"source": "sklearn.datasets.load_digits"})
