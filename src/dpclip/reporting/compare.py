"""``dpclip compare``: DVC experiments side by side as one long, narrow table.

One row per (run, experiment), the rows of a run together, with the numbers a comparison of
DP methods rests on, under the parameters that differ. The experiments are read with DVC's own
API (``Repo.experiments.show``); experiments on different data (their summaries filed under
different data identities, :mod:`dpclip.summaries`) are never differenced against each other:
each group gets its own table. docs/dvc.md, "Comparing experiments: dpclip compare".
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dpclip.errors import DpclipError
from dpclip.reporting.epsilon_marks import LEGEND, epsilon_mark, summary_adjacency
from dpclip.summaries import unfiled

MAX_WIDTH = 120
SUMMARY_DIR = "summary"
# summary key -> (header, decimals)
METRICS = {"epsilon": ("eps", 2), "accuracy": ("accuracy", 4), "ece": ("ECE", 4),
           "attack_auc": ("attack AUC", 4), "attack_tpr_at_low_fpr": ("TPR @FPR", 3),
           "audit_epsilon_lower_bound": ("audit>=", 2)}
RUN_WIDTH, EXPERIMENT_WIDTH = 34, 18  # longer names are cut with "…"


@dataclass
class Experiment:
    """One row of ``dvc exp show``: its name, revision, per-run summaries and parameters."""

    name: str
    rev: str
    summaries: dict[str, dict] = field(default_factory=dict)  # run name -> summary metrics
    params: dict[str, object] = field(default_factory=dict)  # flattened params.yaml
    data: str | None = None  # the data identities its summaries are filed under


def experiment_from_row(row: dict, name: str | None = None) -> Experiment:
    """An :class:`Experiment` from one revision of ``dvc exp show --json``."""
    rev = str(row.get("rev") or "")
    data = row.get("data") or {}
    summaries, identities = {}, set()
    for path, entry in (data.get("metrics") or {}).items():
        parts = Path(path).parts
        if len(parts) == 2 and parts[0] == SUMMARY_DIR and path.endswith(".json"):
            identity, summaries[Path(path).stem] = unfiled((entry or {}).get("data") or {})
            identities.add(identity)
    params = pd.json_normalize(((data.get("params") or {}).get("params.yaml") or {}).get(
        "data") or {}).to_dict("records")[0]  # flattened: "train.lr"
    label = name or row.get("name") or (rev if rev == "workspace" else rev[:7])
    return Experiment(str(label), rev, summaries, params,
                      ", ".join(sorted(i for i in identities if i)) or None)


def experiments_from_json(rows: list[dict]) -> list[Experiment]:
    """Every revision of ``dvc exp show --json`` output, baselines before their experiments;
    the workspace only when it differs from the baseline it sits on."""
    found, workspace = [], None
    for row in rows:
        if row.get("rev") == "workspace":
            workspace = experiment_from_row(row)
            continue
        found.append(experiment_from_row(row))
        for group in row.get("experiments") or []:
            for rev in group.get("revs") or []:
                found.append(experiment_from_row(rev, group.get("name") or rev.get("name")))
    if workspace is not None and not any(
            e.summaries == workspace.summaries and e.params == workspace.params for e in found):
        found.insert(0, workspace)
    return found


def dvc_experiments(root: Path, revs: list[str] | None = None, num: int = 1) -> list[Experiment]:
    """The experiments of the DVC project at ``root`` (``dvc exp show``'s selection: ``revs``
    as baselines, default HEAD, with ``num`` commits back)."""
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    try:
        with Repo(str(root)) as repo:
            states = repo.experiments.show(revs=revs, num=num)
            rows = [state.dumpd() for state in states]
    except DvcException as exc:
        raise DpclipError(f"DVC could not list the experiments of {root}: "
                          f"{exc}") from exc
    return experiments_from_json(rows)


def select(experiments: list[Experiment], wanted: list[str]) -> list[Experiment]:
    """The experiments named in ``wanted`` (a name, or a revision's prefix), in that order; all
    of them when ``wanted`` is empty."""
    if not wanted:
        return experiments
    chosen = []
    for want in wanted:
        match = [e for e in experiments if e.name == want or (len(want) >= 4
                                                               and e.rev.startswith(want))]
        if not match:
            names = ", ".join(e.name for e in experiments) or "none"
            raise DpclipError(f"no experiment {want!r} (there are: {names})")
        chosen.append(match[0])
    return chosen


def changed_params(experiments: list[Experiment]) -> dict[str, list]:
    """params.yaml keys whose value differs between the experiments (in their order)."""
    keys = sorted({k for e in experiments for k in e.params})
    return {k: [e.params.get(k) for e in experiments] for k in keys
            if len({repr(e.params.get(k)) for e in experiments}) > 1}


def data_groups(experiments: list[Experiment]) -> list[list[Experiment]]:
    """The experiments grouped by their data (the identity their summaries are filed under,
    else every ``data.*`` parameter), in order of first appearance: only experiments of one
    group are comparable."""
    groups: dict[str, list[Experiment]] = {}
    for e in experiments:
        key = e.data or repr(sorted((k, repr(v)) for k, v in e.params.items()
                                    if k.startswith("data.")))
        groups.setdefault(key, []).append(e)
    return list(groups.values())


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _number(value, decimals: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{float(value):.{decimals}f}"


def comparison_rows(experiments: list[Experiment], only_changed: bool = False) -> list[dict]:
    """One row per (run, experiment), runs in name order; ``d_accuracy``: the accuracy minus
    that of the first experiment holding the run (None on that first row). With ``only_changed``, runs whose summary is
    the same in every experiment are left out."""
    runs = sorted({run for e in experiments for run in e.summaries})
    rows = []
    for run in runs:
        held = [(e, e.summaries[run]) for e in experiments if run in e.summaries]
        if only_changed and len({repr(sorted(s.items())) for _, s in held}) == 1 \
                and len(held) == len(experiments):
            continue
        first = held[0][1].get("accuracy")
        for i, (experiment, summary) in enumerate(held):
            accuracy = summary.get("accuracy")
            rows.append({"run": run, "experiment": experiment.name,
                         **{k: summary.get(k) for k in METRICS},
                         "attack_low_fpr": summary.get("attack_low_fpr"),
                         "dp_guarantee": summary.get("dp_guarantee"),
                         "adjacency": summary_adjacency(summary),
                         "d_accuracy": None if i == 0 or None in (accuracy, first)
                         else accuracy - first})
    return rows


def text_table(rows: list[dict], width: int = MAX_WIDTH) -> str:
    """The rows as aligned text, no line longer than ``width``; a run's name is printed on its
    first row only."""
    headers = {"run": "run", "experiment": "experiment", "epsilon": METRICS["epsilon"][0],
               "accuracy": "accuracy", "d_accuracy": "Δ acc",
               **{k: h for k, (h, _) in METRICS.items() if k not in ("epsilon", "accuracy")}}
    shown, previous = [], None
    for r in rows:
        cells = {"run": _cut(r["run"], RUN_WIDTH) if r["run"] != previous else "",
                 "experiment": _cut(r["experiment"], EXPERIMENT_WIDTH),
                 "d_accuracy": "" if r["d_accuracy"] is None else f"{r['d_accuracy']:+.4f}",
                 **{k: _number(r[k], d) for k, (_, d) in METRICS.items()}}
        if r.get("attack_low_fpr") is not None and cells["attack_tpr_at_low_fpr"] != "—":
            cells["attack_tpr_at_low_fpr"] += f" @{100 * r['attack_low_fpr']:.1f}%"
        if cells["epsilon"] != "—":
            cells["epsilon"] += epsilon_mark(r["dp_guarantee"], r["adjacency"])
        shown.append(cells)
        previous = r["run"]
    keys = list(headers)
    widths = {k: max([len(headers[k]), *(len(c[k]) for c in shown)]) for k in keys}
    lines = []
    for cells in [headers, *shown]:
        parts = [cells[k].ljust(widths[k]) if k in ("run", "experiment") else
                 cells[k].rjust(widths[k]) for k in keys]
        lines.append(_cut("  ".join(parts).rstrip(), width))
    return "\n".join(lines)


def compare_text(experiments: list[Experiment], only_changed: bool = False,
                 width: int = MAX_WIDTH) -> str:
    """What ``dpclip compare`` prints: the differing parameters, then the table."""
    if not experiments:
        return "No DVC experiments to compare (dvc exp run creates them)."
    groups = data_groups(experiments)
    if len(groups) > 1:
        data_keys = [k for k in changed_params(experiments) if k.startswith("data.")]
        why = f"{', '.join(data_keys)} differ" if data_keys else \
            "their results are filed under different data"
        parts = [textwrap.fill(
            f"Not comparable: these experiments ran on {len(groups)} different data sets "
            f"({why}), and a difference across data sets measures the "
            f"data, not the method. Each group is compared within itself.", width)]
        for group in groups:
            label = ", ".join([*([f"data {group[0].data}"] if group[0].data else []),
                               *(f"{k}={group[0].params.get(k)!r}" for k in data_keys)])
            parts += ["", _cut(f"== {label} ==", width),
                      compare_text(group, only_changed, width)]
        return "\n".join(parts)
    names = ", ".join(e.name for e in experiments)
    lines = [_cut(f"Experiments: {names}", width)]
    changed = changed_params(experiments)
    if changed:
        lines.append("Parameters that differ:")
        for key, values in changed.items():
            text = ", ".join(f"{e.name}={v!r}" for e, v in zip(experiments, values))
            lines.append(_cut(f"  {key}: {text}", width))
    rows = comparison_rows(experiments, only_changed)
    if not rows:
        return "\n".join(lines + ["No run differs between these experiments."])
    note = (f"Δ acc: accuracy minus that of the first experiment holding the run "
            f"({experiments[0].name} where it does). eps: the epsilon spent ({LEGEND}); "
            f"attack AUC, TPR @FPR: the attack chosen in advance (attack.headline), its AUC "
            f"and its TPR at the lowest FPR that allows 10 false positives; audit>=: the "
            f"audited lower bound on epsilon.")
    return "\n".join(lines + ["", text_table(rows, width), "", textwrap.fill(note, width)])
