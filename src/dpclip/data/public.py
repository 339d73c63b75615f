"""Keeping public data apart from the private records (docs/privacy.md, "Public data").

Everything fitted without noise sees the public ``data.shadow_dataset``, so it is refused when
it is the main dataset's source (same name and location), of the other kind, or when more than
``data.shadow_max_shared`` of its records equal a main record (a copy, subset or superset under
any path or order, compared by per-record digests). See docs/adding-a-dataset.md, "What the
prepare stage does with it".
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from dpclip.data.dataset import Dataset
from dpclip.data.tabular import CsvTable
from dpclip.errors import DpclipError


def _location(path: str | None) -> Path | None:
    return None if path is None else Path(path).expanduser().resolve()


def _names(data) -> str:
    return (f"data.shadow_dataset: {data.shadow_dataset!r} (data.shadow_path "
            f"{data.shadow_path!r})")


def refuse_same_source(data) -> None:
    """Refuse a shadow dataset with the main dataset's name and location (both paths null, or
    the same resolved path). Runs before anything is read or written."""
    if not data.shadow_dataset or data.shadow_dataset != data.dataset:
        return
    if _location(data.shadow_path) == _location(data.path):
        raise DpclipError(f"{_names(data)} is the main dataset itself (data.dataset "
                          f"{data.dataset!r}, data.path {data.path!r}); public data must be "
                          f"disjoint from the private records: name another dataset, or unset "
                          f"data.shadow_dataset to split the main one")


def refuse_same_content(data, main: Dataset | CsvTable, public: Dataset | CsvTable) -> int:
    """Refuse a shadow dataset of the other kind (CSV beside images), or one in which more than
    the fraction ``data.shadow_max_shared`` of the records equal a record of the main dataset
    (a copy of the same file or IDX folder under another path, or a subset of it). Returns the
    number of public records that equal a main record."""
    if isinstance(main, CsvTable) != isinstance(public, CsvTable):
        raise DpclipError(f"{_names(data)}: a CSV and an image dataset cannot be paired (the "
                          f"main dataset is {data.dataset!r}); the public dataset must have the "
                          f"main dataset's kind and features")
    main_digests = set(_record_digests(main))
    public_digests = _record_digests(public)
    shared = sum(digest in main_digests for digest in public_digests)
    if shared > data.shadow_max_shared * len(public_digests):
        raise DpclipError(f"{_names(data)}: {shared} of its {len(public_digests)} records equal "
                          f"a record of the main dataset {data.dataset!r} (data.path "
                          f"{data.path!r}), more than data.shadow_max_shared "
                          f"{data.shadow_max_shared!r} of them; public data must be disjoint "
                          f"from the private records: name a dataset that is not a copy or "
                          f"subset of the main one")
    return shared


def _record_digests(source: Dataset | CsvTable) -> list[bytes]:
    """One digest per record (features and label), so the same record gives the same digest
    whatever the file, path, row order or column order."""
    if isinstance(source, CsvTable):
        columns = sorted(source.frame.columns)
        frame = source.frame[columns].fillna("\x00").assign(**{"\x00label": source.labels})
        head = "\x1f".join(columns).encode()
        rows = frame.agg("\x1f".join, axis=1)
        return [_digest(head + b"\x1e" + row.encode()) for row in rows]
    x = np.ascontiguousarray(source.x).reshape(len(source.x), -1)
    return [_digest(row.tobytes() + int(label).to_bytes(8, "little", signed=True))
            for row, label in zip(x, source.y)]


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()
