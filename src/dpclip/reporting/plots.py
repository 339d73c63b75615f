"""Figures (matplotlib, headless), each written atomically as PNG.

Legends sit outside the axes (right of them, or below), so that no legend covers a curve, bar
or point; what a figure leaves out (a bound that constrains nothing, a run without an audit)
it says in a caption under the axes.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from dpclip.files import write_figure
from dpclip.reporting.epsilon_marks import NO_GUARANTEE, OTHER_ADJACENCY, epsilon_mark


def _subplots(*args, **kwargs):
    """``plt.subplots`` on the headless backend; matplotlib is imported on the first figure
    (half a second of imports that the stages drawing nothing need not pay)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def _legend_outside(ax, **kwargs):
    """The axes' legend right of them, top-aligned: it covers nothing drawn inside."""
    return ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0,
                     fontsize=kwargs.pop("fontsize", 7), **kwargs)


def _caption(ax, text: str, width: int = 80, below: float = 40):
    """``text`` under the axes' x label (``below`` points under the axes, wrapped at ``width``
    characters), in small grey type: what the figure leaves out, or how to read it."""
    ax.annotate("\n".join(textwrap.wrap(text, width)), xy=(0, 0), xycoords="axes fraction",
                xytext=(0, -below), textcoords="offset points", ha="left", va="top",
                fontsize=7, color="dimgrey")


def dp_bound_curve(fpr: np.ndarray, epsilon: float, delta: float) -> np.ndarray:
    """The largest TPR an (epsilon, delta) bound allows at each FPR:
    min(1, e^eps FPR + delta, 1 - e^-eps (1 - delta - FPR))."""
    fpr = np.asarray(fpr, dtype=np.float64)
    growth = np.exp(min(epsilon, 700.0))
    return np.clip(np.minimum(growth * fpr + delta, 1.0 - (1.0 - delta - fpr) / growth), 0, 1)


BOUND_VISIBLE = 0.95  # roc_figure: a DP bound is drawn where it falls below this TPR


def roc_figure(path: Path, curves: dict[str, dict], title: str,
               bound: tuple[float, float] | None = None) -> Path:
    """ROC curves on log-log axes (the low-FPR region is where attacks matter), the legend
    right of the axes; with ``bound`` = (eps', delta'), the largest TPR that bound allows
    (dashed red). A bound above ``BOUND_VISIBLE`` at every FPR drawn (a large eps') would run
    along the top edge, unseen: it is not drawn, and a caption under the axes says so."""
    fig, ax = _subplots(figsize=(5, 4.5))
    grid = np.logspace(-4, 0, 200)
    ax.plot(grid, grid, color="grey", linestyle=":", label="chance")
    if bound is not None:
        allowed = dp_bound_curve(grid, *bound)
        if (allowed < BOUND_VISIBLE).any():
            ax.plot(grid, np.clip(allowed, 1e-4, 1), color="red", linestyle="--",
                    label=f"DP bound (eps' {bound[0]:.3g})")
        else:
            _caption(ax, f"DP bound (eps' {bound[0]:.3g}, delta' {bound[1]:.2g}) not drawn: it "
                         f"allows a TPR above {BOUND_VISIBLE} at every FPR from 1e-4 (it would "
                         f"run along the top edge), so it constrains nothing here.",
                     width=70, below=42)
    for name, roc in curves.items():
        fpr, tpr = np.asarray(roc["fpr"]), np.asarray(roc["tpr"])
        ax.plot(np.clip(fpr, 1e-4, 1), np.clip(tpr, 1e-4, 1), label=name)
    ax.set(xscale="log", yscale="log", xlabel="false positive rate",
           ylabel="true positive rate", title=title, xlim=(1e-4, 1), ylim=(1e-4, 1))
    # a grid per decade instead of minor ticks: 64 minor ticks doubled the drawing time
    from matplotlib.ticker import NullLocator

    for axis in (ax.xaxis, ax.yaxis):
        axis.set_minor_locator(NullLocator())
    ax.grid(True, alpha=0.3)
    _legend_outside(ax)
    return write_figure(path, fig)


def reliability_figure(path: Path, bins: pd.DataFrame, ece: float, title: str) -> Path:
    """Reliability diagram: the accuracy of each non-empty confidence bin as a bar, the number
    of records in the bin written above it (a bin of 3 records says little), and the diagonal
    of perfect calibration; the legend below the axes."""
    fig, ax = _subplots(figsize=(5, 4.8))
    filled = bins[bins["count"] > 0]
    width = float(bins["upper"].iloc[0] - bins["lower"].iloc[0])
    bars = ax.bar(filled["bin_center"], filled["accuracy"], width=width * 0.95,
                  color="#3b75af", edgecolor="black", label="accuracy (bar label: records)")
    ax.bar_label(bars, labels=[f"{int(n)}" for n in filled["count"]], fontsize=6,
                 rotation=90, padding=2)
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", label="perfect calibration")
    # head room above 1 for the counts of the most accurate bins
    ax.set(xlim=(0, 1), ylim=(0, 1.15), yticks=np.linspace(0, 1, 6),
           xlabel="confidence (top label)", ylabel="accuracy",
           title=f"{title}\nECE = {ece:.4f}")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=7,
              frameon=False)
    return write_figure(path, fig)


def clip_figure(path: Path, traces: dict[str, pd.DataFrame], title: str) -> Path:
    """Clip threshold C_t against step, one line per run (private runs only), the legend right
    of the axes."""
    fig, ax = _subplots(figsize=(6, 3.5))
    drawn = 0
    for name, trace in traces.items():
        c = trace.dropna(subset=["clip_threshold"])
        if len(c):
            ax.plot(c["step"], c["clip_threshold"], label=name)
            drawn += 1
    if not drawn:
        ax.text(0.5, 0.5, "no clipping (non-private run)", ha="center", va="center",
                transform=ax.transAxes)
    ax.set(xlabel="step", ylabel="clip threshold C_t", title=title)
    if drawn:
        _legend_outside(ax)
    return write_figure(path, fig)


CONTROLLER_PANELS = (("clip_threshold", "clip threshold C_t"),
                     ("ww_zeta_ema", "tail exponent zeta (EMA)"),
                     ("ww_probe_norm", "probe layer norm ||W||_F"))


def controller_figure(path: Path, traces: dict[str, pd.DataFrame], title: str,
                      caption: str = "",
                      noise_alone: dict[str, pd.DataFrame] | None = None) -> Path:
    """WW-DP-SGD's feedback, one line per run over the steps: C_t, the smoothed tail exponent
    it steers by, and the norm of the probed weights, which the step's noise grows (the
    larger C_t, the more). Drawn at the controller's probes; ``noise_alone`` (step,
    noise_alone per run) dashed in the norm panel, in its run's colour; the legend right of
    the top axes."""
    fig, axes = _subplots(len(CONTROLLER_PANELS), 1, sharex=True, figsize=(6.5, 6.5))
    for name, trace in traces.items():
        probes = trace.dropna(subset=["ww_zeta"]) if "ww_zeta" in trace else trace.iloc[0:0]
        colour = None
        for ax, (column, _) in zip(axes, CONTROLLER_PANELS):
            if column in probes and probes[column].notna().any():
                (line,) = ax.plot(probes["step"], probes[column], label=name, linewidth=1,
                                  color=colour)
                colour = line.get_color()
        if noise_alone and name in noise_alone:
            axes[-1].plot(noise_alone[name]["step"], noise_alone[name]["noise_alone"],
                          linestyle="--", linewidth=1, color=colour)
    for ax, (_, label) in zip(axes, CONTROLLER_PANELS):
        ax.set_ylabel(label, fontsize=8)
    axes[0].set_title(title, fontsize=9)
    axes[-1].set_xlabel("step")
    if any(ax.lines for ax in axes[:1]):
        _legend_outside(axes[0])
    if caption:
        _caption(axes[-1], caption)
    return write_figure(path, fig)


def comparison_figure(path: Path, table: pd.DataFrame) -> Path:
    """Accuracy, ECE, loss-attack AUC and (when evaluated) peak IR-attack accuracy of every
    run, side by side; a dotted line marks 0.5, an attack's guess."""
    panels = [("accuracy", "accuracy (holdout)"), ("ece", "ECE"),
              ("mia_auc", "loss-attack AUC (dotted: guess)")]
    if "peak_ir_mia" in table and table["peak_ir_mia"].notna().any():
        panels.append(("peak_ir_mia", "peak IR-attack accuracy (dotted: guess)"))
    fig, axes = _subplots(1, len(panels), figsize=(4 * len(panels),
                                                      0.45 * len(table) + 1.8), sharey=True)
    labels = table["run"].tolist()
    for ax, (column, name) in zip(axes, panels):
        ax.barh(labels, table[column].astype(float), color="#3b75af")
        ax.set_xlabel(name)
        if column in ("mia_auc", "peak_ir_mia"):
            ax.axvline(0.5, color="grey", linestyle=":")
    axes[0].invert_yaxis()
    fig.suptitle("dpclip: matched-budget comparison")
    return write_figure(path, fig)


def audit_figure(path: Path, table: pd.DataFrame) -> Path | None:
    """Claimed against audited epsilon, one row per run: the epsilon it claims (hollow) and the
    largest lower bound of its one-run audit (``audit_whitebox``, ``audit_blackbox``; filled),
    joined by a line. An audited bound right of the claim (red) refutes it. A run without a
    bound keeps its row, which says why (its ``audit_status``: no DP claim, an adjacency the
    canaries do not audit, audit off), so that no run goes missing unsaid. None (no figure)
    when no run was audited."""
    bounds = table[["audit_whitebox", "audit_blackbox"]].astype(float).max(axis=1)
    table = table.assign(bound=bounds)
    has_bound = (bounds.notna() & table["epsilon"].notna()).to_numpy()
    if not has_bound.any():
        return None
    audited = table[has_bound]
    fig, ax = _subplots(figsize=(6.5, 0.42 * len(table) + 1.6))
    rows = np.arange(len(table))[has_bound]
    refuted = audited["audit_violated"].fillna(False).astype(bool).to_numpy()
    claimed, bound = audited["epsilon"].astype(float), audited["bound"]
    ax.hlines(rows, bound, claimed, color="lightgrey", zorder=1)
    ax.scatter(claimed, rows, facecolors="white", edgecolors="black", label="claimed epsilon",
               zorder=2)
    ax.scatter(bound[~refuted], rows[~refuted], color="#3b75af", zorder=3,
               label="audited lower bound")
    if refuted.any():
        ax.scatter(bound[refuted], rows[refuted], color="red", zorder=3,
                   label="lower bound above the claim (privacy bug)")
    for row, (_, run) in zip(np.arange(len(table))[~has_bound], table[~has_bound].iterrows()):
        why = run.get("audit_status")
        why = why if isinstance(why, str) else "not audited"
        claim = "no DP claim" if pd.isna(run["epsilon"]) else \
            f"claims epsilon {float(run['epsilon']):.3g}" + \
            {NO_GUARANTEE: ", no DP guarantee", OTHER_ADJACENCY: f", {run.get('adjacency')} "
             "adjacency"}.get(epsilon_mark(run.get("dp_guarantee"), run.get("adjacency")), "")
        ax.text(0.01, row, "\n".join(textwrap.wrap(f"no audit bound ({claim}): {why}", 75)),
                transform=ax.get_yaxis_transform(), va="center", ha="left", fontsize=7,
                color="dimgrey", style="italic")
    ax.set_yticks(np.arange(len(table)), table["run"])
    ax.set_ylim(len(table) - 0.5, -0.5)  # the table's order, top down
    ax.set(xlim=(0, float(max(claimed.max(), bound.max())) * 1.08), xlabel="epsilon",
           title="Claimed vs audited epsilon (one-run audit; the bound may sit far below a "
                 "sound claim)")
    ax.title.set_fontsize(9)
    ax.grid(True, axis="x", alpha=0.3)
    _legend_outside(ax, frameon=False)
    return write_figure(path, fig)


DODGE = 0.02  # privacy_utility_figure: log-epsilon shift between neighbouring series


def privacy_utility_figure(path: Path, table: pd.DataFrame) -> Path | None:
    """Accuracy, ECE and the headline attack's TPR at its honest low FPR against the epsilon spent
    (log axis), one line per method and alpha, with the 95% band over seeds where there are two or
    more; each series shifted by its own fixed factor (``DODGE``), the ticks at the true epsilons
    (docs/statistics.md). None when no run has a DP claim."""
    if table.empty:
        return None
    panels = [("accuracy", "holdout accuracy"), ("ece", "ECE"),
              ("attack_tpr_at_low_fpr", "attack TPR at low FPR (10 false positives)")]
    fig, axes = _subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8))
    fig.subplots_adjust(wspace=0.35)
    groups = list(table.sort_values("epsilon").groupby("series", sort=False))
    spread = float(np.exp(DODGE * (len(groups) - 1) / 2) - 1)  # the largest relative shift
    xlabel = "epsilon (log axis)" if len(groups) < 2 else \
        f"epsilon (log axis, jittered by up to ±{spread:.0%})"
    for ax, (metric, label) in zip(axes, panels):
        for i, (series, rows) in enumerate(groups):
            # methods share an epsilon: dodge them a little on the log axis to see each bar
            x = rows["epsilon"] * np.exp(DODGE * (i - (len(groups) - 1) / 2))
            line, = ax.plot(x, rows[metric], marker="o", label=series)
            low, high = rows[f"{metric}_low"].astype(float), rows[f"{metric}_high"].astype(float)
            if low.notna().any():  # the band between target epsilons, a bar at each
                ax.fill_between(x, low, high, color=line.get_color(), alpha=0.15)
                ax.vlines(x, low, high, color=line.get_color(), linewidth=2)
        ax.set(xscale="log", xlabel=xlabel, ylabel=label,
               xlim=(table["epsilon"].min() / 1.5, table["epsilon"].max() * 1.5))
        from matplotlib.ticker import NullFormatter, ScalarFormatter

        ax.set_xticks(sorted(set(np.round(table["epsilon"].astype(float), 2))))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, alpha=0.3)
    _legend_outside(axes[-1])
    if len(groups) > 1:
        _caption(axes[0], f"Jittered: each series is shifted along the epsilon axis by a "
                          f"fixed factor (at most ±{spread:.0%}) so that points at one epsilon "
                          f"do not hide each other; the ticks mark the true epsilons.",
                 width=150)
    seeds = int(table["seeds"].max())
    fig.suptitle("Privacy-utility over seeds" + (" (mean, 95% band)" if seeds > 1 else
                                                 " (one seed: no band)"))
    return write_figure(path, fig)


def partition_histogram_figure(path: Path, record: dict) -> Path:
    """Records per class in one partition (label skew at a glance)."""
    fig, ax = _subplots(figsize=(6, 3))
    ax.bar(range(len(record["histogram"])), record["histogram"], color="#3b75af")
    ax.set_xticks(range(len(record["classes"])), record["classes"], rotation=45, ha="right")
    ax.set_ylabel("records")
    title = "IID (no label skew)" if record["alpha"] is None else \
        f"Dirichlet alpha = {record['alpha']}"
    ax.set_title(f"{title}: {record['size']} of {record['source_size']} records")
    return write_figure(path, fig)


def early_stopping_figure(path: Path, trace: pd.DataFrame, title: str, series: str) -> Path:
    """The watched per-epoch std (described by ``series``), with the epochs where the rule
    fired (dashed red); the legend right of the axes."""
    epochs = trace.dropna(subset=["monitored_std"])
    fig, ax = _subplots(figsize=(6, 3.5))
    ax.plot(epochs["epoch"], epochs["monitored_std"], marker="o", label=series)
    fired = epochs[epochs["early_stop_flag"].astype(bool)]
    for k, epoch in enumerate(fired["epoch"]):
        ax.axvline(epoch, color="red", linestyle="--", label="stop flag" if k == 0 else None)
    ax.set(xlabel="epoch", ylabel="mean per-record std", title=title)
    _legend_outside(ax)
    return write_figure(path, fig)


def layer_attack_figure(path: Path, layers: dict[str, dict], title: str,
                        metrics: tuple[str, ...] = ("accuracy", "auc")) -> Path:
    """Per-layer membership-attack results as grouped bars with their values, layers in model
    order, the legend right of the axes; the dotted line at 0.5 is a guess (accuracy, AUC) or
    no signal at all (error rate)."""
    names = list(layers)
    fig, ax = _subplots(figsize=(max(4.5, 0.9 * len(names) + 2), 3.6))
    width = 0.8 / len(metrics)
    for k, metric in enumerate(metrics):
        values = [layers[n][metric] for n in names]
        pos = np.arange(len(names)) + (k - (len(metrics) - 1) / 2) * width
        bars = ax.bar(pos, values, width=width, label=metric.replace("_", " "))
        ax.bar_label(bars, fmt="%.3f", fontsize=7)
    ax.axhline(0.5, color="grey", linestyle=":")
    ax.set_xticks(range(len(names)), names)
    ax.set(ylim=(0, 1.05), xlabel="layer", title=title)
    _legend_outside(ax, fontsize=8)
    return write_figure(path, fig)


def claim_figure(path: Path, rows: list[dict], method: str, metric: str,
                 title: str) -> Path | None:
    """One claim's comparisons (:mod:`dpclip.reporting.evidence`): per configuration, the
    method's mean and each baseline's with their 95% intervals over seeds, and the paper's own
    numbers where the claim gives them (a row's ``paper_method`` and ``paper_baseline``, drawn as crosses);
    the legend right of the axes. None without comparisons."""
    if not rows:
        return None
    labels = sorted({r["label"] for r in rows}, key=[r["label"] for r in rows].index)
    series = {method: {}}
    for r in rows:
        series[method][r["label"]] = r["method_mean"]
        series.setdefault(r["baseline"], {})[r["label"]] = r["baseline_mean"]
    fig, ax = _subplots(figsize=(1.6 + 1.5 * len(labels), 3.4))
    for i, (name, by_label) in enumerate(series.items()):
        x = np.arange(len(labels)) + 0.12 * (i - (len(series) - 1) / 2)
        mean, low, high = np.array([by_label.get(lab, (np.nan, None, None)) for lab in labels],
                                   float).T  # a missing bound is NaN
        err = np.vstack([mean - np.where(np.isnan(low), mean, low),
                         np.where(np.isnan(high), mean, high) - mean])
        drawn = ax.errorbar(x, mean, yerr=err, fmt="o", capsize=4, label=name)
        key = "paper_method" if name == method else "paper_baseline"
        paper = [next((r.get(key) for r in rows if r["label"] == lab and
                       (name == method or r["baseline"] == name)), None) for lab in labels]
        if any(v is not None for v in paper):
            ax.plot(x, [np.nan if v is None else v for v in paper], "x", markersize=9,
                    color=drawn[0].get_color(), label=f"{name}: the paper's")
    ax.set_xticks(np.arange(len(labels)), labels)
    ax.set(ylabel=metric, title=title)
    ax.grid(True, axis="y", alpha=0.3)
    _legend_outside(ax, fontsize=8)  # saving crops the figure to what is drawn, legend included
    return write_figure(path, fig)
