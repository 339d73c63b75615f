"""Dataset sources (one module each in :mod:`dpclip.data.sources`), splits and label skew."""

from __future__ import annotations

from dpclip.data.dataset import Dataset
from dpclip.data.sources import get_source, open_source
from dpclip.data.tabular import CsvEncoder, CsvTable, fit_encoder
from dpclip.errors import DpclipError


def read_source(name: str, path: str | None, data_params, key: str = "data.path"
                ) -> Dataset | CsvTable:
    """Open the dataset of source ``name`` (:mod:`dpclip.data.sources`) at ``path``. CSV files
    come back unencoded (see :mod:`dpclip.data.tabular`); ``key`` is the parameter that named
    ``path`` (``data.shadow_path`` for the public one)."""
    source = get_source(name)
    data = open_source(name, data_params).read(path, data_params, key)
    # the kind decides the encoding (a table's is fitted on public rows): it must be the truth
    expected = {"arrays": Dataset, "table": CsvTable}[source.kind]
    if not isinstance(data, expected):
        raise DpclipError(f"dataset source {name!r} declares kind {source.kind!r} but read "
                          f"a {type(data).__name__}, not a {expected.__name__}")
    return data


__all__ = ["Dataset", "CsvEncoder", "CsvTable", "fit_encoder", "read_source"]
