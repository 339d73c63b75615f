"""IDX files (MNIST, Fashion-MNIST): where they are, their published checksums, the download
from the first mirror that answers, and the reader of the format (magic, dimensions, then
unsigned bytes). The sources :mod:`dpclip.data.sources.mnist` and
:mod:`dpclip.data.sources.fashion_mnist` are built on :func:`load_idx_dataset`.
"""

from __future__ import annotations

import gzip
import hashlib
import struct
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from dpclip.data.dataset import Dataset
from dpclip.errors import DpclipError
from dpclip.files import atomic_path

IDX_FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}

DEFAULT_DATA_HOME = Path("data/raw")


def md5sum(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download_file(name: str, filename: str, folder: Path, mirrors: list[str], md5: str) -> Path:
    """Fetch ``filename`` from the first mirror that answers and verify its MD5.

    Raises a :class:`DpclipError` that names the folder to fill by hand when no mirror can be
    reached (offline machines) or when every download fails its checksum.
    """
    target = folder / filename
    errors = []
    for mirror in mirrors:
        url = mirror + filename
        try:
            with atomic_path(target) as tmp:
                with urllib.request.urlopen(url, timeout=30) as response, open(tmp, "wb") as out:
                    while chunk := response.read(1 << 20):
                        out.write(chunk)
                got = md5sum(tmp)
                if got != md5:
                    raise DpclipError(f"checksum mismatch for {url}: md5 {got}, expected {md5}")
            return target
        except (urllib.error.URLError, OSError, DpclipError) as exc:
            errors.append(f"{url}: {exc}")
    raise DpclipError(
        f"data.path: {name} file {filename!r} is not in {str(folder)!r} and could not be "
        f"downloaded ({'; '.join(errors)}). If this machine is offline, copy the four IDX .gz "
        f"files into that folder (or set data.path to a folder that has them)."
    )


def read_idx(path: Path) -> np.ndarray:
    """Parse an IDX file (optionally gzip-compressed): magic, dims, then unsigned bytes."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            data = fh.read()
    except (OSError, EOFError) as exc:
        raise DpclipError(f"data.path: {str(path)!r} is not a readable IDX file: {exc}") from exc
    if len(data) < 4:
        raise DpclipError(f"data.path: {str(path)!r} is too short to be an IDX file")
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        raise DpclipError(f"data.path: {str(path)!r} has IDX magic {data[:4].hex()}, "
                          f"expected unsigned-byte data (0x0008..)")
    dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise DpclipError(f"data.path: {str(path)!r} holds {body.size} values, its header "
                          f"promises {int(np.prod(dims))}")
    return body.reshape(dims)


def load_idx_dataset(name: str, folder: str | None, download: bool, *, classes: list[str],
                     mirrors: list[str], md5: dict[str, str]) -> Dataset:
    """The four IDX files of ``name`` (train and test images and labels, gzip-compressed or
    not) from ``folder`` (default ``data/raw/<name>``), downloaded from ``mirrors`` and checked
    against the ``md5`` sums when missing and ``download``; train and test concatenated (the
    pipeline draws its own splits), pixels scaled by 1/255."""
    folder_path = Path(folder) if folder else DEFAULT_DATA_HOME / name
    paths = {}
    for key, filename in IDX_FILES.items():
        path = folder_path / filename
        if not path.exists() and (folder_path / filename[:-3]).exists():
            path = folder_path / filename[:-3]  # uncompressed copy
        if not path.exists():
            if not download:
                raise DpclipError(f"data.path: {str(folder_path)!r} has no {filename!r} and "
                                  f"data.download is false")
            path = download_file(name, filename, folder_path, mirrors, md5[filename])
        paths[key] = path
    images = np.concatenate([read_idx(paths["train_images"]), read_idx(paths["test_images"])])
    labels = np.concatenate([read_idx(paths["train_labels"]), read_idx(paths["test_labels"])])
    if images.ndim != 3:
        raise DpclipError(f"data.path: {name} images have shape {images.shape}, expected N x H x W")
    x = (images.astype(np.float32) / 255.0)[:, None, :, :]
    return Dataset(name, x, labels, classes, tuple(x.shape[1:]),
                   {"source": str(folder_path)})
