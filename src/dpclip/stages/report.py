"""report: one comparison table (Markdown + CSV) over every configured run, figures, and the
overlay plot tables of ``dvc plots`` (:mod:`dpclip.reporting.overlays`), regenerated from the
metrics files; then the MLflow record of this pipeline execution."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import pandas as pd

from dpclip.attacks import available_attacks, baseline_attack, get_attack
from dpclip.audit.status import audit_status
from dpclip.config import Params
from dpclip.errors import DpclipError
from dpclip.files import read_json, write_csv_frame, write_text
from dpclip.layout import Layout
from dpclip.metrics import dp_bound_unchecked, membership_game_bound, strongest_attack
from dpclip.run_keys import RunKey, configured_runs
from dpclip.pipeline.side_by_side import in_a_worker
from dpclip.reporting.plots import (CONTROLLER_PANELS, audit_figure, clip_figure,
                                    comparison_figure, controller_figure, dp_bound_curve,
                                    privacy_utility_figure, roc_figure)
from dpclip.reporting.seed_stats import (BASELINE, CONFIGURATION, HEADLINE,
                                         paired_comparison, seed_summary)
from dpclip.reporting.summary_table import LEGEND, legend, summary_frame, text_table
from dpclip.reporting.summary_table import markdown_table as summary_markdown
from dpclip.reporting.overlays import read_roc, write_overlays
from dpclip.tracking import describe as describe_logged
from dpclip.tracking import log_pipeline


def _by_configuration(runs: list[RunKey]) -> dict[tuple, list[RunKey]]:
    groups: dict[tuple, list[RunKey]] = {}
    for key in runs:
        groups.setdefault((key.epsilon, key.alpha, key.seed), []).append(key)
    return groups


COLUMNS = ["run", "method", "dp_guarantee", "target_epsilon", "epsilon", "alpha", "seed",
           "accuracy", "ece", "mce", "brier", "nll", "mia_auc", "mia_balanced_accuracy",
           "mia_tpr_at_fpr_1pct", "mia_tpr_at_fpr_0.1pct", "peak_ir_mia", "peak_ir_layer",
           "noise_multiplier", "c_final", "stopped_epoch", "epsilon_saved",
           # added later, at the end (tools read the columns above by position too)
           "adjacency", "secure_noise", "epsilon_bound", "dp_bound_margin", "dp_bound_violated",
           "label_only_auc", "label_only_auc_unmatched",
           "audit_whitebox", "audit_blackbox", "audit_violated",
           "lira_auc", "lira_tpr_at_fpr_0.1pct", "rmia_auc", "rmia_tpr_at_fpr_0.1pct",
           "strongest_attack", "strongest_tpr_at_fpr_0.1pct", "tpr_bound_at_fpr_0.1pct",
           "audit_status", "strongest_auc", "test_auc",
           "attack", "attack_auc", "attack_low_fpr", "attack_tpr_at_low_fpr",
           "attack_tpr_at_zero_fp", "c_initial", "c_median", "peak_ir_mia_train",
           "clamp_hits_min", "clamp_hits_max", "clamp_share", "noise_shared",
           "public_accuracy"]


def _dp_bound_checks(mia: dict) -> list[dict]:
    """The checked DP-bound results of every attack in a metrics file's ``mia`` (the current
    format: ``worst_margin``; older files' checks are not comparable and are left out)."""
    checks = [v.get("dp_bound") for v in mia.values() if isinstance(v, dict)]
    return [c for c in checks if isinstance(c, dict) and c.get("checked")
            and c.get("worst_margin") is not None]


def worst_dp_bound_margin(mia: dict) -> float | None:
    """The largest certified margin over every attack of the run (> 0: a privacy bug), None
    when no attack was checked."""
    checks = _dp_bound_checks(mia)
    return max(c["worst_margin"] for c in checks) if checks else None


def table_row(m: dict) -> dict:
    p, u, a = m["privacy"], m["utility"], m["mia"][baseline_attack().name]
    ir = m["mia"].get("ir") or {}
    checks, label_only = _dp_bound_checks(m["mia"]), m["mia"].get("label_only") or {}
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
            "adjacency": p.get("adjacency"), "secure_noise": p.get("secure_noise"),
            "epsilon_bound": p.get("epsilon_bound"),
            "dp_bound_margin": worst_dp_bound_margin(m["mia"]),
            "dp_bound_violated": any(c["violated"] for c in checks) if checks else None,
            "label_only_auc": label_only.get("auc"),
            "label_only_auc_unmatched": label_only.get("auc_unmatched"),
            **audit_columns(m.get("audit") or {}), **attack_columns(m["mia"], p),
            "test_auc": u.get("auc"), "c_initial": m["clip"]["c_initial"],
            "c_median": m["clip"].get("c_median"),
            "peak_ir_mia_train": (m["mia"].get("ir_train") or {}).get("peak_accuracy"),
            **{key: m["clip"].get(key) for key in ("clamp_hits_min", "clamp_hits_max",
                                                   "clamp_share")},
            "noise_shared": p.get("noise_shared_across_runs"),
            "public_accuracy": u.get("public_accuracy")}


def tpr_bound_at(fpr: float, privacy: dict) -> float | None:
    """The largest TPR at ``fpr`` any attack may reach in our membership game under the run's
    DP claim, min(1, e^eps' fpr + delta', 1 - e^-eps' (1 - delta' - fpr)) with (eps', delta')
    of its adjacency (:func:`dpclip.metrics.membership_game_bound`: (2 eps, (1 + e^eps) delta)
    for add/remove, (eps, delta) for replace-one; :func:`dpclip.reporting.plots.dp_bound_curve`, the
    curve the ROC figures draw); None without a DP claim."""
    if dp_bound_unchecked(privacy) is not None:
        return None
    eps, delta = membership_game_bound(privacy.get("adjacency"), float(privacy["epsilon"]),
                                       float(privacy["delta"]))
    return float(dp_bound_curve(fpr, eps, delta))


def prefixed_attack_columns(name: str) -> list[str]:
    """The comparison table's columns of a registered attack besides the baseline (whose
    numbers are the ``mia_*`` columns): ``<name>_auc``, ``<name>_tpr_at_fpr_0.1pct``."""
    prefix = get_attack(name).prefix()
    return [f"{prefix}_auc", f"{prefix}_tpr_at_fpr_0.1pct"] if prefix else []


def table_columns(attacks) -> list[str]:
    """:data:`COLUMNS`, then the columns of each of ``attacks`` that it lacks (an attack added
    after the table's layout was fixed), in their order."""
    extra = [c for name in attacks for c in prefixed_attack_columns(name) if c not in COLUMNS]
    return COLUMNS + list(dict.fromkeys(extra))


def attacks_in(metrics: list[dict]) -> list[str]:
    """The registered record-level attacks that ran on any of the runs, in registry order."""
    ran = {name for m in metrics for name in m["mia"]}
    return [name for name in available_attacks() if name in ran]


def attack_columns(mia: dict, privacy: dict) -> dict:
    """Each attack's AUC and TPR at 0.1% FPR (— where it did not run: no reference models),
    and the strongest record-level attack's TPR at 0.1% FPR next to what the DP claim allows
    there."""
    columns = {}
    for name in available_attacks():
        for column, key in zip(prefixed_attack_columns(name), ("auc", "tpr_at_fpr_0.1pct")):
            columns[column] = (mia.get(name) or {}).get(key)
    strongest = strongest_attack(mia)
    columns["strongest_attack"] = strongest[0] if strongest else None
    columns["strongest_auc"] = strongest[1]["auc"] if strongest else None
    columns["strongest_tpr_at_fpr_0.1pct"] = strongest[1]["tpr_at_fpr_0.1pct"] if strongest \
        else None
    columns["tpr_bound_at_fpr_0.1pct"] = tpr_bound_at(0.001, privacy)
    headline = mia.get("headline") or {}  # the attack chosen in advance (attack.headline)
    columns["attack"] = headline.get("attack")
    columns["attack_auc"] = headline.get("auc")
    columns["attack_low_fpr"] = headline.get("low_fpr")
    columns["attack_tpr_at_low_fpr"] = headline.get("tpr_at_low_fpr")
    columns["attack_tpr_at_zero_fp"] = headline.get("tpr_at_zero_fp")
    return columns


def audit_columns(audit: dict) -> dict:
    """The audit's lower bound per canary kind (— when not audited or not applicable) and
    whether any refutes the run's DP claim."""
    bound = {kind: (audit.get(kind) or {}).get("epsilon_lower_bound")
             for kind in ("whitebox", "blackbox")}
    applicable = [r for r in audit.values() if isinstance(r, dict) and r.get("applicable")]
    return {"audit_whitebox": bound["whitebox"], "audit_blackbox": bound["blackbox"],
            "audit_violated": any(r["violated"] for r in applicable) if applicable else None,
            "audit_status": audit_status(audit)}


def markdown_table(table: pd.DataFrame) -> str:
    def fmt(v, column: str):
        if v is None or (isinstance(v, float) and pd.isna(v)):
            return "—"
        if v is True and column == "audit_violated":  # a privacy bug: impossible to miss
            return "🔴 **True (REFUTED)**"
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    header = "| " + " | ".join(table.columns) + " |"
    rule = "|" + "|".join("---" for _ in table.columns) + "|"
    rows = ["| " + " | ".join(fmt(v, column) for column, v in zip(table.columns, row)) + " |"
            for row in table.astype(object).itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def _shadow_notes(layout: Layout) -> list[str]:
    risk = read_json(layout.shadow_risk) if layout.shadow_risk.exists() else {}
    if not risk.get("layers"):  # no shadow stage, or no method needed it
        return []
    rates = ", ".join(f"{n} {v['error_rate']:.3f}" for n, v in risk["layers"].items())
    return [f"Shadow-model risk ER per layer ({risk['risk_eval']}, {risk['classifier']}; "
            f"lower = leakier), used by lm_dp_sgd: {rates}."]


DATA_USE = "data_use.md"
SUMMARY_CSV, SUMMARY_TEXT = "summary.csv", "summary.txt"  # the short table (make run prints it)
OPTIONAL_FIGURES = ("claimed_vs_audited_epsilon.png", "privacy_utility.png",
                    "controller.png")  # and roc_*.png
CONTROLLER_CSV = "controller.csv"  # WW-DP-SGD's probes, every run of it (presets commit it)


def controller_frame(traces: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The rows of the runs' traces at WW-DP-SGD's probes (its controller's updates): run,
    step, C_t, zeta (raw and smoothed), the probed weights' norm. Empty without such runs."""
    columns = ["run", "step", "ww_zeta", *(column for column, _ in CONTROLLER_PANELS)]
    frames = [trace.dropna(subset=["ww_zeta"]).assign(run=name).reindex(columns=columns)
              for name, trace in traces.items() if "ww_zeta" in trace]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def attack_notes(attacks: list[str]) -> list[str]:
    """One line per attack that ran besides the baseline (the ``mia_*`` note): its columns and
    what it does (from its module)."""
    return [f"`{get_attack(name).prefix()}_*`: {get_attack(name).label}, "
            f"{get_attack(name).description}." for name in attacks if get_attack(name).prefix()]

ADDED_NOTES = [
    "`adjacency`: the neighbouring notion of the row's epsilon. `add_remove` (gradient methods: "
    "one record added or removed, Opacus accounting under Poisson sampling) and "
    "`replace_one_features` (the sanitization-layer method: one record's features replaced, "
    "labels public, no subsampling) are different quantities: an epsilon of one kind is not "
    "comparable as the same number with an epsilon of the other.",
    "`epsilon_bound`: `fixed_horizon` = the accountant's epsilon of the steps run, planned in "
    "advance; `odometer` = the run was stopped early at a data-dependent epoch and its epsilon "
    "is an ex-post RDP privacy-odometer bound, valid at a stopping time; `planned` = stopped "
    "early, but the planned run's bound is smaller and is the one reported.",
    "`secure_noise: False`: the noise is a deterministic function of train.seed and the run's "
    "identity (a reproducible research run, not for release); `True`: seeded from "
    "operating-system entropy, never stored. `noise_shared: True` "
    "(privacy.common_random_numbers): runs of one seed share their noise, which cancels in "
    "the difference of two such models: never release them together.",
    "`dp_bound_margin`: the worst margin over every attack (loss and each IR layer) and every "
    "ROC point of TPR <= e^eps' FPR + delta' and 1 - FPR <= e^eps' (1 - TPR) + delta' (eps', "
    "delta' of the evaluation game for the row's adjacency: (eps, delta) for "
    "replace_one_features, (2 eps, (1 + e^eps) delta) for add_remove), lower confidence limit "
    "of the left side minus upper limit of the right, with a band simultaneous over every "
    "threshold, both directions and all the row's attacks (95% for the row as a whole); > 0 "
    "(`dp_bound_violated`) is a certified violation, a privacy bug; — = not checked (no DP "
    "claim).",
    "`label_only_auc`: the attacker who knows only the class frequencies of members and "
    "non-members, on the class-matched sets the attacks use (0.5 when matching works); "
    "`label_only_auc_unmatched`: the same attacker against the whole holdout, i.e. what the "
    "label shift alone would have given an attack scored without matching.",
    "`audit_whitebox`, `audit_blackbox`: the one-run audit's lower bound on epsilon (Steinke, "
    "Nasr and Jagielski 2023) at `audit.confidence`, from an extra model trained with the run's "
    "own configuration and canaries included with probability 1/2: gradient canaries in the DP "
    "step (white-box) or mislabelled public records scored by their loss (black-box). Every "
    "epsilon below it is refuted by the canaries; `audit_violated: True` (a bound above the "
    "claimed epsilon of a run with a DP guarantee) is a privacy bug. — = not applicable (no DP "
    "claim, replace-one-features adjacency) or not audited; `audit_status` says which.",
    "`<attack>_*` (`lira_*`, `rmia_*`, ... one pair of columns per attack of `attack.kinds` "
    "besides the loss attack, whose columns are `mia_*`; what each attack does is listed "
    "below the table): the attacks that need reference models are calibrated per record with "
    "`attack.references` models trained like the run (its configuration, its sampling rate, "
    "steps and noise, on as many records as it had: offline from the public population, online "
    "on halves of members and holdout); — = not run on that row (no reference models: the "
    "metrics file's `mia.not_run` says why). TPR at 0.1% FPR: with fewer than 10,000 "
    "non-members it allows fewer than 10 false positives, and below 1000 it is the TPR at no "
    "false positive at all. "
    "`attack`: the attack compared across methods and seeds, chosen in advance "
    "(`attack.headline`); `attack_tpr_at_low_fpr`: its TPR at `attack_low_fpr`, the smallest "
    "FPR that allows 10 false positives (never below 0.1%); `attack_tpr_at_zero_fp`: its TPR "
    "with no false positive. `strongest_attack`: the record-level attack with "
    "the highest TPR at 0.1% FPR (ties: AUC), the best of each run and so biased upward; "
    "`tpr_bound_at_fpr_0.1pct`: the most any attack may reach there "
    "under the row's DP claim in this evaluation game, min(1, e^eps' 0.001 + delta', "
    "1 - e^-eps' (0.999 - delta')) with the eps', delta' of `dp_bound_margin` (about 1 = the "
    "claim allows about anything at this FPR).",
    "`c_initial`: the clip threshold of the run's first step (C_0; with `c_final`, how far an "
    "adaptive method moved it); `c_median`: its median over the run's steps. "
    "`clamp_hits_min` / `clamp_hits_max`: the controller's updates at which its clamp set C_t "
    "to the lower / upper bound (WW-DP-SGD; empty for a method without a clamp); "
    "`clamp_share`: their sum over the controller's updates.",
    "— = not recorded.",
]


def _with_interval(value, low, high) -> str:
    if value is None or pd.isna(value):
        return "—"
    if low is None or pd.isna(low):
        return f"{value:.4g}"
    return f"{value:.4g} [{low:.4g}, {high:.4g}]"


def _range(low, high) -> str:
    if low is None or pd.isna(low):
        return "—"
    return f"{low:.4g}" if low == high else f"{low:.4g} to {high:.4g}"


def seeds_section(summary: pd.DataFrame, paired: pd.DataFrame, out) -> list[str]:
    """Write ``seeds.csv`` (mean and 95% interval of each headline metric per configuration)
    and ``paired_vs_dp_sgd.csv`` (:mod:`dpclip.reporting.seed_stats`); return the report's
    section on them, which says so when one seed allows no interval and no test."""
    write_csv_frame(out / "seeds.csv", summary)
    write_csv_frame(out / "paired_vs_dp_sgd.csv", paired)
    lines = ["", "## Over seeds", ""]
    if summary.empty or summary["seeds"].max() < 2:
        return lines + ["One seed per configuration (`train.seeds`): no interval is given and "
                        "no difference between methods is tested. With two or more seeds this "
                        "section gives each metric's mean and 95% interval, and a paired "
                        f"verdict against `{BASELINE}`."]
    shown = summary[CONFIGURATION + ["seeds"]].copy()
    for metric, judged in HEADLINE.items():
        if judged is None:
            shown[metric] = [_range(low, high) for low, high in zip(
                summary[f"{metric}_min"], summary[f"{metric}_max"])]
            continue
        shown[metric] = [_with_interval(*v) for v in zip(
            summary[metric], summary[f"{metric}_low"], summary[f"{metric}_high"])]
    lines += ["Mean and 95% Student-t interval over seeds (`seeds.csv`); `attack_*`: the "
              "attack chosen in advance (`attack.headline`), its AUC and its TPR at the honest "
              "low FPR (at least 10 false positives allowed), `audit_epsilon`: the smallest and "
              "largest per-seed audited lower bound (each run's larger kind; a mean of lower "
              "bounds would be no bound).", "", markdown_table(shown)]
    if paired.empty:
        return lines + ["", f"No `{BASELINE}` run to compare with."]
    verdicts = paired[["target_epsilon", "alpha", "method", "metric", "seeds"]].copy()
    verdicts["difference"] = [_with_interval(*v) for v in zip(
        paired["difference"], paired["difference_low"], paired["difference_high"])]
    verdicts["p_holm"] = paired["p_holm"]
    verdicts["verdict"] = paired["verdict"]
    return lines + ["", f"### Paired with `{BASELINE}` (same seed, method minus {BASELINE})",
                    "", "Exact sign-flip test over seeds and its interval (the paired t-test beyond "
                    "16 seeds; below 6 seeds no difference can reach 5%), Holm-adjusted over "
                    "the methods per metric "
                    "and configuration (`paired_vs_dp_sgd.csv`); better / worse at 5%, by the "
                    "metric's direction (higher accuracy; lower ECE and attack success).", "",
                    markdown_table(verdicts)]


def references_section(metrics: list[dict]) -> list[str]:
    """The report's check that LiRA's and RMIA's reference models were trained like each
    target (``mia.references.match``): the target's (n, q, T, sigma), whether every reference
    model has the same, and how confident each side is on records it did not train on."""
    rows = []
    for m in metrics:
        match = ((m.get("mia") or {}).get("references") or {}).get("match")
        if not match:
            continue
        target, refs = match["target"], match["references"]
        rows.append({"run": m["run"], "K": len(refs["n_train"]),
                     "n": target["n_train"], "q": target["sample_rate"],
                     "steps": target["steps"], "sigma": target["noise_multiplier"],
                     "same (n, q, T, sigma)": ", ".join(
                         "yes" if match["matched"][k] else "no" for k in
                         ("n_train", "sample_rate", "steps", "noise_multiplier")),
                     "unseen accuracy: target / references": f"{target['unseen_accuracy']:.3f} / "
                                                             f"{refs['unseen_accuracy']:.3f}",
                     "unseen mean phi: target / references": f"{target['unseen_mean_phi']:.2f} / "
                                                             f"{refs['unseen_mean_phi']:.2f}",
                     "phi correlation of the references":
                         "—" if refs.get("unseen_phi_correlation") is None
                         else f"{refs['unseen_phi_correlation']:.2f}"})
    if not rows:
        return []
    return ["", "## Reference models of LiRA and RMIA", "",
            "Each run's reference models are trained like it (its n, sampling rate q, steps T "
            "and noise multiplier sigma: `mia.references.match` in the metrics); weaker ones "
            "would understate the attacks. Accuracy and mean logit-confidence phi on the "
            "holdout, which none of them trained on (offline).", "", markdown_table(
                pd.DataFrame(rows))]


def tuning_section(layout: Layout, out) -> list[str]:
    """The report's section on ``dpclip tune`` (and ``tuning.csv``): per method and epsilon,
    the public validation accuracy of params.yaml's values and of the chosen ones, and the
    chosen values; with tuning off, a line saying the runs use params.yaml's values."""
    lines = ["", "## Tuning", ""]
    record = read_json(layout.tuned) if layout.tuned.is_file() else {"trials": 0}
    if not record["trials"]:
        (out / "tuning.csv").unlink(missing_ok=True)
        return lines + ["Not tuned (`tune.trials: 0`): every run uses the values in "
                        "params.yaml. `dpclip tune` gives every method the same number of "
                        "trials on public data (docs/tuning.md)."]
    rows = [{"method": method, "target_epsilon": tag.removeprefix("eps"),
             "trials": e["trials"], "default_accuracy": e.get("default_heldout_accuracy"),
             "tuned_accuracy": e.get("heldout_accuracy"),
             "gain": None if None in (e.get("default_heldout_accuracy"),
                                      e.get("heldout_accuracy")) else
             e["heldout_accuracy"] - e["default_heldout_accuracy"],
             "selection_accuracy": e["accuracy"],
             "values": ", ".join(f"{k} = {v:.4g}" for k, v in e["values"].items())}
            for method, by_eps in record["runs"].items() for tag, e in by_eps.items()]
    frame = pd.DataFrame(rows)
    write_csv_frame(out / "tuning.csv", frame)
    return lines + [f"Every run above trained with the values below, chosen by "
                    f"{record['trials']} {record['sampler']} trials per method and target "
                    f"epsilon (seed {record['seed']}); objective: {record['objective']} "
                    f"(`selection_accuracy`: the best trial's, biased upward by the choice). "
                    f"The first trial is params.yaml's values; `default_accuracy` and "
                    f"`tuned_accuracy` score them and the chosen values on public records the "
                    f"search never saw, and `gain` is their difference. Public data only: the "
                    f"search spends no privacy budget (`tuning.csv`).", "",
                    markdown_table(frame)]


def _cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def data_use_markdown(metrics: list[dict]) -> str:
    """``privacy.data_use`` of every run: one section per distinct mapping (component -> the
    data it saw), naming the runs it belongs to (a single table when all runs agree)."""
    groups: dict[str, tuple[dict | None, list[str]]] = {}
    for m in metrics:
        use = (m.get("privacy") or {}).get("data_use") or None
        key = repr(sorted(use.items())) if isinstance(use, dict) else repr(use)
        groups.setdefault(key, (use, []))[1].append(m["run"])
    lines = ["# Data use per run", "",
             "Which data each component of a run saw (the run record's `privacy.data_use`). "
             "Only the DP mechanism's releases are covered by the run's epsilon; components "
             "marked public saw only public splits, disjoint from the members.", ""]
    for use, runs in groups.values():
        title = "All runs" if len(groups) == 1 else ", ".join(f"`{r}`" for r in runs)
        lines += [f"## {title}", ""]
        if not isinstance(use, dict):
            lines += ["— (not recorded)", ""]
            continue
        lines += ["| component | data it saw |", "|---|---|"]
        lines += [f"| {_cell(k)} | {_cell(v)} |" for k, v in use.items()]
        lines.append("")
    return "\n".join(lines)


@dataclass
class ReportResult:
    table: pd.DataFrame  # one row per run, every column (comparison.csv)
    summary: pd.DataFrame  # one row per configuration over its seeds (summary.csv)
    mlflow: dict | None  # what tracking logged (None when tracking was skipped)


def report(params: Params, layout: Layout = Layout(), track: bool = True,
           jobs: int = 1) -> ReportResult:
    """Write the tables and figures from the metrics files, then (``track``) log the pipeline
    execution to MLflow, its children ``jobs`` at a time in worker processes; with ``jobs`` >
    1 the figures are drawn in one more worker as the store is opened (:func:`draw_figures`)."""
    runs = configured_runs(params)
    missing = [k.name for k in runs if not (layout.metrics(k.name).exists()
                                            and layout.summary(k.name).exists())]
    if missing:
        raise DpclipError(f"metrics missing for {missing}: run the evaluate stage first")
    metrics = [read_json(layout.metrics(k.name)) for k in runs]
    table = pd.DataFrame([table_row(m) for m in metrics], columns=table_columns(
        attacks_in(metrics)))
    out = layout.reports
    write_csv_frame(out / "comparison.csv", table)
    notes = ["", "`dp_guarantee: false` rows are non-private or literal-paper variants: their "
                 "epsilon is not a guarantee.",
             "`mia_*`: loss-threshold membership attack, members = records trained on, "
             "non-members = target holdout records drawn with the members' class counts "
             "(class-matched, so label skew is not counted as membership).",
             "`peak_ir_mia`: the highest held-out accuracy of the per-layer attacks on "
             "intermediate representations (0.5 is a guess), and the layer where it peaks, on "
             "the same class-matched sets. `peak_ir_mia_train` (`evaluate.ir_train_scoring`): "
             "the same attacks scored on the records each classifier was fitted on, the "
             "LM-DP-SGD paper's protocol (it measures the classifier's capacity to memorise as "
             "much as the model's leakage).",
             *ADDED_NOTES, *attack_notes(attacks_in(metrics)),
             f"Which data each component of each run saw: [data_use.md]({DATA_USE})."]
    notes += _shadow_notes(layout)
    by_seed, paired = seed_summary(table), paired_comparison(table)
    notes += seeds_section(by_seed, paired, out)
    notes += references_section(metrics)
    notes += tuning_section(layout, out)
    short = summary_frame(table, by_seed, paired)
    write_csv_frame(out / SUMMARY_CSV, short)
    write_text(out / SUMMARY_TEXT, text_table(short) + "\n\n" + legend() + "\n")
    write_text(out / "comparison.md", f"# dpclip comparison ({params.data.dataset})\n\n"
               + summary_markdown(short) + "\n\n" + LEGEND + "\n\n## Every run\n\n"
               + markdown_table(table) + "\n" + "\n".join(notes) + "\n")
    write_text(out / DATA_USE, data_use_markdown(metrics))
    overlays = write_overlays(layout, runs)
    drawing = partial(draw_figures, layout, runs, table, attacks_in(metrics),
                      overlays["privacy_utility_seeds.csv"])
    if track and jobs > 1:
        # drawn in a worker while this process creates the MLflow store (its schema
        # migrations are slow on a new one); logged once drawn
        with in_a_worker(drawing, "drawing the report's figures") as drawn:
            logged = log_pipeline(params, layout, runs, jobs, figures=drawn)
    else:
        drawing()
        logged = log_pipeline(params, layout, runs, jobs) if track else None
    return ReportResult(table, short, logged)


def draw_figures(layout: Layout, runs: list[RunKey], table: pd.DataFrame, attacks: list[str],
                 privacy_utility: pd.DataFrame) -> None:
    """The report's figures in ``reports/``: claimed against audited epsilon, the comparison,
    the clip thresholds (all runs, then per configuration), one ROC figure per attack,
    privacy against utility over seeds, and WW-DP-SGD's controller at its probes (with its
    rows in controller.csv, which presets commit)."""
    out = layout.reports
    traces = {k.name: pd.read_csv(layout.trace(k.name)) for k in runs}
    rocs = {k.name: read_roc(layout, k.name) for k in runs}
    # figures that exist only with what they show (audits, LiRA / RMIA, private runs): one
    # left from an earlier report must not pass for current (the Prefect flow and the CLI
    # write into the same folder; DVC empties it first)
    for path in [*(out / name for name in OPTIONAL_FIGURES), *out.glob("roc*.png")]:
        path.unlink(missing_ok=True)
    audit_figure(out / "claimed_vs_audited_epsilon.png", table)
    comparison_figure(out / "comparison.png", table)
    clip_figure(out / "clip_thresholds.png", traces, title="Clip threshold C_t by run")
    for (epsilon, alpha, seed), keys in _by_configuration(runs).items():
        # one figure per (epsilon, alpha, seed): every method's C_t schedule overlaid
        clip_figure(out / f"clip_thresholds-eps{epsilon}-{alpha}-seed{seed}.png",
                    {k.method: traces[k.name] for k in keys},
                    title=f"C_t by method (target eps {epsilon}, alpha {alpha}, seed {seed})")
    for name in attacks:  # one figure per attack: roc.png (loss), roc_<name>.png
        attack = get_attack(name)
        curves = {run: roc[roc["attack"] == name] for run, roc in rocs.items()}
        curves = {run: roc for run, roc in curves.items() if len(roc)}
        if curves:
            roc_figure(out / f"{attack.figure_stem()}.png", curves,
                       title=f"{attack.label} ROC by run")
    privacy_utility_figure(out / "privacy_utility.png", privacy_utility)
    controller = controller_frame(traces)
    (out / CONTROLLER_CSV).unlink(missing_ok=True)
    if len(controller):
        write_csv_frame(out / CONTROLLER_CSV, controller)
        controller_figure(out / "controller.png",
                          {run: traces[run] for run in controller["run"].unique()},
                          title="WW-DP-SGD's controller at its probes, by run")


def describe(result: ReportResult, layout: Layout) -> str:
    """What ``dpclip report`` prints: the short table, where the full one is, what MLflow got."""
    lines = [(layout.reports / SUMMARY_TEXT).read_text().rstrip("\n"),
             f"Every column of every run: {layout.reports / 'comparison.md'}"]
    if result.mlflow:
        lines.append(describe_logged(result.mlflow))
    return "\n".join(lines)
