"""What an array dataset source returns: float32 features, int64 labels, the class names and
what the data is. Pixels and other features are scaled by fixed constants by the source (no
statistic of the data is used), so no private information leaks through preprocessing. CSV
files are read as a :class:`~dpclip.data.tabular.CsvTable` instead, whose encoding is fitted on
public rows only."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dpclip.errors import DpclipError


@dataclass
class Dataset:
    """Features ``x`` (N x ...), integer labels ``y`` (N,), and what they mean."""

    name: str
    x: np.ndarray
    y: np.ndarray
    classes: list[str]
    feature_shape: tuple[int, ...]
    info: dict = field(default_factory=dict)

    def __post_init__(self):
        self.x = np.ascontiguousarray(self.x, dtype=np.float32)
        self.y = np.ascontiguousarray(self.y, dtype=np.int64)
        if len(self.x) != len(self.y):
            raise DpclipError(f"{self.name}: {len(self.x)} feature rows but {len(self.y)} labels")

    def strata(self) -> np.ndarray:
        """The labels, which stratify the splits."""
        return self.y
