"""Generic CSV source: a named target column, numeric columns standardised, categorical
columns one-hot encoded, missing values imputed and counted.

Privacy note: the standardisation statistics (mean, std) and the imputation values (medians)
are fitted on the rows passed as ``fit_rows`` — the public shadow-train split when there is one
— so they carry no information about the private members. The category vocabulary is read from
the whole file: it is treated as the public schema of the data (a data dictionary).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dpclip.data.sources import Dataset
from dpclip.errors import DpclipError

# A column whose non-missing cells are at least this fraction numeric is taken as a numeric
# column with a bad cell (an error), not as a categorical column.
NUMERIC_MAJORITY = 0.5


@dataclass
class CsvTable:
    """A CSV read as text, with each column classified as numeric or categorical."""

    path: Path
    frame: pd.DataFrame  # feature columns as text; missing cells are NaN
    y: np.ndarray
    classes: list[str]
    numeric: list[str]
    categorical: list[str]

    def to_dataset(self, fit_rows: np.ndarray) -> Dataset:
        """Encode features using statistics of ``fit_rows`` only (see the module note)."""
        parts, names, missing = [], [], {}
        for col in self.numeric:
            values = pd.to_numeric(self.frame[col], errors="coerce").to_numpy(dtype=np.float64)
            missing[col] = int(np.isnan(values).sum())
            fit = values[fit_rows]
            fit = fit[~np.isnan(fit)]
            median = float(np.median(fit)) if fit.size else 0.0
            values = np.where(np.isnan(values), median, values)
            fit_imputed = np.where(np.isnan(values[fit_rows]), median, values[fit_rows])
            mean = float(fit_imputed.mean()) if fit_imputed.size else 0.0
            std = float(fit_imputed.std()) if fit_imputed.size else 1.0
            parts.append(((values - mean) / (std if std > 0 else 1.0))[:, None])
            names.append(col)
        for col in self.categorical:
            column = self.frame[col]
            missing[col] = int(column.isna().sum())
            # missing is its own category, so a record with a missing cell is still encoded
            filled = column.fillna("<missing>")
            for level in sorted(filled.unique()):
                parts.append((filled == level).to_numpy(dtype=np.float64)[:, None])
                names.append(f"{col}={level}")
        if not parts:
            raise DpclipError(f"data.path: {str(self.path)!r} has no feature column besides "
                              f"the target")
        x = np.concatenate(parts, axis=1)
        info = {"source": str(self.path), "feature_names": names,
                "numeric_columns": self.numeric, "categorical_columns": self.categorical,
                "missing_values": missing, "missing_total": int(sum(missing.values())),
                "statistics_fitted_on_rows": int(len(fit_rows))}
        return Dataset("csv", x, self.y, self.classes, (x.shape[1],), info)


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def read_csv_table(path: str, target: str, *, columns: list[str] | None = None,
                   numeric_columns: list[str] | None = None,
                   categorical_columns: list[str] | None = None,
                   missing_values: list[str] = ("", "?", "NA")) -> CsvTable:
    """Read ``path`` as text and classify its columns; raise naming the key on bad input."""
    file = Path(path)
    if not file.is_file():
        raise DpclipError(f"data.path: {path!r} does not exist or is not a file")
    try:
        frame = pd.read_csv(file, dtype=str, keep_default_na=False, skipinitialspace=True,
                            header=None if columns else "infer", names=columns)
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as exc:
        raise DpclipError(f"data.path: {path!r} could not be read as CSV: {exc}") from exc
    frame.columns = [str(c).strip() for c in frame.columns]
    frame = frame.apply(lambda s: s.str.strip())
    frame = frame.replace(list(missing_values), np.nan)
    frame = frame.dropna(how="all").reset_index(drop=True)
    if target not in frame.columns:
        raise DpclipError(f"data.target: {target!r} is not a column of {path!r} "
                          f"(columns: {list(frame.columns)})")
    labelled = frame[target].notna()
    if not labelled.all():
        frame = frame[labelled].reset_index(drop=True)
    if len(frame) == 0:
        raise DpclipError(f"data.path: {path!r} has no row with a value in {target!r}")
    classes = sorted(frame[target].unique(), key=lambda v: (not _is_number(v),
                                                            float(v) if _is_number(v) else 0, v))
    y = frame[target].map({c: i for i, c in enumerate(classes)}).to_numpy(dtype=np.int64)
    features = frame.drop(columns=[target])
    for key, names in (("data.numeric_columns", numeric_columns),
                       ("data.categorical_columns", categorical_columns)):
        for name in names or []:
            if name not in features.columns:
                raise DpclipError(f"{key}: {name!r} is not a feature column of {path!r}")
    numeric, categorical = [], []
    for col in features.columns:
        cells = features[col].dropna()
        parsed = pd.to_numeric(cells, errors="coerce")
        bad = cells[parsed.isna()]
        declared_numeric = numeric_columns is not None and col in numeric_columns
        declared_categorical = categorical_columns is not None and col in categorical_columns
        if declared_categorical:
            categorical.append(col)
        elif declared_numeric or (len(cells) and len(bad) < NUMERIC_MAJORITY * len(cells)):
            if len(bad):
                row = int(bad.index[0])
                raise DpclipError(
                    f"data.path: column {col!r} is numeric but row {row} holds the non-numeric "
                    f"value {bad.iloc[0]!r} ({len(bad)} such cells); fix the file, add the "
                    f"value to data.missing_values, or list {col!r} in data.categorical_columns")
            numeric.append(col)
        else:
            categorical.append(col)
    return CsvTable(file, features, y, [str(c) for c in classes], numeric, categorical)
