"""The prepared data's identity (``meta.json``'s ``dataset_id``), which results are filed under:
the same data gives the same one on any path, other data or another split another."""

from __future__ import annotations

import pandas as pd
from sklearn.datasets import load_breast_cancer

from dpclip.data.sources import dataset_label
from dpclip.layout import Layout
from dpclip.pipeline.params import parse_params
from dpclip.stages.prepare import prepare


def _csv(path, rows):
    frame = load_breast_cancer(as_frame=True).frame.head(rows)
    frame.to_csv(path, index=False)
    return path


def test_each_dataset_and_split_has_its_own_identity_and_a_copy_keeps_it(tmp_path, tiny_raw):
    def identity(folder, **data):
        params = parse_params(tiny_raw(data={"target": "target", "dataset": "csv", **data}))
        return prepare(params, Layout(tmp_path / folder))["dataset_id"]

    first = identity("a", path=str(_csv(tmp_path / "cancer.csv", 300)))
    (tmp_path / "copy").mkdir()
    assert identity("b", path=str(_csv(tmp_path / "copy" / "cancer.csv", 300))) == first
    assert first.startswith("csv-cancer-") and len(first) == len("csv-cancer-") + 8
    # other rows of one file name, another split of the same rows: other data
    assert identity("c", path=str(_csv(tmp_path / "copy" / "cancer.csv", 280))) != first
    assert identity("d", path=str(_csv(tmp_path / "cancer.csv", 300)), seed=1) != first
    digits = prepare(parse_params(tiny_raw()), Layout(tmp_path / "e"))
    assert digits["dataset_id"].startswith("digits-")


def test_the_label_is_safe_in_a_key_and_a_path(tiny_raw):
    data = parse_params(tiny_raw(data={"dataset": "csv", "path": "my data (v2).csv",
                                       "target": "y"})).data
    assert dataset_label(data) == "csv-my_data_v2_"
