"""Public data stays public (docs/privacy.md, "Public data"): a shadow dataset that is the main
dataset is refused, and everything fitted to encode a CSV (medians, means, stds, vocabularies,
the class list) comes from the public shadow_train rows or from data.categories only.

Expected statistics are computed here by hand from the rows the prepare stage put in the
public shadow_train split, straight from the Python lists the CSVs were written from."""

from __future__ import annotations

import gzip
import shutil
import struct

import numpy as np
import pytest

from dpclip.stage_outputs import load_split
from dpclip.pipeline.params import parse_params
from dpclip.data.idx import IDX_FILES
from dpclip.errors import DpclipError
from dpclip.files import read_json
from dpclip.layout import Layout
from dpclip.stages.prepare import prepare

CITIES = ["paris", "rome", "oslo"]
ELSEWHERE = ["lima", "kyiv", "baku"]  # a public population no main record can equal
MEMBER = 8  # a record that the seeded split of rows(60, ...) puts in target_train


def rows(n: int, seed: int, age_offset: float = 0.0, cities=CITIES) -> list[dict]:
    """n records: a numeric age (some missing), a city (some missing), a yes/no label."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        age = "?" if i % 7 == 3 else str(int(rng.integers(20, 70) + age_offset))
        # outside the main population no record misses both (that would equal a main record)
        both_missing_allowed = cities is CITIES or age != "?"
        city = "" if i % 9 == 4 and both_missing_allowed else cities[int(rng.integers(0, 3))]
        out.append({"age": age, "city": city, "label": ["no", "yes"][i % 2]})
    return out


def write_csv(path, records: list[dict]) -> str:
    lines = ["age,city,label"] + [f"{r['age']},{r['city']},{r['label']}" for r in records]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def write_idx_folder(folder, n: int = 60, seed: int = 0) -> None:
    """The four MNIST IDX files (gzip), random pixels, labels 0..9 in turn."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    for key, filename in IDX_FILES.items():
        array = (rng.integers(0, 256, (n, 28, 28)) if "images" in key else np.arange(n) % 10)
        header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(
            f">{array.ndim}I", *array.shape)
        with gzip.open(folder / filename, "wb") as fh:
            fh.write(header + array.astype(np.uint8).tobytes())


def csv_params(tiny_raw, path: str, **data):
    return parse_params(tiny_raw(data={"dataset": "csv", "path": path, "target": "label",
                                       **data}))


def hand_statistics(records: list[dict], rows_: np.ndarray) -> dict[str, float]:
    """Median of the present ages of ``rows_``; mean and population std after imputing it."""
    ages = [records[i]["age"] for i in rows_]
    present = np.array([float(a) for a in ages if a != "?"])
    median = float(np.median(present))
    imputed = np.array([median if a == "?" else float(a) for a in ages])
    return {"median": median, "mean": float(imputed.mean()), "std": float(imputed.std())}


def column(layout: Layout, split: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(values of the encoded feature ``name``, original record index) of one split."""
    names = read_json(layout.prepared_meta)["info"]["feature_names"]
    x, _, index = load_split(layout, split)
    return x[:, names.index(name)], index


def refused(params, layout: Layout, *fragments: str) -> str:
    with pytest.raises(DpclipError) as info:
        prepare(params, layout)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    assert not layout.prepared.exists()  # refused before anything was written
    return message


# --------------------------------------------------------------------------------------------
# bug 2: the main dataset as its own "public" shadow dataset


def test_main_dataset_named_as_shadow_dataset_is_refused(tmp_path, tiny_raw):
    params = parse_params(tiny_raw(data={"dataset": "digits", "shadow_dataset": "digits"}))
    refused(params, Layout(tmp_path), "data.shadow_dataset", "'digits'")


def test_main_csv_as_shadow_dataset_is_refused_by_path_and_by_content(tmp_path, tiny_raw):
    records = rows(60, seed=0)
    main = write_csv(tmp_path / "main.csv", records)
    # the same name and path
    same = csv_params(tiny_raw, main, shadow_dataset="csv", shadow_path=main)
    refused(same, Layout(tmp_path / "a"), "data.shadow_dataset", "'csv'")
    # a byte-identical copy under another path
    copy = shutil.copy(main, tmp_path / "public.csv")
    refused(csv_params(tiny_raw, main, shadow_dataset="csv", shadow_path=str(copy)),
            Layout(tmp_path / "b"), "data.shadow_dataset", "equal a record")
    # the same records in another order (and another spelling of the whitespace)
    shuffled = write_csv(tmp_path / "shuffled.csv", records[::-1])
    refused(csv_params(tiny_raw, main, shadow_dataset="csv", shadow_path=shuffled),
            Layout(tmp_path / "c"), "data.shadow_dataset", "equal a record")


def test_copy_of_the_main_idx_folder_as_shadow_dataset_is_refused(tmp_path, tiny_raw):
    write_idx_folder(tmp_path / "mnist")
    shutil.copytree(tmp_path / "mnist", tmp_path / "copy")
    for shadow in ("mnist", "fashion-mnist"):  # the name does not matter, the content does
        params = parse_params(tiny_raw(data={
            "dataset": "mnist", "path": str(tmp_path / "mnist"), "shadow_dataset": shadow,
            "shadow_path": str(tmp_path / "copy")}))
        refused(params, Layout(tmp_path / shadow), "data.shadow_dataset", "equal a record")


def test_csv_beside_an_image_dataset_is_refused(tmp_path, tiny_raw):
    path = write_csv(tmp_path / "public.csv", rows(60, seed=1))
    params = parse_params(tiny_raw(data={"dataset": "digits", "target": "label",
                                         "shadow_dataset": "csv", "shadow_path": path}))
    refused(params, Layout(tmp_path), "data.shadow_dataset", "cannot be paired")


def test_images_record_that_nothing_is_fitted(tmp_path, tiny_raw):
    meta = prepare(parse_params(tiny_raw()), Layout(tmp_path))
    assert meta["preprocessing"] == {"fitted_on": "nothing: fixed scaling, no statistics fitted",
                                     "vocabulary": None}


# --------------------------------------------------------------------------------------------
# bug 3: CSV preprocessing fitted on public rows only


def test_csv_statistics_and_vocabulary_come_from_the_public_rows(tmp_path, tiny_raw):
    records = rows(60, seed=0)
    records[MEMBER]["city"] = "zurich"  # a level held by one record only, a member
    params = csv_params(tiny_raw, write_csv(tmp_path / "t.csv", records))
    layout = Layout(tmp_path)
    meta = prepare(params, layout)
    public = load_split(layout, "shadow_train")[2]
    members = load_split(layout, "target_train")[2]
    assert MEMBER in members and MEMBER not in public

    expected = hand_statistics(records, public)
    # members are encoded with the public statistics (missing ages -> the public median)
    age, index = column(layout, "target_train", "age")
    raw = [expected["median"] if records[i]["age"] == "?" else float(records[i]["age"])
           for i in index]
    assert age == pytest.approx((np.array(raw) - expected["mean"]) / expected["std"], abs=1e-5)
    # the member's own level is no column: it is "other"; missing and other always exist
    names = meta["info"]["feature_names"]
    assert [n for n in names if n.startswith("city=")] == [
        "city=oslo", "city=paris", "city=rome", "city=<missing>", "city=other"]
    other, index = column(layout, "target_train", "city=other")
    assert other[list(index).index(MEMBER)] == 1 and other.sum() == 1
    # and meta.json says so
    assert meta["preprocessing"]["statistics"]["age"] == pytest.approx(expected)
    assert meta["preprocessing"]["fitted_on"] == f"public shadow_train split of t.csv " \
                                                 f"({len(public)} rows)"
    assert meta["preprocessing"]["vocabulary"] == "public rows"


def test_changing_a_private_record_changes_nothing_fitted(tmp_path, tiny_raw):
    records = rows(60, seed=0)
    changed = [dict(r) for r in records]
    changed[MEMBER].update(age="9999", city="atlantis")
    metas, public_x = [], []
    for name, recs in (("a", records), ("b", changed)):
        layout = Layout(tmp_path / name)
        (tmp_path / name).mkdir()
        metas.append(prepare(csv_params(tiny_raw, write_csv(tmp_path / name / "t.csv", recs)),
                             layout))
        public_x.append(load_split(layout, "shadow_train")[0])
        assert MEMBER in load_split(layout, "target_train")[2]
    assert metas[0]["info"]["feature_names"] == metas[1]["info"]["feature_names"]
    assert metas[0]["classes"] == metas[1]["classes"]
    assert np.array_equal(public_x[0], public_x[1])
    assert metas[0]["preprocessing"] == metas[1]["preprocessing"]


def test_separate_csv_shadow_dataset_fits_the_encoding_for_both(tmp_path, tiny_raw):
    main_records = rows(60, seed=0)
    public_records = rows(80, seed=1, age_offset=100.0, cities=ELSEWHERE)  # another population
    params = csv_params(tiny_raw, write_csv(tmp_path / "main.csv", main_records),
                        shadow_dataset="csv",
                        shadow_path=write_csv(tmp_path / "public.csv", public_records))
    layout = Layout(tmp_path)
    meta = prepare(params, layout)
    public = load_split(layout, "shadow_train")[2]
    expected = hand_statistics(public_records, public)
    # the main table is encoded with the public statistics, to the same width
    age, index = column(layout, "target_train", "age")
    raw = [expected["median"] if main_records[i]["age"] == "?" else float(main_records[i]["age"])
           for i in index]
    assert age == pytest.approx((np.array(raw) - expected["mean"]) / expected["std"], abs=1e-5)
    widths = {load_split(layout, s)[0].shape[1] for s in meta["sizes"]}
    assert widths == {meta["feature_shape"][0]}
    assert meta["preprocessing"]["statistics"]["age"] == pytest.approx(expected)
    assert meta["preprocessing"]["fitted_on"] == f"public shadow_train split of public.csv " \
                                                 f"({len(public)} rows)"


def test_public_csv_with_other_columns_is_refused(tmp_path, tiny_raw):
    main = write_csv(tmp_path / "main.csv", rows(60, seed=0))
    other = tmp_path / "public.csv"
    other.write_text("age,town,label\n" + "".join(f"{20 + i},x{i % 3},{['no', 'yes'][i % 2]}\n"
                                                  for i in range(40)))
    params = csv_params(tiny_raw, main, shadow_dataset="csv", shadow_path=str(other))
    refused(params, Layout(tmp_path), "data.shadow_path", "same columns")


def test_no_public_rows_is_refused(tmp_path, tiny_raw):
    split = {"target_train": 0.6, "target_holdout": 0.4, "shadow_train": 0.0,
             "shadow_holdout": 0.0}
    params = csv_params(tiny_raw, write_csv(tmp_path / "t.csv", rows(60, seed=0)), split=split)
    refused(params, Layout(tmp_path), "data.split.shadow_train", "data.shadow_dataset")


def test_a_class_held_only_by_members_is_refused_unless_listed(tmp_path, tiny_raw):
    records = rows(60, seed=0)
    records[5]["label"] = "maybe"  # a class of one record: stratification puts it in target_train
    path = write_csv(tmp_path / "t.csv", records)
    message = refused(csv_params(tiny_raw, path), Layout(tmp_path / "a"), "data.categories",
                      "1 label(s)", "target_train", "data.categories.label")
    assert "private" in message and "maybe" not in message  # a member's label stays private
    # listed in the schema, the class is public knowledge and the run goes ahead
    layout = Layout(tmp_path / "b")
    meta = prepare(csv_params(tiny_raw, path, categories={"label": ["no", "yes", "maybe"]}),
                   layout)
    assert meta["classes"] == ["no", "yes", "maybe"] and meta["n_classes"] == 3
    _, y, index = load_split(layout, "target_train")
    assert y[list(index).index(5)] == 2


def test_data_categories_order_is_the_encoding_order(tmp_path, tiny_raw):
    records = rows(60, seed=0)
    params = csv_params(tiny_raw, write_csv(tmp_path / "t.csv", records),
                        categories={"label": ["yes", "no"], "city": ["rome", "paris"]})
    layout = Layout(tmp_path)
    meta = prepare(params, layout)
    assert meta["classes"] == ["yes", "no"]
    assert meta["preprocessing"]["vocabulary"] == "data.categories"
    names = meta["info"]["feature_names"]
    # oslo is not in the schema: it is "other", even though public rows hold it
    assert [n for n in names if n.startswith("city=")] == [
        "city=rome", "city=paris", "city=<missing>", "city=other"]
    x, y, index = load_split(layout, "target_train")
    assert y.tolist() == [0 if records[i]["label"] == "yes" else 1 for i in index]
    oslo = [records[i]["city"] == "oslo" for i in index]
    assert x[oslo, names.index("city=other")].tolist() == [1.0] * sum(oslo)


def test_a_public_dataset_partly_made_of_main_records_is_refused(tmp_path, tiny_raw):
    """A subset of the main records mixed with new ones is not public data; the count of shared
    records is what the message gives, never the records."""
    main_records = rows(60, seed=0)
    fresh = rows(40, seed=1, age_offset=100.0, cities=ELSEWHERE)  # equal to no main record
    mixed = write_csv(tmp_path / "mixed.csv", main_records[:20] + fresh)
    params = csv_params(tiny_raw, write_csv(tmp_path / "main.csv", main_records),
                        shadow_dataset="csv", shadow_path=mixed)
    message = refused(params, Layout(tmp_path / "a"), "data.shadow_max_shared",
                      "20 of its 60 records equal a record")
    assert "paris" not in message and "rome" not in message and "oslo" not in message


def test_a_few_shared_records_are_allowed_up_to_data_shadow_max_shared(tmp_path, tiny_raw):
    """Two people can hold the same record: one shared record in 41 passes the default 1%
    only when allowed (1/41 > 0.01), and 0 refuses any."""
    main_records = rows(60, seed=0)
    public = write_csv(tmp_path / "public.csv",
                       main_records[:1] + rows(40, seed=1, age_offset=100.0, cities=ELSEWHERE))
    main = write_csv(tmp_path / "main.csv", main_records)
    for allowed, accepted in ((0.0, False), (0.01, False), (0.025, True)):
        params = csv_params(tiny_raw, main, shadow_dataset="csv", shadow_path=public,
                            shadow_max_shared=allowed)
        layout = Layout(tmp_path / str(allowed))
        if accepted:
            assert prepare(params, layout)["sizes"]["shadow_train"] > 0
        else:
            refused(params, layout, "1 of its 41 records", f"data.shadow_max_shared {allowed!r}")


def test_data_shadow_max_shared_must_be_a_fraction(tiny_raw):
    with pytest.raises(DpclipError, match=r"data\.shadow_max_shared.*1\.5"):
        parse_params(tiny_raw(data={"shadow_max_shared": 1.5}))


def test_a_bad_private_cell_is_located_but_not_shown(tmp_path, tiny_raw):
    records = rows(60, seed=0)
    records[MEMBER]["age"] = "secret-41"
    params = csv_params(tiny_raw, write_csv(tmp_path / "t.csv", records),
                        numeric_columns=["age"])
    message = refused(params, Layout(tmp_path), "column 'age'", f"data row {MEMBER}",
                      "data.missing_values")
    assert "secret" not in message


# --------------------------------------------------------------------------------------------
# a documented setting at the defaults: MNIST with Fashion-MNIST as the public data


def test_mnist_with_fashion_mnist_as_public_data_runs_at_the_defaults(tmp_path, tiny_raw):
    # the defaults once stopped here: sanitize's keep_public_head (on) would have chosen the
    # released head by its accuracy on another dataset's task; auto turns it off there
    from dpclip.runner import run_stages

    write_idx_folder(tmp_path / "mnist", n=400)
    write_idx_folder(tmp_path / "fashion", n=400, seed=1)
    raw = tiny_raw(data={"dataset": "mnist", "path": str(tmp_path / "mnist"),
                         "shadow_dataset": "fashion-mnist",
                         "shadow_path": str(tmp_path / "fashion")},
                   train={"methods": ["dp_sgd", "sanitize"], "epochs": 1},
                   audit={"kinds": []}, attack={"references": 0},
                   shadow={"epochs": 1, "max_records": 200}, evaluate={"ir_attack": False})
    params = parse_params(raw)
    assert params.method_options("sanitize").keep_public_head == "auto"  # as written
    layout = Layout(tmp_path / "project")
    run_stages(params, layout, progress=False, track=False)
    record = read_json(layout.run_dir("sanitize-eps8-iid-seed0") / "record.json")
    assert record["training"]["keep_public_head"] is False  # what auto chose here
    assert "head_kept" not in record["training"]
    assert (layout.reports / "comparison.csv").is_file()
    # the same data as its own public split (no shadow_dataset): auto keeps the better head
    same = parse_params(tiny_raw(data={"dataset": "mnist", "path": str(tmp_path / "mnist")},
                                 train={"methods": ["sanitize"]}))
    from dpclip.methods import get_method

    assert get_method("sanitize").resolved_options(same.method_options("sanitize"),
                                                   same).keep_public_head is True
