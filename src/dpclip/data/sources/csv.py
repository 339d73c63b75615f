"""``csv``: a table of your own, one record per row, the label in ``data.target``. It is read
as text (:mod:`dpclip.data.tabular`) and encoded by the prepare stage with statistics and
vocabularies fitted on public rows only."""

from __future__ import annotations

from dpclip.data.sources.base import DataSource, register
from dpclip.data.tabular import CsvTable, read_csv_table
from dpclip.errors import bad_value


@register
class Csv(DataSource):
    name = "csv"
    kind = "table"
    description = "a CSV file of your own (data.target names the label column)"
    needs_path = True
    path_help = "the CSV file"

    @classmethod
    def check(cls, data, role: str) -> list[str]:
        problems = super().check(data, role)
        if role == "data.dataset" and data.target is None:
            problems.append(bad_value("data.target", None, "is required when data.dataset is "
                                                           "'csv' (the label column)"))
        return problems

    def read(self, path: str | None, data, key: str) -> CsvTable:
        return read_csv_table(path, data.target, columns=data.columns,
                              numeric_columns=data.numeric_columns,
                              categorical_columns=data.categorical_columns,
                              missing_values=data.missing_values,
                              target_map=data.target_map, key=key)
