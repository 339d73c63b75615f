"""Atomic file writes: every output is written to a temporary file beside it, then renamed.

A crash or a rejected run therefore never leaves a half-written file where a later stage, DVC
or a user would read it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator

import numpy as np


def _umask() -> int:
    """The process's umask (reading it means setting it: it is put back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def default_mode(folder: bool = False) -> int:
    """The mode ``open`` (0o666) or ``mkdir`` (0o777) gives a new file or folder under the
    umask: 0o644 and 0o755 with the usual 022. ``tempfile`` makes its files 0o600 and its
    folders 0o700, private to the owner, which is not what an output renamed into place should
    keep (a report or figure another user, a web server or a container cannot read)."""
    return (0o777 if folder else 0o666) & ~_umask()


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; rename it onto ``path`` on success. The
    file gets the mode a plainly written one would (:func:`default_mode`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, default_mode())
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_with(path: str | Path, writer: Callable[[Path], None]) -> Path:
    """Call ``writer(tmp_path)`` and atomically move the result to ``path``."""
    with atomic_path(path) as tmp:
        writer(tmp)
    return Path(path)


def write_text(path: str | Path, text: str) -> Path:
    return write_with(path, lambda tmp: tmp.write_text(text))


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")


def write_json(path: str | Path, obj) -> Path:
    text = json.dumps(obj, indent=2, sort_keys=False, default=_json_default, allow_nan=False)
    return write_text(path, text + "\n")


def read_json(path: str | Path):
    return json.loads(Path(path).read_text())


def write_npz(path: str | Path, **arrays) -> Path:
    def writer(tmp: Path):
        with open(tmp, "wb") as fh:  # a file handle stops numpy appending '.npz' to the name
            np.savez_compressed(fh, **arrays)

    return write_with(path, writer)


def write_figure(path: str | Path, fig) -> Path:
    """Save a matplotlib figure atomically and close it."""
    import matplotlib.pyplot as plt

    fmt = Path(path).suffix.lstrip(".") or "png"
    try:
        return write_with(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=110,
                                                         bbox_inches="tight"))
    finally:
        plt.close(fig)


def write_torch(path: str | Path, obj) -> Path:
    """``torch.save`` atomically, with the same bytes for the same tensors: torch names the
    archive's root folder after the file, so saving to a temporary file put its random name
    into every model file (and DVC saw a change). In memory the name is always ``archive``."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return write_with(path, lambda tmp: tmp.write_bytes(buffer.getvalue()))


def write_csv_frame(path: str | Path, frame) -> Path:
    """Write a pandas DataFrame as CSV atomically."""
    return write_with(path, lambda tmp: frame.to_csv(tmp, index=False))


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary folder; on success it replaces ``path`` as a whole.

    Stage outputs that are folders (prepared splits, partitions) are therefore either the old
    complete set or the new complete set, never a mix. The folder gets the mode a plainly made
    one would (:func:`default_mode`).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.chmod(tmp, default_mode(folder=True))
    try:
        yield tmp
        old = None
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.rmdir(old)
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
