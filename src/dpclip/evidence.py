"""The verdict report: each paper claim of ``presets/claims.yaml`` against the preset runs.

For each claim: the claim in one sentence, its source, the paper's number (quoted in the claims
file), ours with its 95% interval (from each preset run's ``reports/comparison.csv``, which the
report stage makes from the metrics files), and a verdict, one of :data:`VERDICTS`. Seeds pair
the runs (same seed: same partition, initialisation and sampling where the method allows), and
every comparison is the paired test of :func:`dpclip.seed_stats.paired_test`, Holm-corrected over
the comparisons one claim makes (:func:`dpclip.seed_stats.holm`). The rules:

* ``better``: the method beats the baseline on the metric in every configuration (target
  epsilon, alpha, variant), each significant after the correction;
* ``not_worse``: in no configuration is the method significantly worse. This is the absence
  of evidence of harm, weak with few seeds: a claim of "as good as" should use ``within`` (a
  non-inferiority margin on the interval) instead;
* ``lowest``: ``better`` against each of several baselines;
* ``within``: the lower end of the 95% interval of (method - baseline) is above ``-margin`` in
  every configuration (for a metric where lower is better: the upper end below ``margin``);
* ``smaller_spread``: per seed, the range of the method's metric over the preset's variants (e.g.
  over C_0) minus the baseline's range (over C) is negative, significantly.

A claim is "not testable here" when it says why (``untestable``), when its preset has not been
run, or when fewer than two seeds pair the runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from dpclip.errors import DpclipError
from dpclip.io import read_json, write_text
from dpclip.seed_stats import CONFIDENCE, holm, mean_interval, paired_test

HELD, NOT_HELD, UNTESTABLE = "held", "not held", "not testable here"
VERDICTS = (HELD, NOT_HELD, UNTESTABLE)
RULES = ("better", "not_worse", "lowest", "within", "smaller_spread")
# the direction of each metric a claim may name: True = higher is better
HIGHER_IS_BETTER = {"accuracy": True, "test_auc": True, "ece": False, "peak_ir_mia": False, "mia_auc": False,
                    "strongest_auc": False, "strongest_tpr_at_fpr_0.1pct": False}
CONFIGURATION = ["target_epsilon", "alpha", "variant"]


@dataclass
class Finding:
    """A claim's verdict: ``ours`` is the text of our numbers, ``rows`` the comparisons."""

    claim: dict
    verdict: str
    reason: str
    ours: list[str] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)


def load_claims(path: Path) -> list[dict]:
    claims = (yaml.safe_load(path.read_text()) or {}).get("claims") or []
    for claim in claims:
        if "untestable" in claim:
            continue
        if claim.get("rule") not in RULES:
            raise DpclipError(f"{path}: claim {claim.get('id')!r}: rule {claim.get('rule')!r} "
                              f"is not one of {list(RULES)}")
        if claim["rule"] == "within" and not isinstance(claim.get("margin"), (int, float)):
            raise DpclipError(f"{path}: claim {claim.get('id')!r}: rule 'within' needs a "
                              f"numeric margin, not {claim.get('margin')!r}")
        if claim.get("metric") not in HIGHER_IS_BETTER:
            raise DpclipError(f"{path}: claim {claim.get('id')!r}: metric "
                              f"{claim.get('metric')!r} is not one of {list(HIGHER_IS_BETTER)}")
    return claims


def preset_table(results: Path, preset: str) -> pd.DataFrame | None:
    """Every run of a preset (all its variants), with a ``variant`` column; None when the preset
    has not been run."""
    frames = []
    folder = results / preset
    for table in sorted(folder.glob("*/reports/comparison.csv")):
        frame = pd.read_csv(table)
        frames.append(frame.assign(variant=table.parent.parent.name))
    return pd.concat(frames, ignore_index=True) if frames else None


def _by_seed(table: pd.DataFrame, method: str, metric: str) -> pd.Series:
    return table[table["method"] == method].set_index("seed")[metric].astype(float)


def _interval_text(mean, low, high) -> str:
    if low is None or pd.isna(low):
        return f"{mean:.4g}"
    return f"{mean:.4g} [{low:.4g}, {high:.4g}]"


def _label(key: dict) -> str:
    parts = [f"eps {key['target_epsilon']:g}"]
    if str(key.get("alpha")) not in ("iid", "nan"):
        parts.append(f"alpha {key['alpha']}")
    if key.get("variant") not in (None, "main"):
        parts.append(str(key["variant"]))
    return ", ".join(parts)


def _comparisons(table: pd.DataFrame, method: str, baselines: list[str],
                 metric: str) -> list[dict]:
    """Per configuration and baseline: both means with intervals and the paired difference."""
    rows = []
    for values, group in table.groupby(CONFIGURATION, sort=True, dropna=False):
        key = dict(zip(CONFIGURATION, values))
        mine = _by_seed(group, method, metric)
        for baseline in baselines:
            theirs = _by_seed(group, baseline, metric)
            seeds = sorted(set(mine.index) & set(theirs.index))
            d = (mine.loc[seeds] - theirs.loc[seeds]).dropna().to_numpy()
            mean, low, high, p = paired_test(d)
            rows.append({**key, "baseline": baseline, "seeds": len(d),
                         "method_mean": mean_interval(mine.loc[seeds]),
                         "baseline_mean": mean_interval(theirs.loc[seeds]),
                         "difference": mean, "difference_low": low, "difference_high": high,
                         "p": p})
    return rows


def _significant(row: dict, higher_is_better: bool) -> str:
    """better / worse / not distinguishable, at 5% after the claim's correction."""
    if pd.isna(row["p_holm"]) or row["p_holm"] >= 1 - CONFIDENCE:
        return "not distinguishable"
    return "better" if (row["difference"] > 0) == higher_is_better else "worse"


def _describe(row: dict, method: str, metric: str) -> str:
    text = (f"{_label(row)}: {method} {_interval_text(*row['method_mean'])} vs "
            f"{row['baseline']} {_interval_text(*row['baseline_mean'])} ({metric}, "
            f"{row['seeds']} seeds); difference "
            f"{_interval_text(row['difference'], row['difference_low'], row['difference_high'])}")
    if "p_holm" in row and not pd.isna(row["p_holm"]):
        text += f", Holm p {row['p_holm']:.3g}"
    return text + (f": {row['outcome']}" if "outcome" in row else "")


def _spread_rows(table: pd.DataFrame, method: str, baseline: str, metric: str) -> list[dict]:
    """Per (target epsilon, alpha): each seed's range of the metric over the variants, the
    method's minus the baseline's."""
    rows = []
    for values, group in table.groupby(["target_epsilon", "alpha"], sort=True, dropna=False):
        spreads = {}
        for who in (method, baseline):
            wide = group[group["method"] == who].pivot_table(
                index="seed", columns="variant", values=metric).reindex(
                columns=sorted(group["variant"].unique()))  # a missing variant: no range
            spreads[who] = (wide.max(axis=1) - wide.min(axis=1)).where(
                wide.notna().all(axis=1))
        seeds = sorted(set(spreads[method].dropna().index) & set(spreads[baseline].dropna().index))
        d = (spreads[method].loc[seeds] - spreads[baseline].loc[seeds]).to_numpy()
        mean, low, high, p = paired_test(d)
        rows.append({"target_epsilon": values[0], "alpha": values[1], "variant": None,
                     "baseline": baseline, "seeds": len(d), "variants": int(
                         group["variant"].nunique()),
                     "method_mean": mean_interval(spreads[method].loc[seeds]),
                     "baseline_mean": mean_interval(spreads[baseline].loc[seeds]),
                     "difference": mean, "difference_low": low, "difference_high": high,
                     "p": p})
    return rows


def judge(claim: dict, table: pd.DataFrame | None) -> Finding:
    """The verdict of one claim on its preset's runs (``table``: None when not run)."""
    if "untestable" in claim:
        return Finding(claim, UNTESTABLE, " ".join(str(claim["untestable"]).split()).rstrip("."))
    if table is None:
        return Finding(claim, UNTESTABLE, f"the preset {claim['preset']!r} has not been run "
                                          f"(`dpclip preset {claim['preset']}`)")
    method, metric, rule = claim["method"], claim["metric"], claim["rule"]
    higher = HIGHER_IS_BETTER[metric]
    baselines = claim.get("baselines") or [claim["baseline"]]
    needed = {method, *baselines}
    missing = needed - set(table["method"])
    if missing:
        return Finding(claim, UNTESTABLE, f"the preset's runs have no {sorted(missing)}")
    if rule == "smaller_spread":
        rows = _spread_rows(table, method, baselines[0], metric)
        higher = False  # a smaller range is better
        metric_text = f"range of {metric} over the variants"
    else:
        rows = _comparisons(table, method, baselines, metric)
        metric_text = metric
    if not rows or min(r["seeds"] for r in rows) < 2:
        return Finding(claim, UNTESTABLE, "fewer than two seeds pair the runs", rows=rows)
    for row, adjusted in zip(rows, holm([r["p"] for r in rows])):
        row["p_holm"] = adjusted
        row["outcome"] = _significant(row, higher)
    outcomes = [r["outcome"] for r in rows]
    if rule == "within":
        margin = float(claim["margin"])
        for row in rows:
            inside = row["difference_low"] > -margin if higher else \
                row["difference_high"] < margin
            row["outcome"] = f"{'inside' if inside else 'not inside'} the margin {margin:g}"
        held = all(r["outcome"].startswith("inside") for r in rows)
        reason = (f"the 95% interval of the difference stays within {margin:g} in every "
                  f"configuration" if held else
                  f"the 95% interval of the difference reaches beyond {margin:g}")
    elif rule == "not_worse":
        held = "worse" not in outcomes
        reason = ("significantly worse in no configuration" if held else
                  "significantly worse in " + ", ".join(_label(r) for r in rows
                                                         if r["outcome"] == "worse"))
    else:  # better, lowest, smaller_spread
        held = all(o == "better" for o in outcomes)
        reason = ("significantly better in every comparison" if held else
                  "; ".join(f"{_label(r)}" + (f" vs {r['baseline']}" if len(baselines) > 1
                                               else "") + f": {r['outcome']}"
                            for r in rows if r["outcome"] != "better"))
    ours = [_describe(r, method, metric_text) for r in rows]
    for row in rows:
        row["label"] = _label(row)
    return Finding(claim, HELD if held else NOT_HELD, reason, ours, rows)


def evidence(claims_path: Path, results: Path) -> list[Finding]:
    """Every claim's finding, each preset's runs read once."""
    claims = load_claims(claims_path)
    tables = {c["preset"]: preset_table(results, c["preset"]) for c in claims if "preset" in c}
    return [judge(c, tables.get(c.get("preset"))) for c in claims]


def _preset_facts(path: Path) -> str:
    """The wall time of each variant of a run preset, and its deviations from the paper."""
    if not path.is_file():
        return ""
    record = read_json(path)
    times = ", ".join(f"{v} {facts['wall_s']:.0f} s" for v, facts in record["variants"].items())
    deviations = "".join(f"\n  - {' '.join(str(d).split())}" for d in record["deviations"])
    return f", wall time on this machine: {times}. Deviations from the paper:\n{deviations}"


def evidence_markdown(findings: list[Finding], results: Path, command: str,
                      figures: dict[str, str] | None = None) -> str:
    """The verdict report: a summary table, then one section per claim."""
    lines = ["# Evidence: the papers' claims, tested", "",
             f"Regenerate: `{command}`. Each verdict follows the rule of its claim "
             "(`presets/claims.yaml`, `dpclip.evidence`): paired over seeds, Holm-corrected "
             "within the claim, 95% intervals; our numbers come from the preset runs' metrics "
             f"(`{results}/<preset>/<variant>/reports/comparison.csv`), as fractions where the "
             "papers give percentages.", "",
             "| claim | source | verdict |", "|---|---|---|"]
    for f in findings:
        lines.append(f"| {f.claim['id']} | {f.claim['source']} | **{f.verdict}** |")
    for f in findings:
        c = f.claim
        lines += ["", f"## {c['id']}: {f.verdict}", "", f"*Claim.* {' '.join(c['claim'].split())}",
                  "", f"*Source.* {c['source']}", "", f"*Paper.* {c['paper']}", ""]
        if "preset" in c:
            lines += [f"*Preset.* `{c['preset']}` (rule `{c['rule']}`)" +
                      _preset_facts(results / c["preset"] / "preset.json"), ""]
        if "note" in c:
            lines += [f"*Note.* {' '.join(c['note'].split())}", ""]
        if f.ours:
            lines += ["*Ours.*", ""] + [f"- {text}" for text in f.ours] + [""]
        if (figures or {}).get(c["id"]):
            lines += [f"![{c['id']}]({figures[c['id']]})", ""]
        lines += [f"*Verdict.* **{f.verdict}**: {f.reason}."]
    return "\n".join(lines) + "\n"


def write_evidence(claims_path: Path, results: Path, out: Path, command: str) -> list[Finding]:
    """Write the verdict report as Markdown at ``out`` and as HTML beside it, with a figure per
    tested claim in ``<out stem>/`` (the method and its baselines, mean and 95% interval)."""
    import markdown

    from dpclip.plots import claim_figure

    findings = evidence(claims_path, results)
    figures = {}
    for f in findings:
        if f.verdict == UNTESTABLE or not f.rows:
            continue
        metric = f.claim["metric"] + (" range over the variants"
                                      if f.claim["rule"] == "smaller_spread" else "")
        name = f"{out.stem}/{f.claim['id']}.png"
        if claim_figure(out.parent / name, f.rows, f.claim["method"], metric,
                        f"{f.claim['id']}: {f.verdict}"):
            figures[f.claim["id"]] = name
    text = evidence_markdown(findings, results, command, figures)
    write_text(out, text)
    body = markdown.markdown(text, extensions=["tables"])
    write_text(out.with_suffix(".html"), "<!doctype html><meta charset='utf-8'>"
               "<title>dpclip evidence</title><style>body{font-family:sans-serif;max-width:"
               "60em;margin:auto}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
               f"padding:2px 6px}}</style>{body}")
    return findings

