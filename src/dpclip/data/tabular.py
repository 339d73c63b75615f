"""Generic CSV source: a named target column, numeric columns standardised, categorical
columns one-hot encoded, missing values imputed and counted.

Reading and encoding are two steps: :func:`read_csv_table` reads the file as text and fits
nothing; :func:`fit_encoder` fits a :class:`CsvEncoder` (column kinds, medians, means, stds,
vocabularies, the class list) on *public rows only*, which then encodes every split, so the
width of the encoding never depends on private rows. See docs/privacy.md, "CSV data".
"""

from __future__ import annotations

import difflib
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from dpclip.data.dataset import Dataset
from dpclip.errors import DpclipError

# A column whose non-missing public cells are at least this fraction numeric is taken as a
# numeric column with a bad cell (an error), not as a categorical column.
NUMERIC_MAJORITY = 0.5
MISSING = "<missing>"
OTHER = "other"


@dataclass
class CsvTable:
    """A CSV read as text: feature columns and labels, nothing fitted yet."""

    path: Path
    frame: pd.DataFrame  # feature columns as text; missing cells are NaN
    labels: pd.Series  # the target column as text (never missing)
    target: str
    key: str = "data.path"  # the parameter that named the file, for error messages
    numeric_columns: list[str] = field(default_factory=list)  # declared by the user
    categorical_columns: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.frame)

    def strata(self) -> np.ndarray:
        """Label codes over the whole file, used only to stratify the splits on this machine;
        they never reach the model or meta.json (the class list comes from public rows)."""
        order = {label: code for code, label in enumerate(_class_order(self.labels))}
        return self.labels.map(order).to_numpy(dtype=np.int64)


@dataclass(frozen=True)
class CsvEncoder:
    """Everything fitted to encode a CSV, all of it from public rows or the public schema."""

    numeric: dict[str, dict[str, float]]  # column -> {"median", "mean", "std"}
    levels: dict[str, list[str]]  # categorical column -> vocabulary (without missing/other)
    classes: list[str]
    fitted_on: str  # which rows, for meta.json and the privacy record
    vocabulary: str  # "data.categories" | "public rows" | "data.categories and public rows"

    @property
    def feature_names(self) -> list[str]:
        names = list(self.numeric)
        for col, levels in self.levels.items():
            names += [f"{col}={level}" for level in [*levels, MISSING, OTHER]]
        return names

    def transform(self, table: CsvTable, rows: np.ndarray | None = None) -> Dataset:
        """Encode ``rows`` of ``table`` (all rows by default) with the fitted values; labels
        outside the class list become -1 (see :meth:`unknown_labels`)."""
        frame = table.frame if rows is None else table.frame.iloc[rows]
        labels = table.labels if rows is None else table.labels.iloc[rows]
        parts = [_standardised(_numbers(table, frame[col]), stats)
                 for col, stats in self.numeric.items()]
        parts += [_one_hot(frame[col], levels) for col, levels in self.levels.items()]
        x = np.concatenate(parts, axis=1) if parts else np.zeros((len(frame), 0))
        codes = {c: i for i, c in enumerate(self.classes)}
        y = labels.map(codes).fillna(-1).to_numpy(dtype=np.int64)
        return Dataset("csv", x, y, list(self.classes), (x.shape[1],), self.describe(table))

    def describe(self, table: CsvTable) -> dict:
        """The encoded columns, and the missing cells of ``table`` counted per column (a local
        diagnostic of the whole file; the encoding does not depend on it)."""
        missing = {col: int(n) for col, n in table.frame.isna().sum().items()}
        return {"source": str(table.path), "feature_names": self.feature_names,
                "numeric_columns": list(self.numeric), "categorical_columns": list(self.levels),
                "missing_values": missing, "missing_total": int(sum(missing.values()))}

    def unknown_labels(self, table: CsvTable, rows: np.ndarray) -> list[str]:
        """The labels of ``rows`` that are not in the class list (sorted)."""
        labels = table.labels.iloc[rows]
        return sorted(set(labels[~labels.isin(self.classes)]))

    def summary(self) -> dict:
        """The ``preprocessing`` entry of meta.json."""
        return {"fitted_on": self.fitted_on, "vocabulary": self.vocabulary,
                "statistics": self.numeric, "levels": self.levels}


# --------------------------------------------------------------------------------------------
# fitting (public rows only)


def fit_encoder(table: CsvTable, rows: np.ndarray, categories: dict[str, list[str]] | None,
                description: str) -> CsvEncoder:
    """Fit column kinds, medians, means, stds, vocabularies and the class list on ``rows`` of
    ``table`` (public rows) and the schema ``categories`` (``data.categories``).

    ``description`` says which rows these are, e.g. "public shadow_train split of adult.csv".
    """
    categories = categories or {}
    _check_schema(table, categories)
    if len(rows) == 0:
        raise DpclipError(f"data.split.shadow_train: no public rows to fit the CSV encoding on "
                          f"({description} is empty)")
    public = table.frame.iloc[rows]
    numeric, categorical = _column_kinds(table, public, categories)
    if not numeric and not categorical:
        raise DpclipError(f"{table.key}: {str(table.path)!r} has no feature column besides "
                          f"the target")
    stats = {col: _fit_numeric(_numbers(table, public[col])) for col in numeric}
    levels = {col: _vocabulary(public[col], categories.get(col)) for col in categorical}
    schema_cols = [col for col in categorical if col in categories]
    vocabulary = ("data.categories" if len(schema_cols) == len(categorical) else
                  "data.categories and public rows" if schema_cols else "public rows")
    classes = list(categories.get(table.target) or _class_order(table.labels.iloc[rows]))
    return CsvEncoder(stats, levels, classes, f"{description} ({len(rows)} rows)", vocabulary)


def _check_schema(table: CsvTable, categories: dict[str, list[str]]) -> None:
    columns = [*table.frame.columns, table.target]
    for col in categories:
        if col not in columns:
            raise DpclipError(f"data.categories.{col}: {col!r} is not a column of "
                              f"{str(table.path)!r} (columns: {columns})")
        if col in table.numeric_columns:
            raise DpclipError(f"data.categories.{col}: {col!r} is also listed in "
                              f"data.numeric_columns; a column is either numeric or categorical")


def _column_kinds(table: CsvTable, public: pd.DataFrame, categories: dict
                  ) -> tuple[list[str], list[str]]:
    """(numeric, categorical) feature columns: declared ones as declared, the rest numeric
    when most of their non-missing public cells are numbers. An inferred categorical column
    that looks like an identifier, a date or free text is refused (:func:`not_a_category`)."""
    numeric, categorical = [], []
    for col in table.frame.columns:
        cells = public[col].dropna()
        numbers = pd.to_numeric(cells, errors="coerce").notna().sum()
        if col in table.categorical_columns or col in categories:
            categorical.append(col)
        elif col in table.numeric_columns or (len(cells) and
                                              len(cells) - numbers < NUMERIC_MAJORITY * len(cells)):
            numeric.append(col)
        else:
            looks = not_a_category(cells)
            if looks:
                raise DpclipError(
                    f"{table.key}: column {col!r} of {str(table.path)!r} looks like {looks}, "
                    f"not a category: one-hot encoded it would add a feature per value. Leave "
                    f"it out (data.drop: [{col!r}]) or keep it as a category "
                    f"(data.categorical_columns: [{col!r}])")
            categorical.append(col)
    return numeric, categorical


def not_a_category(cells: pd.Series) -> str | None:
    """What a text column with too many distinct values looks like ("an identifier", "dates",
    "free text"), or None: a category repeats its levels. Counts only, on public rows."""
    cells = cells.astype(str)
    distinct = cells.nunique()
    if len(cells) < 20 or distinct <= max(20, len(cells) // 2):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pandas warns when it guesses a date format
        dates = pd.to_datetime(cells, errors="coerce").notna().mean()
    if dates > 0.9:
        return f"dates ({distinct} distinct values in {len(cells)} public rows)"
    if cells.str.contains(r"\s").mean() > 0.5:
        return f"free text ({distinct} distinct values in {len(cells)} public rows)"
    return f"an identifier ({distinct} distinct values in {len(cells)} public rows)"


def did_you_mean(name: str, choices: list[str]) -> str:
    """", did you mean 'x'?" for the closest choice (case aside first), or ""."""
    same = [c for c in choices if c.lower() == name.lower()]
    close = same or difflib.get_close_matches(name, choices, n=1)
    return f", did you mean {close[0]!r}?" if close else ""


def _fit_numeric(values: np.ndarray) -> dict[str, float]:
    """Median of the present values; mean and (population) std after imputing the median."""
    present = values[~np.isnan(values)]
    median = float(np.median(present)) if present.size else 0.0
    imputed = np.where(np.isnan(values), median, values)
    mean = float(imputed.mean()) if imputed.size else 0.0
    std = float(imputed.std()) if imputed.size else 1.0
    return {"median": median, "mean": mean, "std": std if std > 0 else 1.0}


def _vocabulary(public_cells: pd.Series, schema: list[str] | None) -> list[str]:
    """The schema's levels in their order, else the sorted levels of the public cells; the
    literal levels "other" and "<missing>" are the always-present columns, not extra ones."""
    levels = schema if schema is not None else sorted(public_cells.dropna().unique())
    return [str(v) for v in levels if v not in (OTHER, MISSING)]


def _class_order(labels: pd.Series) -> list[str]:
    """Distinct labels, numbers first in numeric order, then text in alphabetical order."""
    return sorted(labels.unique(), key=lambda v: (not _is_number(v),
                                                  float(v) if _is_number(v) else 0, v))


# --------------------------------------------------------------------------------------------
# encoding (no statistic computed here)


def _numbers(table: CsvTable, cells: pd.Series) -> np.ndarray:
    """A numeric column as floats (NaN where missing); a non-numeric cell is an error."""
    values = pd.to_numeric(cells, errors="coerce")
    bad = cells[values.isna() & cells.notna()]
    if len(bad):
        raise DpclipError(
            f"{table.key}: column {cells.name!r} of {str(table.path)!r} is numeric but "
            f"{len(bad)} cell(s) are not numbers, the first in data row {int(bad.index[0])} "
            f"(counted from 0; the value is not shown, it may be private); fix the file, add "
            f"the value to data.missing_values, or list {cells.name!r} in "
            f"data.categorical_columns")
    return values.to_numpy(dtype=np.float64)


def _standardised(values: np.ndarray, stats: dict[str, float]) -> np.ndarray:
    imputed = np.where(np.isnan(values), stats["median"], values)
    return ((imputed - stats["mean"]) / stats["std"])[:, None]


def _one_hot(cells: pd.Series, levels: list[str]) -> np.ndarray:
    """One column per level, then <missing>, then other (any level outside ``levels``)."""
    mapped = cells.where(cells.isin(levels) | cells.isna(), OTHER).fillna(MISSING)
    return np.stack([(mapped == level).to_numpy(dtype=np.float64)
                     for level in [*levels, MISSING, OTHER]], axis=1)


# --------------------------------------------------------------------------------------------
# reading (nothing fitted)


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def read_csv_table(path: str, target: str, *, columns: list[str] | None = None,
                   numeric_columns: list[str] | None = None,
                   categorical_columns: list[str] | None = None,
                   missing_values: list[str] = ("", "?", "NA"),
                   target_map: dict[str, str] | None = None,
                   key: str = "data.path", drop: list[str] | None = None) -> CsvTable:
    """Read ``path`` as text; raise naming ``key`` (the parameter that named the file) or the
    offending option on bad input. Rows without a label are dropped; ``target_map``
    (``data.target_map``) renames label values, e.g. {"2": "1", "3": "1", "4": "1"} turns
    Heart's 0-4 into 0 / 1 (values it does not list stay)."""
    file = Path(path)
    if not file.is_file():
        raise DpclipError(f"{key}: {path!r} does not exist or is not a file")
    try:
        frame = pd.read_csv(file, dtype=str, keep_default_na=False, skipinitialspace=True,
                            header=None if columns else "infer", names=columns)
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as exc:
        raise DpclipError(f"{key}: {path!r} could not be read as CSV: {exc}") from exc
    frame.columns = [str(c).strip() for c in frame.columns]
    frame = frame.apply(lambda s: s.str.strip())
    frame = frame.replace(list(missing_values), np.nan)
    frame = frame.dropna(how="all").reset_index(drop=True)
    if target not in frame.columns:
        raise DpclipError(f"data.target: {target!r} is not a column of {path!r}"
                          f"{did_you_mean(target, list(frame.columns))} "
                          f"(columns: {list(frame.columns)})")
    for name in drop or []:
        if name not in frame.columns or name == target:
            raise DpclipError(f"data.drop: {name!r} is not a feature column of {path!r}"
                              f"{did_you_mean(name, list(frame.columns))}")
    frame = frame.drop(columns=list(drop or []))
    frame = frame[frame[target].notna()].reset_index(drop=True)
    if len(frame) == 0:
        raise DpclipError(f"{key}: {path!r} has no row with a value in {target!r}")
    if target_map:
        # the map serves the main and a CSV shadow file alike (Adult's test file writes
        # ">50K."), so one file may lack some of its values, but not all: that is a typo
        if not set(target_map) & set(frame[target]):
            raise DpclipError(f"data.target_map: none of {sorted(target_map)!r} is a value of "
                              f"{target!r} in {path!r}")  # the values may be private
        frame[target] = frame[target].replace(dict(target_map))
    classes = frame[target].nunique()
    if classes < 2 and key == "data.path":  # a public file may hold one class of several
        raise DpclipError(f"data.target: {target!r} has {classes} distinct value in {path!r}; "
                          f"a classifier needs at least two classes")
    features = frame.drop(columns=[target])
    for option, names in (("data.numeric_columns", numeric_columns),
                          ("data.categorical_columns", categorical_columns)):
        for name in names or []:
            if name not in features.columns:
                raise DpclipError(f"{option}: {name!r} is not a feature column of {path!r}"
                                  f"{did_you_mean(name, list(features.columns))}")
    return CsvTable(file, features, frame[target], target, key, list(numeric_columns or []),
                    list(categorical_columns or []))
