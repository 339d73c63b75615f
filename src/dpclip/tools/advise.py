"""``dpclip advise``: which DP method to use on your data at your budget, with the evidence.

Trains the candidate methods (``train.methods`` with ``dp_sgd`` added, ``non_private`` left
out) at every target epsilon over the seeds the question needs, in a project folder of its own
(``advice/``, runs reused through their provenance), and answers from ``comparison.csv`` with
:mod:`dpclip.reporting.seed_stats`: accuracy against ``dp_sgd`` first, ECE, the attack and the
audit beside it, and what the choice costs (:data:`SELECTION_COST`). docs/choosing-a-method.md.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pandas as pd
import yaml

from dpclip.config import with_overrides
from dpclip.errors import DpclipError
from dpclip.layout import Layout
from dpclip.reporting.seed_stats import (BASELINE, mean_interval, minimum_exact_seeds,
                                         paired_comparison)

DEFAULT_ROOT = Path("advice")
WIDTH = 120
SECONDARY = {"ece": "ECE", "attack_auc": "attack AUC", "attack_tpr_at_low_fpr": "TPR"}


def candidates(raw: dict) -> list[str]:
    """The methods compared: params.yaml's private ones, ``dp_sgd`` first."""
    from dpclip.methods import get_method

    named = list(((raw.get("train") or {}).get("methods")) or [BASELINE])
    private = [m for m in named if get_method(m).private and m != BASELINE]
    return [BASELINE, *dict.fromkeys(private)]


def seeds_for(compared: int) -> int:
    """The fewest seeds at which Holm's family of ``compared`` methods can reach 5%."""
    return minimum_exact_seeds(family=max(1, compared))


def advice_params(raw: dict, methods: list[str], seeds: int) -> dict:
    """The user's parameters with the methods and seeds of the question."""
    return with_overrides(raw, {"train": {"methods": methods, "seeds": list(range(seeds))}})


def run_advice(params_path: Path, root: Path = DEFAULT_ROOT, seeds: int | None = None,
               methods: list[str] | None = None, progress: bool = True,
               rank_on: str = "auto") -> str:
    """Train what the question needs into ``root`` and return the answer's text. In a folder
    without runs, seed 0 of every method runs first, through every stage, and its measured wall
    time states the other seeds' time before they start (seed 0's runs are then reused)."""
    from dpclip.tools.folder_run import run_in_folder

    if not params_path.is_file():
        raise DpclipError(f"--params: {str(params_path)!r} does not exist")
    raw = yaml.safe_load(params_path.read_text()) or {}
    chosen = methods or candidates(raw)
    if BASELINE not in chosen:
        chosen = [BASELINE, *chosen]
    n = seeds if seeds is not None else seeds_for(len(chosen) - 1)
    if n < 2:
        raise DpclipError(f"--seeds: {n} is too few: a paired comparison needs at least 2")
    if progress:
        print(f"advise: {len(chosen)} methods ({', '.join(chosen)}) x {n} seeds x every "
              f"target epsilon, into {root}/ (runs already there are reused)", flush=True)
    # the folder holds the prepared members and the trained models: never for git
    root.mkdir(parents=True, exist_ok=True)
    (root / ".gitignore").write_text("*\n")
    seconds = 0.0
    if progress and not _has_runs(root):
        # a new folder: seed 0 of every method through every stage first, so that its
        # measured wall time states the other seeds' time before they start (the training
        # estimate leaves out evaluation, the report and each run's set-up). Not when runs
        # are there: a first pass of other seeds would set them aside and evaluate them anew
        seconds = run_in_folder(advice_params(raw, chosen, 1), root, progress=progress)
        rest = n - 1
        print(f"advise: seed 0 of every method, every stage, took {seconds / 60:.1f} min; "
              f"the other {rest} seed{'s' if rest > 1 else ''}: at most about "
              f"{rest * seconds / 60:.1f} min more ({n * seconds / 60:.1f} min in all; an "
              f"upper estimate: seed 0's time includes the stages that run once per dataset)",
              flush=True)
    seconds += run_in_folder(advice_params(raw, chosen, n), root, progress=progress)
    table = pd.read_csv(root / "reports" / "comparison.csv")
    data = raw.get("data") or {}
    dataset = str(data.get("dataset") or "digits") + (f" ({data['path']})" if data.get("path")
                                                      else "")
    return answer(table, dataset, rank_on) + f"\n\n(advise took {seconds / 60:.1f} min; every run: " \
                                    f"{root}/reports/comparison.md)"


def _has_runs(root: Path) -> bool:
    """Whether ``root`` holds trained runs, configured or set aside."""
    layout = Layout(root)
    folders = (layout.run_dir("-").parent, layout.retired("-").parent)
    return any(folder.is_dir() and any(folder.iterdir()) for folder in folders)


def _interval(low, high, digits: int = 3, signed: bool = False) -> str:
    if low is None or high is None or any(map(math.isnan, (low, high))):
        return "[no interval]"
    form = f"{{:+.{digits}f}}" if signed else f"{{:.{digits}f}}"
    return f"[{form.format(low)}, {form.format(high)}]"


def _eligible(runs: pd.DataFrame) -> bool:
    """A recommendation needs a DP guarantee under add/remove adjacency on every seed."""
    guarantee = runs["dp_guarantee"] if "dp_guarantee" in runs else pd.Series([True])
    adjacency = runs["adjacency"] if "adjacency" in runs else pd.Series(["add_remove"])
    return bool(all(v is True or v == 1 for v in guarantee)
                and set(adjacency.dropna()) <= {"add_remove"})


# a controller that moved C by less than this (mean |log(C_T / C_0)| over seeds) did not act:
# the method then ran its baseline's rule, and its accuracy says nothing of its own (the
# evidence page's precondition, presets/claims.yaml's "clip moves" default)
LEAST_CLIP_MOVE = 0.05


def idle_controller(method: str, runs: pd.DataFrame) -> float | None:
    """How far a method's clip controller moved C when it did not act (below
    :data:`LEAST_CLIP_MOVE`), or None: it acted, or the method has no controller."""
    from dpclip.methods import get_method
    from dpclip.methods.base import CONSTANT_CLIP

    if get_method(method).controller_data == CONSTANT_CLIP or \
            not {"c_initial", "c_final"} <= set(runs.columns):
        return None
    moved = (runs["c_final"].astype(float) / runs["c_initial"].astype(float)).map(
        lambda r: abs(math.log(r)) if r > 0 else math.nan).mean()
    return float(moved) if moved < LEAST_CLIP_MOVE else None


RANK_ON = ("auto", "public", "holdout")


def ranked_on(table: pd.DataFrame, rank_on: str = "auto") -> str:
    """Which accuracy the ranking reads: ``public`` (the public shadow holdout, of the same data
    set: the choice reads no private record) or ``holdout`` (the members' holdout, private);
    ``auto``: public wherever every run has it."""
    if rank_on not in RANK_ON:
        raise DpclipError(f"--rank-on: {rank_on!r} is not one of {', '.join(RANK_ON)}")
    public = "public_accuracy" in table and table["public_accuracy"].notna().all() \
        and len(table)
    if rank_on == "public" and not public:
        raise DpclipError("--rank-on: 'public' needs every run's accuracy on the public "
                          "holdout, which runs whose public split is another data set "
                          "(data.shadow_dataset) or empty do not have")
    return "public" if rank_on == "public" or (rank_on == "auto" and public) else "holdout"


def answer(table: pd.DataFrame, dataset: str = "your data", rank_on: str = "auto") -> str:
    """The ranked answer per (target epsilon, alpha), from a report's comparison table (one
    row per run), ranked on the accuracy :func:`ranked_on` picks."""
    table = table[table["method"] != "non_private"]
    source = ranked_on(table, rank_on)
    if source == "public":
        table = table.assign(accuracy=table["public_accuracy"])
    paired = paired_comparison(table)
    out = []
    for (epsilon, alpha), group in table.groupby(["target_epsilon", "alpha"], sort=True,
                                                 dropna=False):
        methods = list(dict.fromkeys(group["method"]))
        if BASELINE not in methods:
            raise DpclipError(f"no {BASELINE} run at target epsilon {epsilon:g}: the answer "
                              f"compares every method with it")
        mine = paired[(paired["target_epsilon"] == epsilon) & (paired["alpha"] == alpha)]
        accuracy = mine[mine["metric"] == "accuracy"].set_index("method")
        seeds = int(group["seed"].nunique())
        m = len(methods) - 1
        out.append(textwrap.fill(
            f"At epsilon {epsilon:g} (alpha {alpha}) on {dataset}, {seeds} "
            f"seed{'s' * (seeds != 1)}: accuracy on the {SOURCES[source]} against "
            f"{BASELINE}, paired by seed (exact "
            f"sign-flip test, Holm over {m} method{'s' * (m != 1)}, 5%; {seeds_for(m)} seeds "
            f"can decide)", WIDTH))
        ranked = []
        for method in methods:
            runs = group[group["method"] == method]
            mean, low, high = mean_interval(runs["accuracy"], bounds=(0.0, 1.0))
            ranked.append((mean, method, low, high, _eligible(runs)))
        ranked.sort(key=lambda r: (-r[0], r[1]))
        width = max(len(r[1]) for r in ranked)
        same, worse, better, unsound, undecided, idle = [], [], [], [], [], []
        for rank, (mean, method, low, high, eligible) in enumerate(ranked, 1):
            line = f"  {rank}. {method.ljust(width)}  {mean:.3f} {_interval(low, high)}"
            if method == BASELINE:
                line += "  (the baseline)"
            else:
                r = accuracy.loc[method]
                leans = _leaning(r)
                line += (f"  Δ {r['difference']:+.3f} "
                         f"{_interval(r['difference_low'], r['difference_high'], signed=True)}"
                         f"  {_verdict_words(r['verdict'], r['p_holm'], leans, m)}")
                if r["verdict"] in ("better", "worse"):
                    {"better": better, "worse": worse}[r["verdict"]].append(method)
                elif leans:
                    undecided.append((method, leans))
                else:
                    same.append(method)
            if not eligible:
                line += "  (no DP guarantee under add/remove: not recommended)"
                unsound.append(method)
            moved = idle_controller(method, group[group["method"] == method])
            if moved is not None:
                line += (f"  (its controller did not act: C moved by |log C_T/C_0| {moved:.2g} "
                         f"on average, so it ran {BASELINE}'s rule here: not ranked as itself)")
                idle.append(method)
            out.append(line)
        out.append(textwrap.fill(_recommendation(better, same, worse, [*unsound, *idle],
                                                 undecided), WIDTH, initial_indent="  ",
                                 subsequent_indent="  "))
        out += _secondary(group, mine, methods)
        out.append("")
    out.append(textwrap.fill(SELECTION_COST[source], WIDTH))
    return "\n".join(out).rstrip()


SOURCES = {"public": "public holdout (no private record read)",
           "holdout": "private holdout"}


# said with every answer: the ranking reads private records
SELECTION_COST = {
    "holdout": (
        "What this choice costs: each run's epsilon covers its training records only. The "
        "ranking reads accuracies on your holdout records, your data too, without noise: what "
        "it reveals of them is bounded by no epsilon, and a model released because it won "
        "carries that choice (choosing the best of several DP runs costs privacy beyond one "
        "run even when the scores are private: Papernot and Steinke, ICLR 2022). Releasing "
        "several of these models composes their epsilons. To stay inside a budget, rank on "
        "public records (--rank-on public, where the public split is of your data set) and "
        "release a model trained afresh with the chosen method and privacy.secure_noise: "
        "true."),
    "public": (
        "What this choice costs: the ranking reads accuracies on the public holdout only, so "
        "it reveals nothing of your records beyond what the runs release. The secondary "
        "numbers (ECE, the attack, the audit) are measured on your private records without "
        "noise: a choice made on them is bounded by no epsilon. Releasing several of these "
        "models composes their epsilons; release a model trained afresh with the chosen "
        "method and privacy.secure_noise: true."),
}


def _leaning(r) -> str | None:
    """"better" / "worse" when a difference the family did not decide still has its own 95%
    interval off 0 (after Holm's correction the test needs more than that interval), else
    None: the difference is then indistinguishable from 0."""
    low, high = r["difference_low"], r["difference_high"]
    if r["verdict"] in ("better", "worse") or low is None or high is None or \
            pd.isna(low) or pd.isna(high):
        return None
    if low > 0:
        return "better"
    return "worse" if high < 0 else None


def _verdict_words(verdict: str, p_holm: float, leans: str | None = None,
                   family: int = 1) -> str:
    if verdict in ("better", "worse"):
        return f"{verdict} (p Holm {p_holm:.3g})"
    if leans:  # its own interval is off 0; the correction over the family is not passed
        return (f"leans {leans}, not decided: Holm over {family} needs more seeds "
                f"(p Holm {p_holm:.3g})")
    return "indistinguishable at these seeds"


def _recommendation(better: list, same: list, worse: list, unsound: list,
                    undecided: list = ()) -> str:
    sound = lambda names: [m for m in names if m not in unsound]  # noqa: E731
    if sound(better):
        text = f"Use {' or '.join(sound(better))}: more accurate than {BASELINE} on every test."
    elif sound(same):
        text = (f"Use {BASELINE} or {', '.join(sound(same))}: no accuracy difference shows "
                f"at these seeds (choose on the secondary numbers below).")
    else:
        text = f"Use {BASELINE}: no method beats it."
    if sound(worse):
        text += f" Avoid {', '.join(sound(worse))}: less accurate than {BASELINE}."
    leaning = [(method, leans) for method, leans in undecided if method not in unsound]
    if leaning:
        text += (" Not decided at these seeds: " + ", ".join(
            f"{method} leans {leans}" for method, leans in leaning)
            + " (more seeds, `--seeds`, would decide).")
    return text


def _secondary(group: pd.DataFrame, mine: pd.DataFrame, methods: list[str]) -> list[str]:
    """ECE, attack AUC, TPR at the FPR shown (each its own Holm family) and the audit's range."""
    lines = ["  secondary (each metric its own Holm family): method: ECE, attack AUC, TPR @FPR, "
             "audit eps>="]
    width = max(len(m) for m in methods)
    for method in methods:
        runs = group[group["method"] == method]
        parts = []
        for metric, name in SECONDARY.items():
            if metric not in runs or runs[metric].isna().all():
                parts.append(f"{name} —")
                continue
            mean, low, high = mean_interval(runs[metric], bounds=(0.0, 1.0))
            text = f"{name} {mean:.3f} {_interval(low, high)}"
            if metric == "attack_tpr_at_low_fpr" and "attack_low_fpr" in runs:
                fpr = runs["attack_low_fpr"].astype(float).max()
                text += "" if math.isnan(fpr) else f" @{100 * fpr:.2g}%"
            row = mine[(mine["method"] == method) & (mine["metric"] == metric)]
            if len(row) and row["verdict"].iloc[0] in ("better", "worse"):
                text += f" ({row['verdict'].iloc[0]})"
            parts.append(text)
        audits = runs[[c for c in ("audit_whitebox", "audit_blackbox") if c in runs]]
        audit = audits.astype(float).max(axis=1).dropna() if len(audits.columns) else \
            pd.Series(dtype=float)
        parts.append(f"audit {audit.min():.2f}–{audit.max():.2f}" if len(audit) else "audit —")
        lines.append(f"    {method.ljust(width)}  " + "; ".join(parts))
    return lines
