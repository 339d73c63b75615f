"""Dataset sources (one module each in :mod:`dpclip.data.sources`), splits and label skew."""

from __future__ import annotations

from dpclip.data.dataset import Dataset
from dpclip.data.sources import get_source
from dpclip.data.tabular import CsvEncoder, CsvTable, fit_encoder


def read_source(name: str, path: str | None, data_params, key: str = "data.path"
                ) -> Dataset | CsvTable:
    """Open the dataset of source ``name`` (:mod:`dpclip.data.sources`) at ``path``. CSV files
    come back unencoded (see :mod:`dpclip.data.tabular`); ``key`` is the parameter that named
    ``path`` (``data.shadow_path`` for the public one)."""
    return get_source(name)().read(path, data_params, key)


__all__ = ["Dataset", "CsvEncoder", "CsvTable", "fit_encoder", "read_source"]
