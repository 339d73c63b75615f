"""Content hashes of files and folders, as DVC computes its dependencies' (the provenance of
runs, the tuned-values file's inputs)."""

from __future__ import annotations

import hashlib
from pathlib import Path

SKIPPED_NAMES = {"__pycache__", "provenance.json"}


def file_hash(path: Path) -> str | None:
    """SHA-256 of a file, or of a folder (its files' relative paths and contents, in sorted
    order; caches, provenance and temporary files left out); None when ``path`` is missing.

    A file's hash is remembered for its (size, modification time), as DVC does, so the data
    every run reads is hashed once per process."""
    if path.is_file():
        stat = path.stat()
        key = (path.resolve(), stat.st_size, stat.st_mtime_ns)
        if key not in _KNOWN:
            _KNOWN[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        return _KNOWN[key]
    if not path.is_dir():
        return None
    digest = hashlib.sha256()
    for child in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = child.relative_to(path)
        if SKIPPED_NAMES.intersection(rel.parts) or child.name.endswith((".pyc", ".tmp")):
            continue
        digest.update(f"{rel.as_posix()}\0{file_hash(child)}\0".encode())
    return digest.hexdigest()


_KNOWN: dict[tuple, str] = {}


def records_digest(*arrays) -> str:
    """SHA-256 of arrays' bytes (a run's features and labels): which records a run trained on,
    for its checkpoint's fingerprint and its noise streams' key."""
    import numpy as np  # on use: this module is imported before the numeric libraries

    digest = hashlib.sha256()
    for array in arrays:
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()
