"""``csv``: a table of your own, one record per row, the label in ``data.target``. It is read
as text (:mod:`dpclip.data.tabular`) and encoded by the prepare stage with statistics and
vocabularies fitted on public rows only. Its settings are the ``data.<key>`` of
:class:`Csv.Options`."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from dpclip.data.sources.base import DataSource, register
from dpclip.data.tabular import CsvTable, read_csv_table
from dpclip.errors import bad_value
from dpclip.param_types import Level, Section, Text


@register
class Csv(DataSource):
    name = "csv"
    kind = "table"
    description = "a CSV file of your own (data.target names the label column)"
    needs_path = True
    path_help = "the CSV file"

    class Options(Section):
        """``data.<key>`` of a CSV dataset (the public one, ``data.shadow_path``, alike)."""

        target: Text | None = None  # the label column
        # rename label values before anything reads them ({"2": "1"}: merge classes; Heart's
        # num > 0, Adult's ">50K." of its test file); values not listed stay as they are
        target_map: dict[Level, Level] | None = None
        columns: list[str] | None = None  # the file has no header row: these are its columns
        numeric_columns: list[str] | None = None  # force numeric (else inferred)
        categorical_columns: list[str] | None = None  # force categorical (else inferred)
        drop: list[str] | None = None  # columns left out (identifiers, dates, free text)
        missing_values: list[str] = ["", "?", "NA", "NaN", "nan"]
        # the public schema {column: [levels]}; the target's entry is the class list
        categories: dict[str, Annotated[list[Level], Field(min_length=1)]] | None = None

        @field_validator("categories")
        @classmethod
        def _levels_once(cls, value):
            for col, levels in (value or {}).items():
                if len(set(levels)) != len(levels):
                    raise ValueError(bad_value(f"data.categories.{col}", levels,
                                               "has repeated levels"))
            return value

    @classmethod
    def check(cls, data, role: str) -> list[str]:
        problems = super().check(data, role)
        if role == "data.dataset" and data.options.get(cls.name, {}).get("target") is None:
            problems.append(bad_value("data.target", None, "is required when data.dataset is "
                                                           "'csv' (the label column)"))
        return problems

    def read(self, path: str | None, data, key: str) -> CsvTable:
        o = self.options
        return read_csv_table(path, o.target, columns=o.columns,
                              numeric_columns=o.numeric_columns,
                              categorical_columns=o.categorical_columns, drop=o.drop,
                              missing_values=o.missing_values, target_map=o.target_map, key=key)
