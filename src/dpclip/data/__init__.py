"""Dataset sources, splits and label skew."""

from __future__ import annotations

from dpclip.data.sources import (Dataset, load_cifar10_dataset, load_digits_dataset,
                                 load_idx_dataset)
from dpclip.data.tabular import CsvEncoder, CsvTable, fit_encoder, read_csv_table


def read_source(name: str, path: str | None, data_params, key: str = "data.path"
                ) -> Dataset | CsvTable:
    """Open a dataset by name. CSV files come back unencoded (see :mod:`dpclip.data.tabular`);
    ``key`` is the parameter that named ``path`` (``data.shadow_path`` for the public one)."""
    if name == "digits":
        return load_digits_dataset()
    if name in ("mnist", "fashion-mnist"):
        return load_idx_dataset(name, path, data_params.download)
    if name == "cifar10":
        return load_cifar10_dataset(path)
    if name == "csv":
        return read_csv_table(path, data_params.target, columns=data_params.columns,
                              numeric_columns=data_params.numeric_columns,
                              categorical_columns=data_params.categorical_columns,
                              missing_values=data_params.missing_values,
                              target_map=data_params.target_map, key=key)
    raise ValueError(f"unknown dataset {name!r}")  # config validation makes this unreachable


__all__ = ["Dataset", "CsvEncoder", "CsvTable", "fit_encoder", "read_source"]
