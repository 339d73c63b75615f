"""Dataset sources on small files the tests make in the real formats (IDX, CIFAR pickles,
CSV), and the prepare / partition stages on them."""

from __future__ import annotations

import gzip
import pickle
import struct
import urllib.error

import numpy as np
import pytest

from dpclip.stage_outputs import load_split
from dpclip.pipeline.params import parse_params
from dpclip.data import fit_encoder, read_source
from dpclip.data.idx import IDX_FILES, read_idx
from dpclip.errors import DpclipError
from dpclip.layout import Layout
from dpclip.stages.partition import partition
from dpclip.stages.prepare import prepare


def write_idx(path, array: np.ndarray) -> None:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I",
                                                                    *array.shape)
    with gzip.open(path, "wb") as fh:
        fh.write(header + array.astype(np.uint8).tobytes())


def make_idx_folder(folder, n_train=120, n_test=40, seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {"train_images": rng.integers(0, 256, (n_train, 28, 28)),
              "train_labels": np.arange(n_train) % 10,
              "test_images": rng.integers(0, 256, (n_test, 28, 28)),
              "test_labels": np.arange(n_test) % 10}
    for key, filename in IDX_FILES.items():
        write_idx(folder / filename, arrays[key])
    return arrays


def test_idx_round_trip(tmp_path):
    arrays = make_idx_folder(tmp_path / "mnist")
    images = read_idx(tmp_path / "mnist" / IDX_FILES["train_images"])
    assert images.shape == (120, 28, 28) and np.array_equal(images, arrays["train_images"])


def test_idx_dataset_scales_pixels_and_joins_train_and_test(tmp_path, tiny_raw):
    arrays = make_idx_folder(tmp_path / "mnist")
    params = parse_params(tiny_raw(data={"dataset": "mnist", "path": str(tmp_path / "mnist")}))
    ds = read_source("mnist", str(tmp_path / "mnist"), params.data)
    assert ds.x.shape == (160, 1, 28, 28) and ds.x.max() <= 1.0
    assert ds.x[0, 0, 3, 4] == pytest.approx(arrays["train_images"][0, 3, 4] / 255.0)
    assert ds.y.tolist()[:12] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]


def test_truncated_idx_file_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.gz"
    with gzip.open(path, "wb") as fh:
        fh.write(struct.pack(">HBB", 0, 8, 1) + struct.pack(">I", 50) + b"\x01" * 10)
    with pytest.raises(DpclipError, match="holds 10 values"):
        read_idx(path)


def test_missing_idx_files_offline_is_a_clear_error(tmp_path, tiny_raw, monkeypatch):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.setattr("urllib.request.urlopen", offline)
    params = parse_params(tiny_raw(data={"dataset": "mnist", "path": str(tmp_path / "none")}))
    with pytest.raises(DpclipError) as info:
        read_source("mnist", str(tmp_path / "none"), params.data)
    message = str(info.value)
    assert "data.path" in message and "offline" in message and "unreachable" in message
    assert not list((tmp_path / "none").glob("*.gz"))  # nothing half-downloaded left behind


def test_download_with_wrong_checksum_is_rejected(tmp_path, tiny_raw, monkeypatch):
    import io

    monkeypatch.setattr("urllib.request.urlopen",
                        lambda *a, **k: io.BytesIO(b"not the real file"))
    params = parse_params(tiny_raw(data={"dataset": "mnist", "path": str(tmp_path / "m")}))
    with pytest.raises(DpclipError, match="checksum mismatch"):
        read_source("mnist", str(tmp_path / "m"), params.data)
    assert not list((tmp_path / "m").glob("*.gz"))


def test_cifar10_batches(tmp_path, tiny_raw):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in ("data_batch_1", "test_batch"):
        entry = {"data": rng.integers(0, 256, (20, 3072), dtype=np.uint8),
                 "labels": list(np.arange(20) % 10)}
        with open(folder / name, "wb") as fh:
            pickle.dump(entry, fh)
    params = parse_params(tiny_raw(data={"dataset": "cifar10", "path": str(tmp_path)}))
    ds = read_source("cifar10", str(tmp_path), params.data)
    assert ds.x.shape == (40, 3, 32, 32) and ds.feature_shape == (3, 32, 32)


CSV = """age,city,income,label
30,paris,1000,yes
40,rome,?,no
50,paris,3000,yes
,rome,4000,no
60,?,5000,yes
20,oslo,2000,no
"""


def test_csv_encoding_standardises_one_hot_encodes_and_counts_missing(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(CSV)
    table = read_source("csv", str(path), parse_params({"data": {
        "dataset": "csv", "path": str(path), "target": "label"}}).data)
    encoder = fit_encoder(table, np.array([0, 1, 2]), None, "rows 0-2")
    assert list(encoder.numeric) == ["age", "income"] and list(encoder.levels) == ["city"]
    ds = encoder.transform(table)
    assert ds.classes == ["no", "yes"] and ds.y.tolist() == [1, 0, 1, 0, 1, 0]
    info = ds.info
    assert info["missing_values"] == {"age": 1, "income": 1, "city": 1}
    # age: fit rows 30, 40, 50 -> median 40, mean 40, std sqrt(200/3); row 3 (missing) -> 40
    age = ds.x[:, info["feature_names"].index("age")]
    std = np.sqrt(200 / 3)
    assert age[:4] == pytest.approx([-10 / std, 0, 10 / std, 0], abs=1e-6)
    # income: fit rows 1000, (missing -> median of 1000, 3000 = 2000), 3000
    income = ds.x[:, info["feature_names"].index("income")]
    assert income[1] == pytest.approx(0.0, abs=1e-6)
    # one-hot: every row has exactly one city column set; missing and unseen levels have
    # their own columns (oslo is not among the fit rows: it is "other")
    city_cols = [i for i, n in enumerate(info["feature_names"]) if n.startswith("city=")]
    assert [info["feature_names"][i] for i in city_cols] == [
        "city=paris", "city=rome", "city=<missing>", "city=other"]
    assert np.all(ds.x[:, city_cols].sum(axis=1) == 1)
    assert ds.x[5, info["feature_names"].index("city=other")] == 1
    assert ds.x[4, info["feature_names"].index("city=<missing>")] == 1


def test_csv_without_target_column_names_the_key(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(CSV)
    with pytest.raises(DpclipError, match="data.target: 'outcome'"):
        read_source("csv", str(path), parse_params({"data": {
            "dataset": "csv", "path": str(path), "target": "outcome"}}).data)


def test_csv_non_numeric_value_in_numeric_column(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(CSV.replace("50,paris,3000", "fifty,paris,3000"))
    table = read_source("csv", str(path), parse_params({"data": {
        "dataset": "csv", "path": str(path), "target": "label"}}).data)
    encoder = fit_encoder(table, np.array([0, 1, 3, 4, 5]), None, "rows without 'fifty'")
    with pytest.raises(DpclipError) as info:
        encoder.transform(table)
    assert "data.path" in str(info.value)
    # the column and the data row (0-based) locate the cell; the value itself may be private
    assert "'age'" in str(info.value) and "data row 2" in str(info.value)
    assert "fifty" not in str(info.value)


def test_csv_missing_file_names_the_key(tmp_path):
    with pytest.raises(DpclipError, match="data.path"):
        read_source("csv", str(tmp_path / "nope.csv"), parse_params({"data": {
            "dataset": "csv", "path": str(tmp_path / "nope.csv"), "target": "y"}}).data)


def test_csv_without_header_uses_given_columns(tmp_path):
    path = tmp_path / "heart.data"
    path.write_text("63.0,1.0,0\n67.0,?,2\n41.0,0.0,0\n")
    table = read_source("csv", str(path), parse_params({"data": {
        "dataset": "csv", "path": str(path), "target": "num",
        "columns": ["age", "sex", "num"]}}).data)
    encoder = fit_encoder(table, np.arange(3), None, "all rows")
    assert list(encoder.numeric) == ["age", "sex"] and encoder.classes == ["0", "2"]


def test_prepare_and_partition_on_digits(tmp_path, tiny_raw):
    params = parse_params(tiny_raw(partition={"alphas": ["iid", 0.3]}))
    layout = Layout(tmp_path)
    meta = prepare(params, layout)
    assert sum(meta["sizes"].values()) == 1797
    indices = [load_split(layout, s)[2] for s in meta["sizes"]]
    joined = np.concatenate(indices)
    assert len(np.unique(joined)) == len(joined)  # disjoint splits
    record = partition(params, 0.3, layout)
    positions = np.array(record["positions"])
    assert len(np.unique(positions)) == len(positions) == record["size"]
    assert (layout.partition("0.3") / "histogram.png").exists()
    assert partition(params, "iid", layout)["size"] == meta["sizes"]["target_train"]
    # deterministic: the same alpha gives the same subset
    assert partition(params, 0.3, layout)["positions"] == record["positions"]


def test_separate_public_shadow_dataset(tmp_path, tiny_raw):
    make_idx_folder(tmp_path / "mnist", seed=0)
    make_idx_folder(tmp_path / "fashion", seed=1)
    params = parse_params(tiny_raw(data={
        "dataset": "mnist", "path": str(tmp_path / "mnist"),
        "shadow_dataset": "fashion-mnist", "shadow_path": str(tmp_path / "fashion")}))
    layout = Layout(tmp_path / "proj")
    meta = prepare(params, layout)
    # main: 160 records into train/holdout (0.4 : 0.2); public: 160 into shadow (0.2 : 0.2)
    assert meta["sizes"]["target_train"] + meta["sizes"]["target_holdout"] == 160
    assert meta["sizes"]["shadow_train"] + meta["sizes"]["shadow_holdout"] == 160


def test_a_target_map_merges_label_values_like_heart_num_above_zero(tmp_path):
    path = tmp_path / "heart.data"
    path.write_text("63,0\n67,2\n41,0\n56,1\n57,4\n")
    raw = {"dataset": "csv", "path": str(path), "target": "num", "columns": ["age", "num"],
           "target_map": {2: 1, "3": "1", 4: 1}}  # YAML may read the values as numbers
    table = read_source("csv", str(path), parse_params({"data": raw}).data)
    assert table.labels.tolist() == ["0", "1", "0", "1", "1"]  # "3" is absent: allowed
    with pytest.raises(DpclipError, match="data.target_map: none of"):
        read_source("csv", str(path), parse_params({"data": {**raw, "target_map": {7: 1}}}).data)


def test_the_csv_sources_keys_are_its_options_and_read_back_as_written():
    """``data.target`` and the other CSV keys belong to the csv source's Options model: the
    schema (dpclip.config) has none of them; they survive a round trip through the parsed
    parameters (what tuning's with_values does) and are shown under their written names."""
    from dpclip.config import DataParams
    from dpclip.pipeline.tuned import with_values

    assert not {"target", "categories", "missing_values"} & set(DataParams.model_fields)
    params = parse_params({"data": {"dataset": "csv", "path": "bc.csv", "target": "num",
                                    "target_map": {2: 1}}})
    assert params.data.options["csv"]["target_map"] == {"2": "1"}  # levels as text
    again = with_values(params, {"train.lr": 0.1})
    assert again.data.options == params.data.options and again.train.lr == 0.1
    written = params.data.as_written()
    assert written["target"] == "num" and "options" not in written
    assert "target" not in parse_params({}).data.as_written()  # digits has no CSV keys


def test_a_bad_csv_option_is_named_alone():
    """A failed csv option left the source without options, and the check then also claimed
    that data.target was missing."""
    from dpclip.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        parse_params({"data": {"dataset": "csv", "path": "x.csv", "target": "y",
                               "missing_values": "NA"}})
    assert "data.missing_values" in str(err.value) and "data.target" not in str(err.value)
