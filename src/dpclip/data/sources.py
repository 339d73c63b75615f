"""Image dataset sources: bundled digits, IDX files (MNIST, Fashion-MNIST), CIFAR-10 batches.

Every source returns a :class:`Dataset`: float32 features, int64 labels, and a description.
Image pixels are scaled by a fixed constant (no statistic of the data is used), so no private
information leaks through preprocessing. CSV files are read by :mod:`dpclip.data.tabular`,
whose encoding is fitted on public rows only.
"""

from __future__ import annotations

import gzip
import hashlib
import pickle
import struct
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpclip.errors import DpclipError
from dpclip.io import atomic_path


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


# --------------------------------------------------------------------------------------------
# digits (bundled with scikit-learn: no network, the default)


def load_digits_dataset() -> Dataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    # pixel values are integers 0..16: scale to [0, 1] by the fixed maximum
    x = (bunch.images.astype(np.float32) / 16.0)[:, None, :, :]
    return Dataset("digits", x, bunch.target, [str(c) for c in range(10)], (1, 8, 8),
                   {"source": "sklearn.datasets.load_digits"})


# --------------------------------------------------------------------------------------------
# IDX (MNIST, Fashion-MNIST)

IDX_FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}

# MD5 sums published for the canonical files (the same ones torchvision checks).
IDX_MD5 = {
    "mnist": {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    },
    "fashion-mnist": {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    },
}

IDX_MIRRORS = {
    "mnist": [
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "https://storage.googleapis.com/cvdf-datasets/mnist/",
    ],
    "fashion-mnist": [
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    ],
}

IDX_CLASSES = {
    "mnist": [str(c) for c in range(10)],
    "fashion-mnist": ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                      "Sneaker", "Bag", "Ankle boot"],
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


def load_idx_dataset(name: str, folder: str | None, download: bool) -> Dataset:
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
            path = download_file(name, filename, folder_path, IDX_MIRRORS[name],
                                 IDX_MD5[name][filename])
        paths[key] = path
    images = np.concatenate([read_idx(paths["train_images"]), read_idx(paths["test_images"])])
    labels = np.concatenate([read_idx(paths["train_labels"]), read_idx(paths["test_labels"])])
    if images.ndim != 3:
        raise DpclipError(f"data.path: {name} images have shape {images.shape}, expected N x H x W")
    x = (images.astype(np.float32) / 255.0)[:, None, :, :]
    return Dataset(name, x, labels, IDX_CLASSES[name], tuple(x.shape[1:]),
                   {"source": str(folder_path)})


# --------------------------------------------------------------------------------------------
# CIFAR-10 (python pickle batches)

CIFAR_BATCHES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
CIFAR_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                 "ship", "truck"]


def load_cifar10_dataset(folder: str | None) -> Dataset:
    if folder is None:
        raise DpclipError("data.path: None — cifar10 needs the folder of python pickle batches")
    root = Path(folder)
    if (root / "cifar-10-batches-py").is_dir():
        root = root / "cifar-10-batches-py"
    present = [b for b in CIFAR_BATCHES if (root / b).exists()]
    if not present:
        raise DpclipError(f"data.path: {folder!r} holds none of the CIFAR-10 batches "
                          f"{CIFAR_BATCHES}")
    xs, ys = [], []
    for batch in present:
        try:
            with open(root / batch, "rb") as fh:
                entry = pickle.load(fh, encoding="latin1")
            xs.append(np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            ys.append(np.asarray(entry["labels"], dtype=np.int64))
        except (OSError, pickle.UnpicklingError, KeyError, ValueError, EOFError) as exc:
            raise DpclipError(f"data.path: {str(root / batch)!r} is not a CIFAR-10 python "
                              f"batch: {exc}") from exc
    x = np.concatenate(xs).astype(np.float32) / 255.0
    return Dataset("cifar10", x, np.concatenate(ys), CIFAR_CLASSES, (3, 32, 32),
                   {"source": str(root), "batches": present})
