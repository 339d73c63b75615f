"""The built-in ResNet (GroupNorm, for CIFAR-10 sized images) through the pipeline's stages
on CIFAR-10 python batches, and its shape as documented."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from conftest import merged, tiny_project_params
from dpclip.cli import main
from dpclip.errors import DpclipError
from dpclip.files import read_json
from dpclip.layout import Layout
from dpclip.models import build_model, count_parameters, layer_names
from dpclip.pipeline.params import parse_params
from dpclip.run_keys import configured_runs


def test_the_resnet_has_the_documented_shape_and_no_batch_norm():
    model = build_model("resnet", (3, 32, 32), 10, [])
    assert count_parameters(model) == 78_042  # the docstring's count, by hand below
    # stem 3*16*9 + GN 32; stage1 2 * (16*16*9 + 32); stage2 16*32*9 + 32*32*9 + 2*64 +
    # shortcut 16*32 + 64; stage3 32*64*9 + 64*64*9 + 2*128 + shortcut 32*64 + 128; head 650
    assert 432 + 32 + 2 * (2304 + 32) + (4608 + 9216 + 128 + 512 + 64) + \
        (18432 + 36864 + 256 + 2048 + 128) + 650 == 78_042
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert layer_names("resnet", [])[:2] == ["stem", "stem_norm"]
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(DpclipError, match="'resnet' needs images of at least 8x8"):
        build_model("resnet", (64,), 10, [])


def _cifar_batches(folder, records: int = 40):
    """CIFAR-10 python batches whose class shows in the image's mean colour."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in ("data_batch_1", "test_batch"):
        labels = np.arange(records) % 10
        images = rng.integers(0, 128, (records, 3072)) + 12 * labels[:, None]
        with open(folder / name, "wb") as fh:
            pickle.dump({"data": images.astype(np.uint8), "labels": list(labels)}, fh)


def test_the_resnet_trains_privately_through_the_stages_on_cifar10_batches(tmp_path,
                                                                         write_params):
    _cifar_batches(tmp_path / "cifar-10-batches-py")
    raw = merged(tiny_project_params(), {
        "data": {"dataset": "cifar10", "path": str(tmp_path)},
        "train": {"model": "resnet", "hidden": [], "methods": ["dp_sgd"], "epochs": 1,
                  "batch_size": 16},
        "attack": {"references": 0}, "audit": {"kinds": []}})
    base = ["--params", str(write_params(raw)), "--root", str(tmp_path), "--quiet"]
    for stage in (["check"], ["prepare"], ["partition", "--alpha", "iid"], ["train"]):
        assert main([*base, *stage]) == 0, stage
    layout = Layout(tmp_path)
    (key,) = configured_runs(parse_params(raw))
    weights = torch.load(layout.run_dir(key.name) / "model.pt", weights_only=False)
    assert "stage3.shortcut.norm.weight" in weights["state_dict"]
    record = read_json(layout.run_dir(key.name) / "record.json")
    assert record["dataset"] == "cifar10" and 0 < record["privacy"]["epsilon"] <= 8.0
