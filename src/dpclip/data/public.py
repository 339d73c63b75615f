"""Keeping public data apart from the private records (METHODS.md, "Public data").

A separate ``data.shadow_dataset`` is treated as public: the shadow models, the frozen sanitize
encoder, public layer weights, early stopping and the CSV encoding are fitted on it without
noise. If it were the main dataset itself, every one of those would have seen the members while
the runs still claimed a DP guarantee. So a shadow dataset is refused when it is the same
source as the main one: the same name and location, or the same records (in any order, under
any path), compared by a content fingerprint.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from dpclip.data.sources import Dataset
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


def refuse_same_content(data, main: Dataset | CsvTable, public: Dataset | CsvTable) -> None:
    """Refuse a shadow dataset of the other kind (CSV beside images) or with the same records
    as the main dataset (e.g. a copy of the same file or IDX folder under another path)."""
    if isinstance(main, CsvTable) != isinstance(public, CsvTable):
        raise DpclipError(f"{_names(data)}: a CSV and an image dataset cannot be paired (the "
                          f"main dataset is {data.dataset!r}); the public dataset must have the "
                          f"main dataset's kind and features")
    if fingerprint(main) == fingerprint(public):
        raise DpclipError(f"{_names(data)} holds the same records as the main dataset "
                          f"{data.dataset!r} (data.path {data.path!r}); public data must be "
                          f"disjoint from the private records: name a different dataset")


def fingerprint(source: Dataset | CsvTable) -> str:
    """sha256 over the sorted per-record digests (features and label), so the same records
    give the same fingerprint whatever the file, path or row order."""
    digests = sorted(_record_digests(source))
    return hashlib.sha256(b"".join(digests)).hexdigest()


def _record_digests(source: Dataset | CsvTable) -> list[bytes]:
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
