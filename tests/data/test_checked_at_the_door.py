"""A CSV of the user's own is checked where it enters, before any private step: a target named
in another case gets a "did you mean", a label with one class is refused, and identifier, date
and free-text columns are refused by name (counts only) unless dropped or declared."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dpclip.data.tabular import did_you_mean, not_a_category, read_csv_table
from dpclip.errors import DpclipError


def _table(tmp_path, rows: int = 120, **columns) -> str:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"island": rng.choice(["A", "B", "C"], rows),
                          "mass": rng.normal(4000, 500, rows).round(),
                          "species": rng.choice(["Adelie", "Gentoo"], rows), **columns})
    path = tmp_path / "penguins.csv"
    frame.to_csv(path, index=False)
    return str(path)


def test_a_target_in_another_case_gets_a_did_you_mean(tmp_path):
    with pytest.raises(DpclipError, match=r"data.target: 'Species' is not a column of .*, "
                                          r"did you mean 'species'\?"):
        read_csv_table(_table(tmp_path), "Species")
    with pytest.raises(DpclipError, match=r"data.drop: 'mas' is not a feature column .*, "
                                          r"did you mean 'mass'\?"):
        read_csv_table(_table(tmp_path), "species", drop=["mas"])
    assert did_you_mean("xyz", ["island", "mass"]) == ""


def test_a_label_with_one_class_is_refused(tmp_path):
    path = _table(tmp_path)
    frame = pd.read_csv(path).assign(species="Adelie")
    frame.to_csv(path, index=False)
    with pytest.raises(DpclipError, match="data.target: 'species' has 1 distinct value.*at "
                                          "least two classes"):
        read_csv_table(path, "species")


def test_identifier_date_and_free_text_columns_are_named_and_a_drop_removes_them():
    rows = 100
    assert not_a_category(pd.Series([f"PAL{i:04d}" for i in range(rows)])).startswith(
        "an identifier (100 distinct values in 100 public rows)")
    assert not_a_category(pd.Series(pd.date_range("2007-11-01", periods=rows).astype(str))
                          ).startswith("dates")
    assert not_a_category(pd.Series([f"nest {i} was empty" for i in range(rows)])
                          ).startswith("free text")
    assert not_a_category(pd.Series(["A", "B", "C"] * 40)) is None  # a category repeats
    assert not_a_category(pd.Series([f"id{i}" for i in range(10)])) is None  # too few to tell


def test_prepare_refuses_an_identifier_column_until_it_is_dropped(tmp_path, write_params,
                                                                  capsys):
    from dpclip.cli import main

    ids = [f"PAL{i:04d}" for i in range(300)]
    path = _table(tmp_path, rows=300, **{"Sample Number": ids})
    raw = {"data": {"dataset": "csv", "path": path, "target": "species"}}
    base = ["--params", str(write_params(raw)), "--root", str(tmp_path), "--quiet"]
    assert main([*base, "prepare"]) == 2
    err = capsys.readouterr().err
    assert "column 'Sample Number'" in err and "looks like an identifier" in err
    assert "data.drop: ['Sample Number']" in err and "PAL0" not in err  # no value shown
    raw["data"]["drop"] = ["Sample Number"]
    base[1] = str(write_params(raw))
    assert main([*base, "prepare"]) == 0

