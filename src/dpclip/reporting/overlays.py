"""Plot tables that overlay every configured run, for ``dvc plots show`` and ``dvc plots diff``.

DVC's ``y:`` mapping takes files, not folders, so each table here holds every configured run
with a ``run`` (and ``method``) column, at most :data:`MAX_POINTS` points per run, and the
templates in ``.dvc/plots`` colour by run. The tables are small, so git tracks them. Each
table and its columns: docs/dvc.md, "The plot tables".
"""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd

from dpclip.audit.status import audit_status
from dpclip.files import read_json, write_csv_frame
from dpclip.layout import Layout
from dpclip.run_keys import RunKey, alpha_tag
from dpclip.reporting.epsilon_marks import series_label, summary_adjacency
from dpclip.reporting.seed_stats import mean_interval
from dpclip.summaries import unfiled

MAX_POINTS = 400  # per run and table: a browser draws 10 runs x 400 points at once
ROC_FOLDER = "roc"  # roc/<attack>.csv
FILES = ("clip_threshold.csv", "reliability.csv", "privacy_utility.csv",
         "privacy_utility_seeds.csv")  # and one roc/<attack>.csv per attack


def thin(frame: pd.DataFrame, limit: int = MAX_POINTS) -> pd.DataFrame:
    """At most ``limit`` evenly spaced rows, always keeping the first and the last."""
    if len(frame) <= limit:
        return frame
    keep = np.unique(np.linspace(0, len(frame) - 1, limit).round().astype(int))
    return frame.iloc[keep]


def thin_log(frame: pd.DataFrame, column: str, limit: int = MAX_POINTS) -> pd.DataFrame:
    """At most about ``limit`` rows, spaced evenly in log(``column``) (> 0): a ROC keeps its
    low-FPR detail, where attacks matter, on log axes."""
    frame = frame[frame[column] > 0]
    if len(frame) <= limit:
        return frame
    values = np.log(frame[column].to_numpy())
    targets = np.linspace(values.min(), values.max(), limit)
    keep = np.unique(np.searchsorted(values, targets).clip(0, len(frame) - 1))
    return frame.iloc[np.union1d(keep, [len(frame) - 1])]


def with_data(label: str, layout: Layout, run: str) -> str:
    """A series' label with the identity of the data ``run``'s results are filed under (its
    summary, :mod:`dpclip.summaries`): under ``dvc plots diff`` two datasets' runs of one name
    are two series, each named."""
    path = layout.summary(run)
    data = unfiled(read_json(path))[0] if path.exists() else None
    return f"{label} ({data})" if data else label


def _labelled(frame: pd.DataFrame, key: RunKey, layout: Layout) -> pd.DataFrame:
    return frame.assign(run=with_data(key.name, layout, key.name), method=key.method)[
        ["run", "method", *[c for c in frame.columns if c not in ("run", "method")]]]


def clip_threshold_table(layout: Layout, runs: list[RunKey]) -> pd.DataFrame:
    parts = []
    for key in runs:
        trace = pd.read_csv(layout.trace(key.name), usecols=["step", "clip_threshold"])
        trace = trace.dropna(subset=["clip_threshold"])  # non-private and sanitize: no C_t
        if len(trace):
            parts.append(_labelled(thin(trace), key, layout))
    return _concat(parts, ["run", "method", "step", "clip_threshold"])


def read_roc(layout: Layout, run: str) -> pd.DataFrame:
    """The run's ROC points of every attack (``attack``, ``fpr``, ``tpr``); a file written
    before LiRA and RMIA holds the loss attack's only, without the column."""
    roc = pd.read_csv(layout.roc(run))
    return roc if "attack" in roc else roc.assign(attack="loss")


def roc_table(layout: Layout, runs: list[RunKey], attack: str = "loss") -> pd.DataFrame:
    parts = []
    for key in runs:
        roc = read_roc(layout, key.name)
        roc = roc[roc["attack"] == attack][["fpr", "tpr"]].sort_values(["fpr", "tpr"])
        roc = roc[roc["tpr"] > 0]  # log axes: a zero has no place (Vega drops the whole line)
        if len(roc):
            parts.append(_labelled(thin_log(roc, "fpr").assign(attack=attack), key, layout))
    return _concat(parts, ["run", "method", "fpr", "tpr", "attack"])


def reliability_table(layout: Layout, runs: list[RunKey]) -> pd.DataFrame:
    parts = []
    for key in runs:
        bins = pd.read_csv(layout.reliability(key.name))
        bins = bins[bins["count"] > 0][["confidence", "accuracy", "count"]]
        parts.append(_labelled(bins, key, layout))
    return _concat(parts, ["run", "method", "confidence", "accuracy", "count"])


PRIVACY_UTILITY = ["run", "method", "series", "target_epsilon", "alpha", "seed", "epsilon",
                   "dp_guarantee", "adjacency", "accuracy", "ece", "strongest_auc",
                   "strongest_tpr_at_fpr_0.1pct",
                   "audit_epsilon_lower_bound", "attack_auc", "attack_tpr_at_low_fpr",
                   "audit_status"]


def privacy_utility_table(layout: Layout, runs: list[RunKey]) -> pd.DataFrame:
    """One row per run with a DP claim: its summary against the epsilon it spent, and its
    ``audit_status`` (:func:`dpclip.audit.status.audit_status`), so that the claimed-vs-audited
    plot names the runs it has no bound for and why."""
    rows = []
    for key, summary, metrics in _claimed(layout, runs):
        # series: the runs one line joins (same method, alpha and seed; epsilon varies),
        # marked where the epsilon is no guarantee or under another adjacency
        series = series_label(with_data(f"{key.method} {alpha_tag(key.alpha)} seed{key.seed}",
                                        layout, key.name), summary.get("dp_guarantee"),
                              summary["adjacency"])
        rows.append({"run": with_data(key.name, layout, key.name), "method": key.method,
                     "series": series,
                     "target_epsilon": key.epsilon,
                     "alpha": alpha_tag(key.alpha), "seed": key.seed, **summary,
                     "audit_status": audit_status(metrics.get("audit") or {}) or "not audited"})
    return _concat([pd.DataFrame(rows)] if rows else [], PRIVACY_UTILITY)


BANDED = ("accuracy", "ece", "attack_tpr_at_low_fpr")
PRIVACY_UTILITY_SEEDS = ["series", "method", "alpha", "target_epsilon", "seeds", "epsilon",
                         *[f"{m}{end}" for m in BANDED for end in ("", "_low", "_high")]]


def privacy_utility_seeds_table(layout: Layout, runs: list[RunKey]) -> pd.DataFrame:
    """One row per (method, alpha, target epsilon) with a DP claim: the mean over its seeds of
    the epsilon spent and, with a 95% interval
    (:func:`dpclip.reporting.seed_stats.mean_interval`; none for one seed), of accuracy, ECE
    and the headline attack's TPR at the honest low FPR: the curves and their bands against
    epsilon."""
    groups: dict[tuple, list[tuple[str, dict]]] = {}
    for key, summary, _ in _claimed(layout, runs):
        groups.setdefault((key.method, alpha_tag(key.alpha), key.epsilon), []).append(
            (key.name, summary))
    rows = []
    for (method, alpha, target), named in groups.items():
        summaries = [summary for _, summary in named]
        row = {"series": series_label(with_data(f"{method} {alpha}", layout, named[0][0]),
                                      all(s.get("dp_guarantee", True) for s in summaries),
                                      summaries[0]["adjacency"]),
               "method": method, "alpha": alpha,
               "target_epsilon": target, "seeds": len(summaries),
               "epsilon": float(np.mean([s["epsilon"] for s in summaries]))}
        for metric in BANDED:
            row[metric], row[f"{metric}_low"], row[f"{metric}_high"] = mean_interval(
                [s.get(metric) for s in summaries])
        rows.append(row)
    return _concat([pd.DataFrame(rows)] if rows else [], PRIVACY_UTILITY_SEEDS)


def _claimed(layout: Layout, runs: list[RunKey]):
    """(run, its summary, its metrics file's content) of each run with a DP claim (no point on
    an epsilon axis without one); the summary's ``adjacency`` is the run's neighbouring notion
    by name (its metrics file), else as the summary has it."""
    for key in runs:
        _, summary = unfiled(read_json(layout.summary(key.name)))
        if summary["epsilon"] is not None:
            path = layout.metrics(key.name)
            metrics = read_json(path) if path.exists() else {}
            adjacency = (metrics.get("privacy") or {}).get("adjacency") or \
                summary_adjacency(summary)
            yield key, {**summary, "adjacency": adjacency}, metrics


def _concat(parts: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    return pd.concat(parts, ignore_index=True).reindex(columns=columns) if parts else \
        pd.DataFrame(columns=columns)


def attacks_run(layout: Layout, runs: list[RunKey]) -> list[str]:
    """The attacks with ROC points in any of the runs, in the order they first appear."""
    seen: dict[str, None] = {}
    for key in runs:
        seen.update(dict.fromkeys(read_roc(layout, key.name)["attack"]))
    return list(seen)


def write_overlays(layout: Layout, runs: list[RunKey]) -> dict[str, pd.DataFrame]:
    """Write the overlay tables of ``runs`` into ``overlays/``, replacing everything there
    (the tables of runs no longer configured, the ROC of an attack no longer run); returns
    them by path relative to ``overlays/``."""
    tables = {"clip_threshold.csv": clip_threshold_table(layout, runs),
              **{f"{ROC_FOLDER}/{attack}.csv": roc_table(layout, runs, attack)
                 for attack in attacks_run(layout, runs)},
              "reliability.csv": reliability_table(layout, runs),
              "privacy_utility.csv": privacy_utility_table(layout, runs),
              "privacy_utility_seeds.csv": privacy_utility_seeds_table(layout, runs)}
    if layout.overlays.exists():  # this function owns the folder
        shutil.rmtree(layout.overlays)
    for name, table in tables.items():
        write_csv_frame(layout.overlays / name, table)
    return tables
