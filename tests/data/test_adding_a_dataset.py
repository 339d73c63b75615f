"""Adding a dataset source is one new file: the example of docs/adding-a-dataset.md, dropped
into a plugin folder of the sources package, is found, validated, read and split by the
prepare stage, and trained and evaluated on, with no other edit."""

from __future__ import annotations


import numpy as np
import pytest
from conftest import docs_example

from dpclip.pipeline.params import parse_params
from dpclip.data.sources import available_sources
from dpclip.errors import ConfigError
from dpclip.files import read_json
from dpclip.layout import Layout
from dpclip.stages.evaluate import evaluate
from dpclip.stages.partition import partition
from dpclip.stages.prepare import prepare
from dpclip.stages.train import train


@pytest.fixture
def breast_cancer(plugin):
    """The documented module dropped into a folder the sources package searches."""
    return plugin("dpclip.data.sources", "breast_cancer", docs_example("adding-a-dataset.md"))


def test_the_documented_source_is_read_split_trained_and_evaluated(breast_cancer, tiny_raw,
                                                                   tmp_path):
    assert breast_cancer in available_sources()
    with pytest.raises(ConfigError, match=r"data\.dataset: 'breast_cancr' is not one of"):
        parse_params(tiny_raw(data={"dataset": "breast_cancr"}))
    params = parse_params(tiny_raw(
        data={"dataset": breast_cancer}, train={"methods": ["dp_sgd"], "epochs": 2},
        evaluate={"ir_attack": False}, audit={"kinds": []}, attack={"references": 0}))
    layout = Layout(tmp_path)
    meta = prepare(params, layout)
    assert meta["feature_shape"] == [30] and meta["classes"] == ["malignant", "benign"]
    assert sum(meta["sizes"].values()) == 569  # every record in exactly one split
    x = np.load(layout.prepared / "target_train.npz")["x"]
    assert np.isfinite(x).all() and np.abs(x).max() < 1  # log(v + 0.001) / 10
    partition(params, "iid", layout)
    train(params, "dp_sgd", 8, "iid", 0, layout, progress=False)
    metrics = evaluate(params, "dp_sgd", 8, "iid", 0, layout)
    assert metrics["dataset"] == breast_cancer and 0 <= metrics["utility"]["accuracy"] <= 1
    assert read_json(layout.prepared_meta)["dataset"] == breast_cancer


def test_the_documented_sources_option_is_validated_by_name_and_reaches_it_typed(
        breast_cancer, tiny_raw):
    from dpclip.data import read_source

    with pytest.raises(ConfigError, match=r"data\.log_offset: 0 .*greater than 0"):
        parse_params(tiny_raw(data={"dataset": breast_cancer, "log_offset": 0}))
    with pytest.raises(ConfigError, match=r"data\.log_ofset: 1 is not a known key"):
        parse_params(tiny_raw(data={"dataset": breast_cancer, "log_ofset": 1}))
    default = read_source(breast_cancer, None,
                          parse_params(tiny_raw(data={"dataset": breast_cancer})).data)
    shifted = read_source(breast_cancer, None, parse_params(tiny_raw(
        data={"dataset": breast_cancer, "log_offset": 1.0})).data)
    # log(v + 1) / 10 >= 0 for v >= 0; with 0.001 a zero feature gives log(0.001) / 10 < 0
    assert shifted.x.min() >= 0 > default.x.min()


def test_a_source_whose_data_is_not_of_its_kind_is_refused(plugin, tiny_raw):
    """The kind decides the encoding (a table's is fitted on public rows only): a source that
    declares ``table`` and reads arrays is stopped, naming both."""
    from dpclip.data import read_source
    from dpclip.errors import DpclipError

    source = docs_example("adding-a-dataset.md").replace('kind = "arrays"', 'kind = "table"') \
        .replace('name = "breast_cancer"', 'name = "mislabelled"')
    plugin("dpclip.data.sources", "mislabelled", source)
    params = parse_params(tiny_raw(data={"dataset": "mislabelled"}))
    with pytest.raises(DpclipError, match="declares kind 'table' but read a Dataset"):
        read_source("mislabelled", None, params.data)
