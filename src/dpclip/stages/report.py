"""report: one comparison table (Markdown + CSV) over every configured run, and figures,
regenerated from the metrics files; then the MLflow record of this pipeline execution."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pandas as pd

from dpclip.config import Params, run_name
from dpclip.errors import DpclipError
from dpclip.io import read_json, write_csv_frame, write_text
from dpclip.layout import Layout
from dpclip.plots import clip_figure, comparison_figure, roc_figure


@dataclass(frozen=True)
class RunKey:
    method: str
    epsilon: object
    alpha: object
    seed: int

    @property
    def name(self) -> str:
        return run_name(self.method, self.epsilon, self.alpha, self.seed)


def configured_runs(params: Params) -> list[RunKey]:
    """Every (method, target epsilon, alpha, seed) the parameters ask for (the DVC matrix)."""
    return [RunKey(m, e, a, s) for m, e, a, s in itertools.product(
        params.train.methods, params.privacy.target_epsilons, params.partition.alphas,
        params.train.seeds)]


def _by_configuration(runs: list[RunKey]) -> dict[tuple, list[RunKey]]:
    groups: dict[tuple, list[RunKey]] = {}
    for key in runs:
        groups.setdefault((key.epsilon, key.alpha, key.seed), []).append(key)
    return groups


COLUMNS = ["run", "method", "dp_guarantee", "target_epsilon", "epsilon", "alpha", "seed",
           "accuracy", "ece", "mce", "brier", "nll", "mia_auc", "mia_balanced_accuracy",
           "mia_tpr_at_fpr_1pct", "mia_tpr_at_fpr_0.1pct", "peak_ir_mia", "peak_ir_layer",
           "noise_multiplier", "c_final", "stopped_epoch", "epsilon_saved", "train_s"]


def table_row(m: dict) -> dict:
    p, u, a = m["privacy"], m["utility"], m["mia"]["loss"]
    ir = m["mia"].get("ir") or {}
    return {"run": m["run"], "method": m["method"], "dp_guarantee": p["dp_guarantee"],
            "target_epsilon": p["target_epsilon"], "epsilon": p["epsilon"],
            "alpha": "iid" if m["alpha"] is None else m["alpha"], "seed": m["seed"],
            "accuracy": u["accuracy"], "ece": u["ece"], "mce": u["mce"], "brier": u["brier"],
            "nll": u["nll"], "mia_auc": a["auc"], "mia_balanced_accuracy": a["balanced_accuracy"],
            "mia_tpr_at_fpr_1pct": a["tpr_at_fpr_1pct"],
            "mia_tpr_at_fpr_0.1pct": a["tpr_at_fpr_0.1pct"],
            "peak_ir_mia": ir.get("peak_accuracy"), "peak_ir_layer": ir.get("peak_layer"),
            "noise_multiplier": p["noise_multiplier"], "c_final": m["clip"]["c_final"],
            "stopped_epoch": m.get("training", {}).get("stopped_epoch"),
            "epsilon_saved": p.get("epsilon_saved"),
            "train_s": m["time"]["train_s"]}


def markdown_table(table: pd.DataFrame) -> str:
    def fmt(v):
        if v is None or (isinstance(v, float) and pd.isna(v)):
            return "—"
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    header = "| " + " | ".join(table.columns) + " |"
    rule = "|" + "|".join("---" for _ in table.columns) + "|"
    rows = ["| " + " | ".join(fmt(v) for v in row) + " |"
            for row in table.astype(object).itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def _shadow_notes(layout: Layout) -> list[str]:
    if not layout.shadow_risk.exists():
        return []
    risk = read_json(layout.shadow_risk)
    rates = ", ".join(f"{n} {v['error_rate']:.3f}" for n, v in risk["layers"].items())
    return [f"Shadow-model risk ER per layer ({risk['risk_eval']}, {risk['classifier']}; "
            f"lower = leakier), used by lm_dp_sgd: {rates}."]


@dataclass
class ReportResult:
    table: pd.DataFrame
    mlflow: dict | None  # what tracking logged (None when tracking was skipped)


def report(params: Params, layout: Layout = Layout(), track: bool = True) -> ReportResult:
    runs = configured_runs(params)
    missing = [k.name for k in runs if not layout.metrics(k.name).exists()]
    if missing:
        raise DpclipError(f"metrics missing for {missing}: run the evaluate stage first")
    metrics = [read_json(layout.metrics(k.name)) for k in runs]
    table = pd.DataFrame([table_row(m) for m in metrics], columns=COLUMNS)
    out = layout.reports
    write_csv_frame(out / "comparison.csv", table)
    notes = ["", "`dp_guarantee: false` rows are non-private or literal-paper variants: their "
                 "epsilon is not a guarantee.",
             "`mia_*`: loss-threshold membership attack, members = records trained on, "
             "non-members = target holdout.",
             "`peak_ir_mia`: the highest held-out accuracy of the per-layer attacks on "
             "intermediate representations (0.5 is a guess), and the layer where it peaks."]
    notes += _shadow_notes(layout)
    write_text(out / "comparison.md", f"# dpclip comparison ({params.data.dataset})\n\n"
               + markdown_table(table) + "\n" + "\n".join(notes) + "\n")
    traces = {k.name: pd.read_csv(layout.trace(k.name)) for k in runs}
    rocs = {k.name: pd.read_csv(layout.roc(k.name)) for k in runs}
    comparison_figure(out / "comparison.png", table)
    clip_figure(out / "clip_thresholds.png", traces, title="Clip threshold C_t by run")
    for (epsilon, alpha, seed), keys in _by_configuration(runs).items():
        # one figure per (epsilon, alpha, seed): every method's C_t schedule overlaid
        clip_figure(out / f"clip_thresholds-eps{epsilon}-{alpha}-seed{seed}.png",
                    {k.method: traces[k.name] for k in keys},
                    title=f"C_t by method (target eps {epsilon}, alpha {alpha}, seed {seed})")
    roc_figure(out / "roc.png", rocs, title="Loss-attack ROC by run")
    logged = None
    if track:
        from dpclip.tracking import log_pipeline

        logged = log_pipeline(params, layout, [k.name for k in runs])
    return ReportResult(table, logged)
