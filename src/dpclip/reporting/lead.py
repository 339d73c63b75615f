"""The evidence page's lead, beside the verdicts: what a controller did in the runs, traced, and
what the runs showed that no claim asked (post hoc, labelled so).

A verdict says whether a claim holds; the trace says why. Each entry of ``mechanisms`` in
``presets/claims.yaml`` names a preset whose runs commit WW-DP-SGD's controller rows
(``reports/controller.csv``, written by the report stage at every probe: C_t, the tail exponent
zeta and its EMA, the probed weights' norm). Per variant this module takes the median over the
runs at each probe and sets beside the measured norm what the step's noise alone would give the
probed weights: every step adds Gaussian noise of standard deviation lr sigma C_t / B to each of
their d coordinates, so after t steps its norm is about lr sigma sqrt(d sum_s C_s^2) / B.
Each entry of ``post_hoc`` compares one method in one variant with a baseline at the baseline's
best variant, seed by seed: found after the runs, so described, never tested.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

from dpclip.errors import DpclipError
from dpclip.reporting.plots import controller_figure

FIELDS = ("id", "preset", "title", "probe_size", "batch_size", "learning_rates")


def load_mechanisms(path: Path) -> list[dict]:
    """The ``mechanisms`` of a claims file, each with every field of :data:`FIELDS`."""
    mechanisms = (yaml.safe_load(path.read_text()) or {}).get("mechanisms") or []
    for spec in mechanisms:
        missing = [name for name in FIELDS if name not in spec]
        if missing:
            raise DpclipError(f"{path}: mechanism {spec.get('id')!r} lacks {missing}")
        if not isinstance(spec["learning_rates"], dict) or not spec["learning_rates"]:
            raise DpclipError(f"{path}: mechanism {spec['id']!r}: learning_rates must map each "
                              f"variant to its learning rate, not {spec['learning_rates']!r}")
    return mechanisms


def noise_alone_norm(probes: pd.DataFrame, lr: float, sigma: float, batch_size: float,
                     probe_size: int) -> pd.Series:
    """At each probe of one run: the norm the step's noise alone gives the probed weights by
    then. C_t is held between probes, so each row's C_t stands for the steps since the last
    probe (the first row's for the steps from 0)."""
    steps = probes["step"].diff().fillna(probes["step"].iloc[0])
    return lr * sigma / batch_size * (probe_size * (steps * probes["clip_threshold"] ** 2)
                                      .cumsum()) ** 0.5


def variant_traces(spec: dict, results: Path) -> dict[str, pd.DataFrame]:
    """Per variant: at each probe step the median over the runs of C_t, zeta (EMA), the
    probed weights' norm and the noise-alone norm; variants without committed rows left
    out."""
    traces = {}
    for variant, lr in spec["learning_rates"].items():
        folder = results / spec["preset"] / variant / "reports"
        if not (folder / "controller.csv").is_file() or not (folder / "comparison.csv").is_file():
            continue
        rows = pd.read_csv(folder / "controller.csv")
        sigma = pd.read_csv(folder / "comparison.csv").set_index("run")["noise_multiplier"]
        runs = [group.sort_values("step").assign(noise_alone=noise_alone_norm(
                    group.sort_values("step"), float(lr), float(sigma[run]),
                    float(spec["batch_size"]), int(spec["probe_size"])))
                for run, group in rows.groupby("run")]
        traces[f"lr {lr:g}"] = pd.concat(runs).groupby("step", as_index=False).median(
            numeric_only=True).assign(runs=len(runs))
    return traces


def _at(trace: pd.DataFrame, step: int, column: str) -> float:
    """The column at the last probe at or before ``step``."""
    return float(trace[trace["step"] <= step][column].iloc[-1])


def summary(name: str, trace: pd.DataFrame) -> str:
    """One variant's numbers: the norm and zeta early and at the end, against the noise
    alone, and where C_t went."""
    first, last = trace.iloc[0], trace.iloc[-1]
    share = last["noise_alone"] / last["ww_probe_norm"]
    return (f"at {name} (median of {int(last['runs'])} runs): the probed weights' norm goes "
            f"from {first['ww_probe_norm']:.1f} at step {int(first['step'])} to "
            f"{_at(trace, 700, 'ww_probe_norm'):.1f} by step 700 and "
            f"{last['ww_probe_norm']:.1f} at step {int(last['step'])}, where the noise alone "
            f"accounts for {last['noise_alone']:.1f} ({share:.0%} of it); zeta (EMA) "
            f"{first['ww_zeta_ema']:.2f} -> {last['ww_zeta_ema']:.2f}; C_t "
            f"{first['clip_threshold']:.2f} -> {last['clip_threshold']:.2f} (largest "
            f"{trace['clip_threshold'].max():.2f})")


def mechanism_section(spec: dict, results: Path, figure: Path, link: str) -> list[str]:
    """The page's lines for one mechanism: its title, the per-variant numbers and the figure
    (written at ``figure``, linked as ``link``); a line saying so when no run committed rows."""
    traces = variant_traces(spec, results)
    head = f"**{spec['title']}**"
    if not traces:
        return [f"{head} Not traced yet: `{results}/{spec['preset']}/<variant>/reports/"
                f"controller.csv` is missing (run `dpclip preset {spec['preset']}`).", ""]
    controller_figure(figure, traces, title=f"{spec['id']}: WW-DP-SGD's controller, median "
                      f"over runs (preset {spec['preset']})",
                      caption="dashed: the norm the step's noise alone gives the probed "
                              "weights (lr sigma sqrt(d sum C_t^2) / B)",
                      noise_alone={name: t[["step", "noise_alone"]] for name, t in
                                   traces.items()})
    text = "; ".join(summary(name, trace) for name, trace in traces.items())
    return [f"{head} {' '.join(str(spec.get('lead', '')).split())} Measured: {text}.", "",
            f"![{spec['id']}]({link})", ""]


def mechanisms_lines(claims_path: Path, results: Path, out: Path) -> list[str]:
    """Every mechanism's lines, each figure at ``<out stem>/<id>.png`` beside ``out``."""
    lines = []
    for spec in load_mechanisms(claims_path):
        name = f"{out.stem}/{spec['id']}.png"
        lines += mechanism_section(spec, results, out.parent / name, name)
    return lines


def post_hoc_line(spec: dict, results: Path) -> str:
    """One observation made after the runs: ``method`` in ``variant`` against ``baseline`` in
    the variant where its mean is best, per seed; empty when the preset has no results."""
    folder = results / spec["preset"]
    tables = {path.parent.parent.name: pd.read_csv(path)
              for path in sorted(folder.glob("*/reports/comparison.csv"))}
    if spec["variant"] not in tables:
        return ""
    metric = spec["metric"]

    def per_seed(variant: str, method: str) -> pd.Series:
        table = tables[variant]
        return table[table["method"] == method].set_index("seed")[metric]

    best = max(tables, key=lambda v: per_seed(v, spec["baseline"]).mean())
    d = (per_seed(spec["variant"], spec["method"]) - per_seed(best, spec["baseline"])).dropna()
    return (f"**Post hoc** ({spec['id']}; found after the runs, one of {len(tables)} settings, "
            f"so described, not tested): {spec['method']} in `{spec['variant']}` minus "
            f"{spec['baseline']} in its best setting, `{best}`, in {metric}: {d.mean():+.4f} "
            f"({int((d > 0).sum())} of {len(d)} seeds above; preset `{spec['preset']}`). "
            f"{' '.join(str(spec.get('text', '')).split())}")


def lead_lines(claims_path: Path, results: Path, out: Path) -> list[str]:
    """The lead: every mechanism's lines (figures at ``<out stem>/<id>.png`` beside ``out``),
    then every post-hoc observation."""
    lines = mechanisms_lines(claims_path, results, out)
    spec_file = yaml.safe_load(claims_path.read_text()) or {}
    for spec in spec_file.get("post_hoc") or []:
        line = post_hoc_line(spec, results)
        lines += [line, ""] if line else []
    return lines
