"""The short comparison a person reads first: one row per configuration (method, target epsilon,
alpha) over its seeds, with the numbers a choice of DP method rests on, at most
:data:`MAX_WIDTH` characters wide; the full table stays in ``reports/comparison.csv`` /
``comparison.md``. Its columns: docs/pipeline.md, "The short summary table".
"""

from __future__ import annotations

import math
import textwrap

import pandas as pd

from dpclip.reporting.epsilon_marks import epsilon_mark
from dpclip.reporting.seed_stats import BASELINE, CONFIGURATION, minimum_exact_seeds

MAX_WIDTH = 120
METHOD_WIDTH = 24  # longer method names are cut with "…" in the text table
# judged headline metric -> its short name in the verdict column
SHORT_NAMES = {"accuracy": "acc", "ece": "ECE", "attack_auc": "AUC",
               "attack_tpr_at_low_fpr": "TPR"}
COLUMNS = ["method", "target_epsilon", "alpha", "seeds", "epsilon", "adjacency", "dp_guarantee",
           "accuracy",
           "accuracy_low", "accuracy_high", "ece", "attack", "attack_auc",
           "attack_tpr_at_low_fpr", "attack_low_fpr", "audit_epsilon_min", "audit_epsilon_max",
           "vs_dp_sgd"]


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def vs_baseline(paired: pd.DataFrame, configuration: tuple, seeds: int) -> str:
    """The verdicts of one configuration against the baseline in a few words: the judged
    metrics that differ at 5% ("acc worse, ECE better"), else why none does."""
    target_epsilon, alpha, method = configuration
    if method == BASELINE:
        return "(baseline)"
    if paired.empty:
        return f"no {BASELINE} run"
    mine = paired[(paired["method"] == method) & (paired["alpha"] == alpha)
                  & (paired["target_epsilon"].isna() if _missing(target_epsilon)
                     else paired["target_epsilon"] == target_epsilon)]
    if mine.empty or (mine["seeds"] < 2).all():
        return "1 seed: untested" if seeds < 2 else f"no paired {BASELINE} seeds"
    decided = [f"{SHORT_NAMES.get(r.metric, r.metric)} {r.verdict}"
               for r in mine.itertuples() if r.verdict in ("better", "worse")]
    if decided:
        return ", ".join(decided)
    # Holm's correction runs over the methods compared at this (epsilon, alpha) on a metric
    family = int(((paired["alpha"] == alpha) & (paired["metric"] == mine["metric"].iloc[0])
                  & (paired["target_epsilon"].isna() if _missing(target_epsilon)
                     else paired["target_epsilon"] == target_epsilon)).sum())
    least = minimum_exact_seeds(family=family)
    paired_seeds = int(mine["seeds"].max())
    if paired_seeds < least:
        return f"{paired_seeds} seeds: too few (< {least})"
    return "not distinguishable"


def summary_frame(table: pd.DataFrame, seeds: pd.DataFrame,
                  paired: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration of the comparison ``table`` (the report's, one row per run),
    from its per-seed summary ``seeds`` and paired comparison ``paired``
    (:func:`dpclip.reporting.seed_stats.seed_summary`, :func:`~dpclip.reporting.seed_stats.paired_comparison`)."""
    rows = []
    for record in seeds.to_dict(orient="records"):
        configuration = tuple(record[c] for c in CONFIGURATION)
        runs = table[(table["method"] == record["method"]) & (table["alpha"] == record["alpha"])
                     & (table["target_epsilon"].isna() if _missing(record["target_epsilon"])
                        else table["target_epsilon"] == record["target_epsilon"])]
        spent = runs["epsilon"].astype(float).dropna()  # the largest: a privacy claim
        attacks = runs["attack"].dropna().unique()
        # the FPR the TPR is read at: set by the holdout's size, the same for every seed
        fprs = runs["attack_low_fpr"].astype(float).dropna() if "attack_low_fpr" in runs \
            else pd.Series(dtype=float)
        rows.append({**{c: record[c] for c in CONFIGURATION}, "seeds": record["seeds"],
                     "epsilon": float(spent.max()) if len(spent) else math.nan,
                     "adjacency": "/".join(map(str, runs["adjacency"].dropna().unique())) or None,
                     # not recorded (NaN) is no guarantee
                     "dp_guarantee": all(v is True or v == 1 for v in runs["dp_guarantee"]),
                     **{k: record.get(k) for k in (
                         "accuracy", "accuracy_low", "accuracy_high", "ece", "attack_auc",
                         "attack_tpr_at_low_fpr", "audit_epsilon_min", "audit_epsilon_max")},
                     "attack": "/".join(map(str, attacks)) if len(attacks) else None,
                     "attack_low_fpr": float(fprs.max()) if len(fprs) else math.nan,
                     "vs_dp_sgd": vs_baseline(paired, configuration, record["seeds"])})
    return pd.DataFrame(rows, columns=COLUMNS)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _number(v, digits: int = 3) -> str:
    return "—" if _missing(v) else f"{v:.{digits}f}"


def _accuracy(row) -> str:
    if _missing(row["accuracy"]):
        return "—"
    if _missing(row["accuracy_low"]):
        return f"{row['accuracy']:.3f}"
    return f"{row['accuracy']:.3f} ± {(row['accuracy_high'] - row['accuracy_low']) / 2:.3f}"


def _attack(row) -> str:
    if _missing(row["attack_auc"]):
        return "—"
    fpr = row.get("attack_low_fpr")
    at = "" if _missing(fpr) else f" @{100 * fpr:.2g}%"
    return (f"{row['attack'] or '?'} {row['attack_auc']:.3f} / "
            f"{_number(row['attack_tpr_at_low_fpr'])}{at}")


def _audit(row) -> str:
    low, high = row["audit_epsilon_min"], row["audit_epsilon_max"]
    if _missing(low) or _missing(high):
        return "—" if _missing(low) and _missing(high) else \
            f"{high if _missing(low) else low:.2f}"
    return f"{low:.2f}" if math.isclose(low, high) else f"{low:.2f}–{high:.2f}"


def _epsilon(row) -> str:
    """The spent epsilon, marked "*" under another neighbouring notion than add/remove (not
    the same quantity) and "!" where the run makes no DP guarantee (a literal-paper rule)."""
    if _missing(row["epsilon"]):
        return "—"
    return f"{row['epsilon']:.2f}{epsilon_mark(bool(row['dp_guarantee']), row['adjacency'])}"


def _target(v) -> str:
    return "—" if _missing(v) else f"{v:g}"


HEADERS = {"method": "method", "target": "target", "alpha": "alpha", "seeds": "seeds",
           "epsilon": "eps", "accuracy": "accuracy", "ece": "ECE",
           "attack": "attack AUC / TPR @FPR", "audit": "audit eps>=",
           "verdict": f"vs {BASELINE}"}


def cells(summary: pd.DataFrame) -> list[dict[str, str]]:
    """The summary's rows as the strings both renderings show."""
    return [{"method": str(r["method"]), "target": _target(r["target_epsilon"]),
             "alpha": str(r["alpha"]), "seeds": str(r["seeds"]),
             "epsilon": _epsilon(r), "accuracy": _accuracy(r),
             "ece": _number(r["ece"]), "attack": _attack(r), "audit": _audit(r),
             "verdict": str(r["vs_dp_sgd"])}
            for r in summary.to_dict(orient="records")]


def text_table(summary: pd.DataFrame, width: int = MAX_WIDTH) -> str:
    """The summary as aligned plain text, no line longer than ``width``: the verdict column,
    last, is cut with "…" where the others leave it too little room."""
    rows = [HEADERS, *cells(summary)]
    for r in rows:  # a plugin's long name must not push the numbers off the screen
        r["method"] = _cut(r["method"], METHOD_WIDTH)
    keys = list(HEADERS)
    widths = {k: max(len(r[k]) for r in rows) for k in keys}
    fixed = sum(widths[k] for k in keys[:-1]) + 2 * (len(keys) - 1)
    room = max(width - fixed, len(HEADERS["verdict"]))
    lines = []
    for r in rows:
        verdict = _cut(r["verdict"], room)
        numeric = {"target", "seeds", "epsilon", "ece", "audit"}
        parts = [r[k].rjust(widths[k]) if k in numeric else r[k].ljust(widths[k])
                 for k in keys[:-1]]
        lines.append(_cut(("  ".join(parts) + "  " + verdict).rstrip(), width))
    return "\n".join(lines)


def markdown_table(summary: pd.DataFrame) -> str:
    """The same rows as a Markdown table (the Prefect artifact, comparison.md, MLflow)."""
    rows = cells(summary)
    header = "| " + " | ".join(HEADERS.values()) + " |"
    rule = "|" + "|".join("---" for _ in HEADERS) + "|"
    body = ["| " + " | ".join(r[k].replace("|", "\\|") for k in HEADERS) + " |" for r in rows]
    return "\n".join([header, rule, *body])


LEGEND = ("target: the target epsilon; eps: the epsilon spent (the largest over seeds), * = "
          "another neighbouring notion than add/remove one record (not comparable as the same "
          "number), ! = no DP guarantee (a paper's literal rule). accuracy: mean over seeds ± "
          "half the 95% interval (two or more seeds). attack: the attack chosen in advance "
          "(attack.headline), its AUC and its TPR at the FPR shown (@: the lowest FPR that "
          "allows 10 false positives among the holdout records; a smaller holdout gives a "
          "larger one; — = it did not run: the metrics' mia.not_run says why, e.g. no "
          "reference models yet). audit eps>=: the one-run audit's lower bound on epsilon (the "
          "range over seeds; — = no audit: no DP claim, another neighbouring notion, or no "
          f"audit kind that fits the method). vs {BASELINE}: the paired verdicts that reach 5% "
          "after Holm's correction over the methods compared (acc, ECE, AUC, TPR; else \"not "
          f"distinguishable\"); the exact test needs {minimum_exact_seeds()} seeds to decide "
          f"anything for one method, {minimum_exact_seeds(family=8)} for eight.")


def legend(width: int = MAX_WIDTH) -> str:
    """What the columns mean, wrapped to ``width``."""
    return textwrap.fill(LEGEND, width=width)
