"""``mnist``: the 70,000 28x28 handwritten digits as IDX files (train and test together; the
pipeline draws its own splits), downloaded into ``data/raw/mnist`` when ``data.path`` does not
hold them and ``data.download`` is on, checked against the published MD5 sums."""

from __future__ import annotations

from dpclip.data.dataset import Dataset
from dpclip.data.idx import load_idx_dataset
from dpclip.data.sources.base import DataSource, register

# the sums published for the canonical files (the ones torchvision checks)
MD5 = {"train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
       "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
       "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
       "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c"}
MIRRORS = ["https://ossci-datasets.s3.amazonaws.com/mnist/",
           "https://storage.googleapis.com/cvdf-datasets/mnist/"]


@register
class Mnist(DataSource):
    name = "mnist"
    kind = "arrays"
    description = "MNIST handwritten digits (IDX files, downloaded when missing)"

    def read(self, path: str | None, data, key: str) -> Dataset:
        return load_idx_dataset(self.name, path, data.download,
                                classes=[str(c) for c in range(10)], mirrors=MIRRORS, md5=MD5)
