"""``fashion-mnist``: Zalando's 70,000 28x28 clothing images in MNIST's IDX format (train and
test together), downloaded into ``data/raw/fashion-mnist`` when missing and
``data.download`` is on, checked against the published MD5 sums."""

from __future__ import annotations

from dpclip.data.dataset import Dataset
from dpclip.data.idx import load_idx_dataset
from dpclip.data.sources.base import DataSource, register

MD5 = {"train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
       "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
       "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
       "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310"}
MIRRORS = ["http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"]
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
           "Bag", "Ankle boot"]


@register
class FashionMnist(DataSource):
    name = "fashion-mnist"
    kind = "arrays"
    description = "Fashion-MNIST clothing images (IDX files, downloaded when missing)"

    def read(self, path: str | None, data, key: str) -> Dataset:
        return load_idx_dataset(self.name, path, data.download, classes=CLASSES,
                                mirrors=MIRRORS, md5=MD5)
