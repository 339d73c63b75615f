"""The verdict report: each paper claim of ``presets/claims.yaml`` against the preset runs.

For each claim: the claim in one sentence, its source, the paper's numbers (quoted in the
claims file), ours with intervals (from each preset run's ``reports/comparison.csv``), and a
verdict from paired tests over seeds (:func:`dpclip.reporting.seed_stats.paired_test`). What
each verdict requires, with the corrections for several configurations: docs/statistics.md,
"How a claim is judged".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from dpclip.errors import DpclipError
from dpclip.files import read_json, write_text
from dpclip.reporting import accounting, benchmarks
from dpclip.reporting.lead import lead_lines, load_mechanisms
from dpclip.reporting.plots import claim_figure
from dpclip.reporting.seed_stats import (CONFIDENCE, POWER, degenerate, mean_interval,
                                         minimum_exact_seeds, paired_test, seeds_needed)

HELD, CONTRADICTED, INCONCLUSIVE = "held", "contradicted", "inconclusive"
NOT_REPRODUCED, UNTESTABLE = "setting not reproduced", "not testable here"
NOT_AT_SCALE = "not testable at this scale"
# claims about the epsilon itself (rule ``accounting``): computed, no runs
HELD_BY_ACCOUNTING = "held by the accounting"
CONTRADICTED_BY_ACCOUNTING = "contradicted by the accounting"
# claims about cost (rule ``benchmark``): a committed ``dpclip bench`` measurement, no runs
HELD_BY_BENCHMARK = "held by the benchmark"
CONTRADICTED_BY_BENCHMARK = "contradicted by the benchmark"
# what a claim's mechanism needs to act in the runs (claims.yaml `preconditions`, each
# {kind, method, ...}): clip_moves (min: |log(C_T / C_0)| averaged over the method's runs),
# leaks (metric, min: the method's mean over seeds), adjacency (paper: the neighbouring notion
# of the paper's epsilon, which the method's runs must state)
PRECONDITIONS = ("clip_moves", "leaks", "adjacency")
VERDICT_MEANINGS = {
    HELD: "significant in the paper's direction in every configuration (the 95% interval of "
          "the difference excludes no effect)",
    CONTRADICTED: "in some configuration the interval (Bonferroni over the configurations) "
                  "lies below the paper's effect: significantly the other way, or too small "
                  "to be the paper's effect",
    INCONCLUSIVE: "the interval contains both no effect and the paper's effect; the seeds "
                  "that would decide it at 80% power are given",
    NOT_REPRODUCED: "our baseline is more than the stated tolerance from the paper's own "
                    "baseline number in some configuration (below: our stand-in; above: a "
                    "stronger baseline than the paper's, another regime), and no "
                    "configuration where it is within it contradicts the claim: the runs do "
                    "not test the paper's setting",
    NOT_AT_SCALE: "the mechanism the claim is about cannot act in these runs (a stated "
                  "precondition fails: the clip threshold barely moves, a model without noise "
                  "does not leak, or the epsilon is of another neighbouring notion)",
    UNTESTABLE: "no runs, fewer than two paired seeds, or nothing in the paper to compare "
                "with",
    HELD_BY_ACCOUNTING: "a claim about the privacy accounting itself: the mechanism the paper "
                        "describes, accounted with our accountant, gives the claimed epsilon "
                        "(computed, no runs; the computation is given)",
    CONTRADICTED_BY_ACCOUNTING: "a claim about the privacy accounting itself: the mechanism "
                                "the paper describes gives a larger epsilon than claimed, or none "
                                "(computed, no runs; the computation is given)",
    HELD_BY_BENCHMARK: "a claim about cost: our committed `dpclip bench` measurement is within "
                       "the paper's number (one machine's timing, named with it)",
    CONTRADICTED_BY_BENCHMARK: "a claim about cost: our committed `dpclip bench` measurement "
                               "exceeds the paper's number (one machine's timing, named with it)",
}
RULES = ("better", "lowest", "within", "smaller_spread", "at_most", "accounting", "benchmark")
# the direction of each metric a claim may name: True = higher is better
HIGHER_IS_BETTER = {"accuracy": True, "test_auc": True, "ece": False, "peak_ir_mia": False,
                    "peak_ir_mia_train": False,
                    "mia_auc": False, "attack_auc": False, "attack_tpr_at_low_fpr": False,
                    "clamp_share": False}
BOUND = "the bound"  # the baseline's name in an ``at_most`` claim's rows
# the rules whose held verdict is an advantage of the method over its baseline
ADVANTAGE_RULES = ("better", "lowest", "smaller_spread")
CONFIGURATION = ["target_epsilon", "alpha", "variant"]


@dataclass
class Finding:
    """A claim's verdict: ``ours`` is the text of our numbers, ``rows`` the comparisons,
    ``fidelity`` the baseline check's lines, ``seeds_needed`` for an inconclusive claim."""

    claim: dict
    verdict: str
    reason: str
    ours: list[str] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    fidelity: list[str] = field(default_factory=list)
    seeds_needed: int | None = None
    worst_baseline: tuple | None = None  # (configuration, ours, the paper's) furthest below
    preconditions: list[str] = field(default_factory=list)
    ablation: list[str] = field(default_factory=list)
    metric_text: str = ""  # what the differences are of (a range over variants, for spreads)
    excluded: list[str] = field(default_factory=list)  # configurations a precondition left out
    readings: list[tuple[str, str]] = field(default_factory=list)  # (reading, verdict), the
    # claim's own first, when it was run under several (:func:`combine_readings`)
    method: str = ""  # the compared method's name in ``rows`` (``<method> (<variant>)`` when
    # it comes from a reference variant; under ``within`` the reference's runs are the
    # baseline, ``<baseline> (<variant>)``, and this stays the claim's own); empty: the
    # claim's own

    @property
    def compared_method(self) -> str:
        return self.method or self.claim.get("method", "")


def load_claims(path: Path) -> list[dict]:
    if not path.is_file():
        raise DpclipError(f"--root: no claims file {path} (dpclip evidence runs in the project "
                          f"folder, which holds presets/claims.yaml)")
    claims = (yaml.safe_load(path.read_text()) or {}).get("claims") or []

    def bad(claim: dict, why: str) -> DpclipError:
        return DpclipError(f"{path}: claim {claim.get('id')!r}: {why}")

    for claim in claims:
        if "untestable" in claim:
            continue
        if claim.get("rule") not in RULES:
            raise bad(claim, f"rule {claim.get('rule')!r} is not one of {list(RULES)}")
        computed = {"accounting": accounting.accounting_checks(), "benchmark": benchmarks.CHECKS}
        if claim["rule"] in computed:  # checked without runs: its spec names a known check
            rule, checks = claim["rule"], computed[claim["rule"]]
            if not isinstance(claim.get(rule), dict) or claim[rule].get("check") not in checks:
                raise bad(claim, f"rule {rule!r} needs {rule}: {{check: one of {list(checks)}, "
                                 f"...}}, not {claim.get(rule)!r}")
            continue
        if claim["rule"] == "at_most" and not isinstance(claim.get("bound"), (int, float)):
            raise bad(claim, f"rule 'at_most' needs a numeric bound, not {claim.get('bound')!r}")
        if claim["rule"] == "within" and not isinstance(claim.get("margin"), (int, float)):
            raise bad(claim, f"rule 'within' needs a numeric margin, not {claim.get('margin')!r}")
        reproduce = claim.get("reproduce")
        if reproduce is not None and not (isinstance(reproduce, dict) and
                                          {"method", "metric", "paper"} <= set(reproduce)):
            raise bad(claim, f"reproduce needs method, metric and paper (the paper's baseline "
                             f"numbers), not {reproduce!r}")
        for other in (reproduce or {}).get("also") or []:
            if not isinstance(other, dict) or not {"source", "paper"} <= set(other):
                raise bad(claim, f"each reproduce.also entry needs a source and the paper's "
                                 f"numbers, not {other!r}")
        variants = claim.get("variants")
        if variants is not None and not (isinstance(variants, list) and variants and
                                         all(isinstance(v, str) for v in variants)):
            raise bad(claim, f"variants must be a list of the preset's variant names, not "
                             f"{variants!r}")
        if "reading_of" in claim and claim["reading_of"] not in {c.get("id") for c in claims}:
            raise bad(claim, f"reading_of names no claim: {claim['reading_of']!r}")
        not_run = claim.get("readings_not_run")
        if not_run is not None and not (isinstance(not_run, list) and not_run and
                                        all(isinstance(r, str) and r.strip() for r in not_run)):
            raise bad(claim, f"readings_not_run must be a list of texts (each reading and why "
                             f"it is not run), not {not_run!r}")
        reference = claim.get("reference_variant")
        if reference is not None and not isinstance(reference, str):
            raise bad(claim, f"reference_variant must be one variant's name, not {reference!r}")
        if reference is not None and len(claim.get("baselines") or [None]) > 1:
            raise bad(claim, f"a reference_variant claim compares one baseline, not "
                             f"{claim['baselines']!r}")
        for condition in claim.get("preconditions") or []:
            if not isinstance(condition, dict) or condition.get("kind") not in PRECONDITIONS \
                    or "method" not in condition:
                raise bad(claim, f"a precondition needs a kind of {list(PRECONDITIONS)} and a "
                                 f"method, not {condition!r}")
        if claim.get("metric") not in HIGHER_IS_BETTER:
            raise bad(claim, f"metric {claim.get('metric')!r} is not one of "
                             f"{list(HIGHER_IS_BETTER)}")
    return claims


def preset_table(results: Path, preset: str) -> pd.DataFrame | None:
    """Every run of a preset (all its variants), with a ``variant`` column; None when the preset
    has not been run."""
    frames = []
    folder = results / preset
    for table in sorted(folder.glob("*/reports/comparison.csv")):
        frame = pd.read_csv(table)
        frames.append(frame.assign(variant=table.parent.parent.name))
    if not frames:
        return None
    joined = pd.concat(frames, ignore_index=True)
    # a variant evaluated before a column existed lacks it: its NaNs are not measurements
    joined.attrs["lacking"] = {f["variant"].iloc[0]: sorted(set(joined.columns) - set(f.columns))
                               for f in frames if len(f)}
    return joined


def _by_seed(table: pd.DataFrame, method: str, metric: str) -> pd.Series:
    return table[table["method"] == method].set_index("seed")[metric].astype(float)


def _number(value) -> str:
    return {math.inf: "+inf", -math.inf: "-inf"}.get(value, f"{value:.4g}")


def _interval_text(mean, low, high) -> str:
    if low is None or pd.isna(low):
        return f"{mean:.4g}"
    return f"{mean:.4g} [{_number(low)}, {_number(high)}]"


def _label(key: dict) -> str:
    parts = [f"eps {key['target_epsilon']:g}"]
    if str(key.get("alpha")) not in ("iid", "nan"):
        parts.append(f"alpha {key['alpha']}")
    # a variant named after its epsilon or alpha (table10's eps0.5, table6's alpha0.1) says
    # nothing the other parts do not
    if key.get("variant") not in (None, "main", f"eps{key['target_epsilon']:g}",
                                  f"alpha{key.get('alpha')}"):
        parts.append(str(key["variant"]))
    return ", ".join(parts)


def for_configuration(value, row: dict):
    """A claim's number for one configuration: ``value`` itself, or the entry of a mapping
    keyed by the row's baseline, variant or target epsilon (None when it has none)."""
    if not isinstance(value, dict):
        return value
    for key in (row.get("baseline"), row.get("variant")):
        if key in value:
            return value[key]
    for key, number in value.items():
        try:
            if float(key) == float(row["target_epsilon"]):
                return number
        except (TypeError, ValueError):
            continue
    return None


def _paired_row(key: dict, baseline: str, mine: pd.Series, theirs: pd.Series) -> dict:
    seeds = sorted(set(mine.dropna().index) & set(theirs.dropna().index))
    d = (mine.loc[seeds] - theirs.loc[seeds]).to_numpy(dtype=float)
    mean, low, high, p = paired_test(d)
    return {**key, "baseline": baseline, "seeds": len(d), "differences": d.tolist(),
            # every metric a claim judges is a fraction (accuracy, ECE, AUC, attack
            # accuracy, a range of accuracies): its mean's interval stays in [0, 1]
            "method_mean": mean_interval(mine.loc[seeds], bounds=(0.0, 1.0)),
            "baseline_mean": mean_interval(theirs.loc[seeds], bounds=(0.0, 1.0)),
            "difference": mean, "difference_low": low, "difference_high": high, "p": p}


def _comparisons(table: pd.DataFrame, method: str, baselines: list[str], metric: str,
                 bound: float | None = None) -> list[dict]:
    """Per configuration and baseline: both means with intervals and the paired difference.
    With ``bound`` (``at_most``, no baselines), the method's metric against that fixed number,
    seed by seed: the "baseline" :data:`BOUND` is the bound on every seed."""
    rows = []
    for values, group in table.groupby(CONFIGURATION, sort=True, dropna=False):
        key, mine = dict(zip(CONFIGURATION, values)), _by_seed(group, method, metric)
        for baseline in baselines or [BOUND]:
            theirs = _by_seed(group, baseline, metric) if bound is None else \
                pd.Series(float(bound), index=mine.index)
            rows.append(_paired_row(key, baseline, mine, theirs))
    return rows


def against_reference(table: pd.DataFrame, reference: str, method: str
                      ) -> tuple[pd.DataFrame, str]:
    """A claim that compares one reference variant with each other variant (the full method
    against each ablation, ``reference_variant``): the ``method``'s runs of the reference
    variant, renamed ``<method> (<reference>)``, join every other variant, where the claim's
    baseline is that variant's own runs; the reference variant's runs leave. Returns the table
    and the method's new name. A ``within`` claim passes its baseline as ``method`` here, so
    the reference's runs become the baseline and each variant's own runs the method."""
    name = f"{method} ({reference})"
    mine = table[(table["variant"] == reference) & (table["method"] == method)]
    others = sorted(set(table["variant"]) - {reference})
    joined = [table[table["variant"] != reference],
              *(mine.assign(variant=variant, method=name) for variant in others)]
    return pd.concat(joined, ignore_index=True), name


def _mark_fair(rows: list[dict], claim: dict, gate_table: pd.DataFrame, rule: str) -> None:
    """Set each row's ``gate_ok``: True when the baseline gate was checked for the row's
    configuration and passed (for a ``reference_variant`` claim: for every configuration of
    the reference variant, whose runs the comparison uses), False when it failed or was not
    checked, None for a claim without a gate or a spread over variants."""
    if not claim.get("reproduce") or rule == "smaller_spread":
        for row in rows:
            row["gate_ok"] = None
        return
    reference = claim.get("reference_variant")
    if reference:
        status = gate_status(claim, gate_table[gate_table["variant"] == reference])
        passed = bool(status) and all(status.values())
        for row in rows:
            row["gate_ok"] = passed
        return
    status = gate_status(claim, gate_table)
    for row in rows:
        row["gate_ok"] = status.get(_label(row), False)


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
        key = {"target_epsilon": values[0], "alpha": values[1], "variant": None}
        rows.append({**_paired_row(key, baseline, spreads[method], spreads[baseline]),
                     "variants": int(group["variant"].nunique())})
    return rows


def _assess(row: dict, sign: int, effect, margin: float | None, family: int,
            against_bound: bool = False) -> None:
    """Set the row's ``outcome`` (module docstring) and, when inconclusive, ``seeds_needed``.
    ``sign`` is +1 when a larger difference is the paper's direction, -1 otherwise; ``effect``
    is the paper's difference (method minus baseline) or None. ``against_bound``: the row
    compares one method with a fixed bound (``at_most``), where a finite interval of zero width
    decides and the seeds to hold are those that detect the observed distance below it."""
    low, high = row["difference_low"], row["difference_high"]
    gain = (sign * low, sign * high) if sign > 0 else (sign * high, sign * low)  # favourable
    null = -margin if margin is not None else 0.0
    favourable_effect = None if effect is None else sign * float(effect)
    strict = 1 - (1 - CONFIDENCE) / family  # Bonferroni for "some configuration contradicts"
    _, wide_low, wide_high, _ = paired_test(row["differences"], strict)
    wide_top = sign * wide_high if sign > 0 else sign * wide_low
    row["contradiction_interval"] = (wide_low, wide_high)
    # what a contradiction lies below, in the favourable direction: the study-wide count's test
    row["sign"] = sign
    row["bar"] = bar = null if margin is not None or favourable_effect is None else \
        max(null, favourable_effect)
    decides = not degenerate(low, high) or (against_bound and _finite(low, high))
    wide_decides = not degenerate(wide_low, wide_high) or (against_bound and
                                                           _finite(wide_low, wide_high))
    if decides and gain[0] > null:
        row["outcome"] = HELD
    elif decides and wide_decides and (
            wide_top < null or (margin is None and favourable_effect is not None
                                and favourable_effect > 0 and wide_top < favourable_effect)):
        row["outcome"] = CONTRADICTED
    else:
        row["outcome"] = INCONCLUSIVE
        spread = float(pd.Series(row["differences"]).std(ddof=1)) if row["seeds"] >= 2 \
            else math.nan
        # held: the 95% interval clears no effect (-margin) when the paper's effect is true
        target = (favourable_effect or 0.0) + margin if margin is not None else \
            sign * row["difference"] if against_bound else favourable_effect
        row["seeds_to_hold"] = seeds_needed(spread, target) if target and target > 0 else None
        # contradicted: the interval at 5% / m falls below the paper's effect (-margin) when
        # the observed difference is the true one
        observed = sign * row["difference"]
        gap = None if math.isnan(observed) else bar - observed
        row["seeds_to_contradict"] = seeds_needed(spread, gap, family=family) \
            if gap and gap > 0 else None
        counts = [n for n in (row["seeds_to_hold"], row["seeds_to_contradict"]) if n]
        row["seeds_needed"] = min(counts) if counts else None
        if not decides:
            row["why"] = "no spread over seeds" if row["seeds"] >= 2 else "one seed"


def _finite(low, high) -> bool:
    return low is not None and high is not None and not pd.isna(low) and not pd.isna(high) \
        and math.isfinite(low) and math.isfinite(high)


def unreachable(seeds: int, configurations: int) -> str:
    """What ``seeds`` paired seeds cannot reach over ``configurations`` configurations: held
    needs the exact test at 5% (:func:`minimum_exact_seeds`), contradicted at 5% / m."""
    to_hold = minimum_exact_seeds(CONFIDENCE)
    to_contradict = minimum_exact_seeds(CONFIDENCE, configurations)
    if seeds < to_hold:
        return (f"; at {seeds} seeds neither {HELD} nor {CONTRADICTED} can be reached: the exact "
                f"test needs {to_hold} seeds to reach 5%"
                + (f", and {to_contradict} to reach 5% / {configurations} (a contradiction in "
                   f"any of {configurations} configurations)" if configurations > 1 else ""))
    if seeds < to_contradict:
        return (f"; {CONTRADICTED} cannot be reached at {seeds} seeds: over {configurations} "
                f"configurations the exact test needs {to_contradict} seeds to reach 5% / "
                f"{configurations}")
    return ""


def _describe(row: dict, method: str, metric: str) -> str:
    text = (f"{_label(row)}: {method} {_interval_text(*row['method_mean'])} vs "
            f"{row['baseline']} {_interval_text(*row['baseline_mean'])} ({metric}, "
            f"{row['seeds']} seeds); difference "
            f"{_interval_text(row['difference'], row['difference_low'], row['difference_high'])}")
    if not pd.isna(row["p"]):
        text += f", p {row['p']:.3g}"
    if row.get("paper_effect") is not None:
        text += f"; the paper's difference {row['paper_effect']:+.4g}"
    text += f": {row['outcome']}" if "outcome" in row else ""
    if row.get("outcome") == INCONCLUSIVE:
        needed = row.get("seeds_needed")
        text += f" ({row['why']}; " if row.get("why") else " ("
        ways = [f"{HELD} at {row['seeds_to_hold']} if the paper's difference is the true one"
                if row.get("seeds_to_hold") else "",
                f"{CONTRADICTED} at {row['seeds_to_contradict']} if ours is"
                if row.get("seeds_to_contradict") else ""]
        text += (f"about {needed} seeds would decide it: " + ", ".join(w for w in ways if w)
                 + ")" if needed else
                 "seeds needed unknown: no paper effect, or more than 1000)")
    return text


def fidelity(claim: dict, table: pd.DataFrame) -> tuple[bool, list[str], tuple | None]:
    """The baseline check of ``reproduce``: (reproduced, one line per configuration with our
    mean and the paper's number, the configuration furthest from the paper's as (label, ours,
    the paper's)); :func:`gate_status` says which configurations pass it. Two-sided:
    our baseline must be within ``tolerance`` of the paper's number, neither weaker (our
    stand-in) nor stronger (another regime)."""
    check = claim.get("reproduce")
    if not check:
        return True, [], None
    method, metric = check["method"], check["metric"]
    tolerance = float(check.get("tolerance", 0.015))
    higher = HIGHER_IS_BETTER.get(metric, True)
    ok, lines, worst, gap = True, [], None, -math.inf
    for key, paper, ours, far in _gate_checks(claim, table):
        mean = float(ours.mean())
        if abs(paper - mean) > gap:
            gap, worst = abs(paper - mean), (_label(key), mean, paper)
        ok &= not far
        better = mean >= paper if higher else mean <= paper
        lines.append(f"{_label(key)}: {method} {metric} {mean:.4g} over {len(ours)} seeds vs "
                     f"the paper's {paper:.4g}: " + _gate_words(far, higher, tolerance, better))
        for other in check.get("also") or []:  # the paper's other numbers for this baseline
            number = for_configuration(other["paper"], key)
            if number is not None:
                lines.append(f"{_label(key)}: the paper's {other['source']} gives {number:.4g} "
                             f"for the same baseline (ours {mean - number:+.4g} from it; "
                             f"informative, the gate uses the number above)")
    return ok, lines, worst


WEAKER, STRONGER = "weaker", "stronger"


def _gate_words(far: str | None, higher: bool, tolerance: float, better: bool) -> str:
    if far == WEAKER:
        return f"{'below' if higher else 'above'} it by more than {tolerance:g}"
    if far == STRONGER:
        return (f"{'above' if higher else 'below'} it by more than {tolerance:g}: a stronger "
                f"baseline than the paper's, another regime")
    return "as good or better, within it" if better else f"within {tolerance:g}"


def _unjudged(claim: dict, table: pd.DataFrame, unfair: set[str]) -> str:
    """The configurations the gate failed, grouped by side: "eps 0.5, where our dp_sgd
    baseline is more than 0.015 below the paper's own" (or above it: a stronger baseline)."""
    check = claim["reproduce"]
    higher = HIGHER_IS_BETTER.get(check["metric"], True)
    sides: dict[str, list[str]] = {}
    for key, _, _, far in _gate_checks(claim, table):
        if far and _label(key) in unfair:
            sides.setdefault(far, []).append(_label(key))
    words = {WEAKER: "below" if higher else "above", STRONGER: "above" if higher else "below"}
    return "; ".join(
        ", ".join(sorted(labels)) + f", where our {check['method']} baseline is more than "
        f"{float(check.get('tolerance', 0.015)):g} {words[side]} the paper's own"
        + (" (a stronger baseline than the paper's, another regime)" if side == STRONGER
           else "")
        for side, labels in sorted(sides.items()))


def gate_status(claim: dict, table: pd.DataFrame) -> dict[str, bool]:
    """Per configuration the gate could check (the paper gives a number and our baseline ran
    there): whether our baseline is within ``reproduce.tolerance`` of the paper's own number.
    A configuration absent here was not checked."""
    return {_label(key): not far for key, _, _, far in _gate_checks(claim, table)}


def _gate_checks(claim: dict, table: pd.DataFrame):
    """Per configuration the gate can check: (the configuration, the paper's number, our
    baseline's values over seeds, None when their mean is within ``reproduce.tolerance`` of
    the paper's number, else which side it is on: :data:`WEAKER` or :data:`STRONGER`, a
    stronger baseline than the paper's being another regime, not the paper's setting)."""
    check = claim.get("reproduce")
    if not check:
        return
    method, metric = check["method"], check["metric"]
    tolerance = float(check.get("tolerance", 0.015))
    higher = HIGHER_IS_BETTER.get(metric, True)
    for values, group in table.groupby(CONFIGURATION, sort=True, dropna=False):
        key = dict(zip(CONFIGURATION, values))
        paper = for_configuration(check["paper"], key)
        ours = _by_seed(group, method, metric).dropna()
        if paper is None or ours.empty:
            continue
        mean = float(ours.mean())
        ahead = (mean - paper) if higher else (paper - mean)  # > 0: ours is the better one
        yield key, paper, ours, WEAKER if ahead < -tolerance else \
            STRONGER if ahead > tolerance else None


def _schedule(runs: pd.DataFrame) -> str:
    """Each configuration's clip schedule, C_0 -> median C_t -> C_T (means over its runs)."""
    parts = []
    for values, group in runs.groupby(CONFIGURATION, sort=True, dropna=False):
        c = [float(group[col].astype(float).mean()) if col in group else math.nan
             for col in ("c_initial", "c_median", "c_final")]
        parts.append(f"{_label(dict(zip(CONFIGURATION, values)))} "
                     + " -> ".join("?" if math.isnan(v) else f"{v:.3g}" for v in c))
    return "; ".join(parts)


def precondition(condition: dict, table: pd.DataFrame, by: list[str] = CONFIGURATION
                 ) -> tuple[bool | None, str, list[tuple]]:
    """One precondition on the preset's runs: (holds, or None when the runs cannot tell; the
    line that says so; the configurations, as values of ``by``, where it fails). clip_moves
    is checked per configuration: the claim is then judged where the mechanism can act, and
    "not testable at this scale" only when it can act nowhere."""
    kind, method = condition["kind"], condition["method"]
    runs = table[table["method"] == method]
    if runs.empty:
        return None, f"{kind} of {method}: not checked, the preset has no {method} runs", []
    if kind == "clip_moves":
        if "c_initial" not in runs or runs["c_initial"].isna().all():
            return None, (f"{kind} of {method}: not checked, the runs record no initial clip "
                          f"threshold (`dpclip report` again)"), []
        return _clip_moves(condition, runs, by)
    if kind == "leaks":
        metric, least = condition["metric"], float(condition["min"])
        value = float(runs[metric].astype(float).mean())
        return value >= least, (f"{method}'s {metric} is {value:.3g} over {len(runs)} runs "
                                f"({'at least' if value >= least else 'below'} {least:g}: "
                                + ("it leaks" if value >= least else "nothing to protect")
                                + ")"), []
    ours = sorted(set(runs["adjacency"].dropna().astype(str))) if "adjacency" in runs else []
    holds = ours == [condition["paper"]]
    return holds, (f"{method}'s epsilon is for {', '.join(ours) or 'an unstated'} adjacency, the "
                   f"paper's for {condition['paper']}" + ("" if holds else
                                                           ": the epsilons do not compare")), []


def _clip_moves(condition: dict, runs: pd.DataFrame, by: list[str]
                ) -> tuple[bool, str, list[tuple]]:
    """How far the method's controller moves C, per configuration: the mean over its runs of
    |log(C_T / C_0')|, with C_0' the initial threshold projected onto the clamp
    (``condition["clamp"]``, the preset's [C_min, C_max]): the jump the clamp makes at the first
    step is the clamp's, not the controller's (C_0 = 0.25 under [1, 3] starts at 1)."""
    method, least = condition["method"], float(condition.get("min", 0.05))
    start = runs["c_initial"].astype(float)
    if condition.get("clamp"):
        start = start.clip(lower=float(condition["clamp"][0]), upper=float(condition["clamp"][1]))
    moved = np.abs(np.log(runs["c_final"].astype(float) / start))
    per = {values if isinstance(values, tuple) else (values,): float(np.nanmean(group))
           for values, group in moved.groupby([runs[c] for c in by], sort=True, dropna=False)}
    failing = [key for key, value in per.items() if not value >= least]
    clamp = (f", C_0' = C_0 projected onto the clamp {list(condition['clamp'])}: the clamp's own "
             f"jump is not the controller's" if condition.get("clamp") else "")
    line = (f"{method}'s controller moves C by |log(C_T / C_0')| (mean over seeds{clamp}): "
            + "; ".join(f"{_label(dict(zip(by, key)))} {value:.3g}" for key, value in per.items())
            + f" (at least {least:g} in {len(per) - len(failing)} of {len(per)} configurations"
            + (f"; not testable at this scale in {', '.join(_label(dict(zip(by, k))) for k in failing)}"
               if failing else "")
            + f"); C_0 -> median C_t -> C_T, mean over seeds: {_schedule(runs)}")
    if condition.get("paper"):
        line += f"; the paper: {condition['paper']}"
    return len(failing) < len(per), line, failing


def _without_guarantee(table: pd.DataFrame, methods: list[str]) -> str | None:
    """Which compared methods have runs with ``dp_guarantee`` false (None: none has)."""
    if "dp_guarantee" not in table:
        return None
    flags = table["dp_guarantee"].astype(str).str.lower().isin(["false", "0", "0.0"])
    bad = [m for m in methods if flags[table["method"] == m].any()]
    if not bad:
        return None
    variants = sorted(set(table.loc[flags, "variant"].astype(str))) if "variant" in table else []
    return (f"runs of {', '.join(bad)} make no DP guarantee"
            + (f" (variant {', '.join(variants)})" if variants else ""))


def _adjacency_mismatch(table: pd.DataFrame, method: str, baselines: list[str],
                        claim: dict) -> str | None:
    """A comparison across neighbouring notions without the claim's ``adjacency``
    precondition is refused: an epsilon for replacing one record's features and one for
    adding or removing a record are not the same quantity (None: same notion, or the claim
    states its precondition, which then decides)."""
    if "adjacency" not in table or any(c.get("kind") == "adjacency"
                                       for c in claim.get("preconditions") or []):
        return None
    notions = {m: sorted(set(table.loc[table["method"] == m, "adjacency"].dropna().astype(str)))
               for m in [method, *baselines]}
    if len({tuple(v) for v in notions.values() if v}) <= 1:
        return None
    listed = "; ".join(f"{m}: {', '.join(v) or 'unstated'}" for m, v in notions.items())
    return (f"the compared epsilons are of different neighbouring notions ({listed}) and the "
            f"claim has no adjacency precondition: they do not compare")


def judge(claim: dict, table: pd.DataFrame | None, project: Path | None = None) -> Finding:
    """The verdict of one claim on its preset's runs (``table``: None when not run), in four
    steps: a claim judged without runs (:func:`_judged_without_runs`); the runs it compares
    (:func:`_compared_runs`); one row per configuration with its test (:func:`_rows`); and the
    verdict from those rows and the baseline's fidelity (:func:`_verdict`)."""
    without_runs = _judged_without_runs(claim, table, project)
    if without_runs is not None:
        return without_runs
    runs = _compared_runs(claim, table)
    if isinstance(runs, Finding):
        return runs
    rows, sign, metric_text = _rows(claim, runs)
    reproduced, fidelity_lines, worst = fidelity(claim, runs.gate_table)
    preconditions = [line for _, line, _ in runs.checked]
    if not rows or min(r["seeds"] for r in rows) < 2:  # the baseline and the means still show
        ours = [f"{_label(r)}: {runs.method} {r['method_mean'][0]:.4g} vs {r['baseline']} "
                f"{r['baseline_mean'][0]:.4g} ({runs.metric}, {r['seeds']} seed)"
                for r in rows if r["seeds"] == 1]
        return Finding(claim, UNTESTABLE, "fewer than two seeds pair the runs", ours=ours,
                       fidelity=fidelity_lines, worst_baseline=worst, preconditions=preconditions)
    ours = [_describe(r, runs.method, metric_text) for r in rows]
    failed = [line for holds, line, _ in runs.checked if holds is False]
    verdict, reason, needed = _verdict(claim, runs, rows, sign, reproduced, fidelity_lines,
                                       failed)
    excluded = [_label(dict(zip(runs.by, key))) for key in runs.excluded]
    if excluded and not failed:
        reason += (f"; not testable at this scale in {', '.join(excluded)} (a precondition "
                   f"fails there)")
    return Finding(claim, verdict, reason, ours, rows, fidelity_lines, needed, worst,
                   preconditions, metric_text=metric_text,
                   excluded=excluded if not failed else [], method=runs.method)


def _judged_without_runs(claim: dict, table: pd.DataFrame | None,
                         project: Path | None) -> Finding | None:
    """The verdict of a claim that needs no runs, or that has none: untestable as stated, one
    about the accounting itself (its method's check: :mod:`dpclip.reporting.accounting`), one
    about cost read from a committed bench output in ``project``
    (:mod:`dpclip.reporting.benchmarks`), or a preset not run; None for a claim its runs
    judge."""
    if "untestable" in claim:
        return Finding(claim, UNTESTABLE, " ".join(str(claim["untestable"]).split()).rstrip("."))
    if claim.get("rule") == "accounting":
        check = accounting.run_check(claim["accounting"])
        verdict = HELD_BY_ACCOUNTING if check.holds else CONTRADICTED_BY_ACCOUNTING
        return Finding(claim, verdict, check.summary or (
            f"the mechanism gives epsilon {check.computed:.3g} where the paper claims "
            f"{check.claimed:g}"), ours=check.lines)
    if claim.get("rule") == "benchmark":
        if project is None:
            raise DpclipError(f"claim {claim['id']!r}: a benchmark claim needs the project root")
        path = benchmarks.bench_path(claim["benchmark"], project)
        if not path.is_file():
            return Finding(claim, UNTESTABLE, f"not measured: {path} does not exist (the "
                                              f"claim's note gives the `dpclip bench` run)")
        measured = benchmarks.run_check(claim["benchmark"], project)
        verdict = HELD_BY_BENCHMARK if measured.holds else CONTRADICTED_BY_BENCHMARK
        return Finding(claim, verdict, measured.summary or "", ours=measured.lines)
    if table is None:
        return Finding(claim, UNTESTABLE, f"the preset {claim['preset']!r} has not been run "
                                          f"(`dpclip preset {claim['preset']}`)")
    return None


@dataclass
class _Runs:
    """What a claim compares: its method against its baselines on ``compared`` (the runs of
    the configurations where its preconditions let the mechanism act), and ``gate_table``,
    every run the baseline gate reads."""

    compared: pd.DataFrame
    gate_table: pd.DataFrame
    method: str
    baselines: list[str]
    metric: str
    by: list[str]  # the columns that make a configuration
    checked: list[tuple]  # each precondition: (holds, its line, the configurations it fails)
    excluded: list[tuple]  # the configurations a precondition leaves out


def _compared_runs(claim: dict, table: pd.DataFrame) -> _Runs | Finding:
    """The runs a claim compares, or why they cannot be compared (a Finding)."""
    method, metric, rule = claim["method"], claim["metric"], claim["rule"]
    lacking = (table.attrs.get("lacking") or {}).items()  # read before any filter drops attrs
    baselines = [] if rule == "at_most" else claim.get("baselines") or [claim["baseline"]]
    reference = claim.get("reference_variant")
    wanted = [*(claim.get("variants") or []), *([reference] if reference else [])]
    unknown = sorted(set(wanted) - set(table["variant"]))
    if unknown:
        return Finding(claim, UNTESTABLE, f"the preset's runs have no variant {unknown} "
                                          f"(`dpclip preset {claim['preset']} --variant ...`)")
    if claim.get("variants"):  # the claim is about these variants of the preset only
        table = table[table["variant"].isin(wanted)]
    gate_table = table  # the baseline gate reads every run, the reference variant's included
    if reference and rule == "within":  # each variant no worse than the reference's runs
        table, reference_name = against_reference(table, reference, baselines[0])
        baselines = [reference_name]
    elif reference:  # the reference's runs better than each variant's
        table, method = against_reference(table, reference, method)
    lacking = sorted(variant for variant, columns in lacking
                     if metric in columns and variant in set(gate_table["variant"]))
    if metric not in table.columns or lacking:  # results from before the metric was recorded
        where = f" of {', '.join(lacking)}" if lacking else ""
        return Finding(claim, UNTESTABLE, f"the preset's results{where} have no {metric!r} "
                                          f"(made before it was recorded: `dpclip preset "
                                          f"{claim['preset']}` evaluates its runs again)")
    missing = {method, *baselines} - set(table["method"])
    if missing:
        return Finding(claim, UNTESTABLE, f"the preset's runs have no {sorted(missing)}")
    # the compared methods only: a run of another (a non-private model some precondition
    # reads, with no target epsilon) must not open a configuration of its own
    compared = table[table["method"].isin([method, *baselines])]
    unsound = _without_guarantee(compared, [method, *baselines])
    if unsound:
        return Finding(claim, UNTESTABLE, f"{unsound}: their epsilon is no bound, so a "
                                          f"comparison at matched epsilon is not one of DP "
                                          f"methods (judge the claim on variants with a guarantee)")
    notions = _adjacency_mismatch(compared, method, baselines, claim)
    if notions:
        return Finding(claim, UNTESTABLE, notions)
    by = ["target_epsilon", "alpha"] if rule == "smaller_spread" else CONFIGURATION
    checked = [precondition(c, table, by) for c in claim.get("preconditions") or []]
    excluded = sorted({key for _, _, keys in checked for key in keys}, key=str)
    if excluded and all(holds is not False for holds, _, _ in checked):
        # judged where the mechanism acts; the other configurations are not testable here
        keys = compared[by].apply(tuple, axis=1)
        compared = compared[~keys.isin(excluded)]
    return _Runs(compared, gate_table, method, baselines, metric, by, checked, excluded)


def _rows(claim: dict, runs: _Runs) -> tuple[list[dict], int, str]:
    """One row per configuration, each with its test (:func:`_assess`); the sign that makes
    the claim's direction positive; what the differences are of."""
    rule, metric, method, baselines = claim["rule"], runs.metric, runs.method, runs.baselines
    if rule == "smaller_spread":
        rows = _spread_rows(runs.compared, method, baselines[0], metric)
        sign, metric_text = -1, f"range of {metric} over the variants"  # smaller is better
    elif rule == "at_most":
        rows = _comparisons(runs.compared, method, [], metric, claim["bound"])
        sign, metric_text = -1, metric
    else:
        rows = _comparisons(runs.compared, method, baselines, metric)
        sign, metric_text = (1 if HIGHER_IS_BETTER[metric] else -1), metric
    if not rows or min(r["seeds"] for r in rows) < 2:
        return rows, sign, metric_text
    margin = float(claim["margin"]) if rule == "within" else None
    check = claim.get("reproduce") or {}
    for row in rows:
        # at_most: the paper gives a level, not a difference (no effect to detect)
        row["paper_effect"] = None if rule == "at_most" else \
            for_configuration(claim.get("effect"), row)
        _assess(row, sign, row["paper_effect"], margin, len(rows), against_bound=rule == "at_most")
        if rule != "smaller_spread" and check.get("metric") == metric and \
                check.get("method") == row["baseline"]:  # the paper's numbers, for the figure
            row["paper_baseline"] = for_configuration(check["paper"], row)
            if row["paper_baseline"] is not None and row["paper_effect"] is not None:
                row["paper_method"] = row["paper_baseline"] + row["paper_effect"]
        row["label"] = _label(row) + (f" vs {row['baseline']}" if len(baselines) > 1 else "")
    return rows, sign, metric_text


def _verdict(claim: dict, runs: _Runs, rows: list[dict], sign: int, reproduced: bool,
             fidelity_lines: list[str], failed: list[str]
             ) -> tuple[str, str, int | None]:
    """(verdict, reason, seeds needed).

    A contradiction where the baseline does reproduce the paper's number is a fair one: the
    claims are about every configuration, so one contradicted configuration decides, and the
    others are named (the family m stays every configuration's: nothing is chosen after the
    fact). "Held" needs every configuration, so it needs the setting reproduced in all."""
    rule, method, metric = claim["rule"], runs.method, runs.metric
    margin = float(claim["margin"]) if rule == "within" else None
    outcomes = [r["outcome"] for r in rows]
    _mark_fair(rows, claim, runs.gate_table, rule)
    unfair = set() if rule == "smaller_spread" else \
        {label for label, passed in gate_status(claim, runs.gate_table).items() if not passed}
    fair_contradicted = [r for r in rows if r["outcome"] == CONTRADICTED and r["gate_ok"]]
    if not reproduced and not (fair_contradicted and not failed and unfair):
        reason = (f"our {claim['reproduce']['method']} baseline is far from the paper's own "
                  f"({'; '.join(line for line in fidelity_lines if 'more than' in line)})")
        if failed:  # both: say so, the scale would not be enough either
            reason += "; nor could the mechanism act here: " + "; ".join(failed)
        return NOT_REPRODUCED, reason, None
    if failed:
        return NOT_AT_SCALE, "; ".join(failed), None
    if all(o == HELD for o in outcomes):
        reason = ("non-inferior within the margin " if margin is not None else
                  f"significantly below the bound {claim.get('bound')} " if rule == "at_most"
                  else "significant in the paper's direction ") + "in every configuration"
        return HELD, reason, None
    if CONTRADICTED in outcomes:
        reason = "; ".join(
            f"{r['label']}: the difference {r['difference']:+.3g} over {r['seeds']} seeds, "
            f"[{_number(r['contradiction_interval'][0])}, "
            f"{_number(r['contradiction_interval'][1])}] at 5% / {len(rows)}, lies "
            + ("below " if sign > 0 else "above ")
            + (f"0: {method}'s {metric} is above the bound {claim['bound']:g}"
               if rule == "at_most" else
               f"the margin (-{margin:g})" if margin is not None else
               f"the paper's effect ({r['paper_effect']:+.3g})"
               if r.get("paper_effect") is not None else "no effect")
            for r in (fair_contradicted if not reproduced else rows)
            if r["outcome"] == CONTRADICTED)
        if not reproduced:
            reason += "; not judged in " + _unjudged(claim, runs.gate_table, unfair)
        return CONTRADICTED, reason, None
    return (INCONCLUSIVE, *_undecided(claim, rows, margin))


def _undecided(claim: dict, rows: list[dict], margin: float | None) -> tuple[str, int | None]:
    """Why an inconclusive claim is open, and the paired seeds that would decide it."""
    open_rows = [r for r in rows if r["outcome"] == INCONCLUSIVE]
    # held needs every open configuration to hold, contradicted any one to contradict
    to_hold = [r.get("seeds_to_hold") for r in open_rows]
    to_contradict = [n for n in (r.get("seeds_to_contradict") for r in open_rows) if n]
    counts = [n for n in (None if None in to_hold else max(to_hold),
                          min(to_contradict, default=None)) if n]
    needed = min(counts) if counts else None
    reason = ("; ".join(r["label"] for r in open_rows) + (
        f": the interval contains the bound {claim['bound']:g}" if claim["rule"] == "at_most"
        else ": the interval contains no effect, and the paper states no size of effect to "
        "test against" if claim.get("effect") is None and margin is None else
        ": the interval contains both "
        + ("a loss of the margin" if margin is not None else "no effect")
        + " and the paper's effect"))
    ran = min(r["seeds"] for r in open_rows)
    reason += unreachable(ran, len(rows))
    if needed and needed <= ran:  # powered, yet undecided: 1 in 5 such runs is
        reason += (f"; the observed spread gives {POWER:.0%} power at {needed} paired "
                   f"seeds and {ran} ran: these did not decide it, more seeds would")
    else:
        reason += (f"; about {needed} paired seeds would decide it at {POWER:.0%} power"
                   if needed else "; the seeds needed cannot be estimated (no paper "
                   "effect, no spread, or more than 1000)")
    return reason, needed


def ablation_lines(claim: dict, results: Path) -> list[str]:
    """A claim's ``ablation``: the same method in another preset with one part switched off
    (e.g. WW's controller at kappa 0), its metric per variant and its range over the variants,
    beside the claim's own method: descriptive, no verdict."""
    spec = claim.get("ablation")
    if not spec:
        return []
    metric = claim["metric"]
    lines = []
    shown = [(spec["label"], spec["preset"], spec.get("method", claim["method"]))]
    if spec["preset"] != claim["preset"]:  # else the line above shows the claimed runs too
        shown.append((f"{claim['method']} as claimed", claim["preset"], claim["method"]))
    for label, preset, method in shown:
        table = preset_table(results, preset)
        if table is None or table[table["method"] == method].empty:
            lines.append(f"{label}: not run (`dpclip preset {preset}`)")
            continue
        runs = table[table["method"] == method]
        means = runs.groupby("variant")[metric].mean()
        seeds = runs.groupby("variant")["seed"].nunique().min()
        per = ", ".join(f"{v} {m:.4g}" for v, m in means.items())
        lines.append(f"{label} (`{preset}`, {seeds} seeds): {metric} {per}; range over the "
                     f"variants {means.max() - means.min():.4g}; C_T "
                     + ", ".join(f"{v} {c:.3g}" for v, c in
                                 runs.groupby("variant")["c_final"].mean().items()))
    return lines


def evidence(claims_path: Path, results: Path, project: Path | None = None) -> list[Finding]:
    """Every claim's finding, each preset's runs read once; ``project``: the folder the cost
    claims' bench files are named from (default: the one holding ``presets/claims.yaml``)."""
    claims = load_claims(claims_path)
    project = claims_path.resolve().parent.parent if project is None else project
    tables = {c["preset"]: preset_table(results, c["preset"]) for c in claims if "preset" in c}
    findings = [judge(c, tables.get(c.get("preset")), project) for c in claims]
    for f in findings:
        f.ablation = ablation_lines(f.claim, results)
    for parent in findings:
        readings = [f for f in findings if f.claim.get("reading_of") == parent.claim["id"]]
        if readings or parent.claim.get("readings_not_run"):
            combine_readings(parent, readings)
    return findings


DECISIVE = (HELD, CONTRADICTED)


def combine_readings(parent: Finding, readings: list[Finding]) -> None:
    """A claim whose verdict rests on an inference from the paper is also run under each
    plausible other reading (claims with ``reading_of: <its id>``). It is contradicted, or
    held, only when every reading is; when they disagree it is inconclusive, and its reason
    names what each reading gave ("contradicted under X; not testable under Y"). A reading
    that cannot be run here (the claim's ``readings_not_run``: what it would test, and why
    not) counts as not testable. Every reading's own finding stays on the page."""
    every = [parent, *readings]
    not_run = list(parent.claim.get("readings_not_run") or [])
    parent.readings = ([(f.claim["id"], f.verdict) for f in every]
                       + [(reading, UNTESTABLE) for reading in not_run])
    summary = "; ".join(f"{verdict} under {name}" for name, verdict in parent.readings)
    verdicts = {f.verdict for f in every} | ({UNTESTABLE} if not_run else set())
    if parent.verdict in DECISIVE and verdicts != {parent.verdict}:
        parent.verdict = INCONCLUSIVE
        parent.reason = (f"the readings disagree ({summary}); under {parent.claim['id']}'s "
                         f"own: {parent.reason}")
    else:
        parent.reason += f"; the readings: {summary}"


def _preset_facts(path: Path) -> str:
    """The wall time of each variant of a run preset, and its deviations from the paper."""
    if not path.is_file():
        return ""
    record = read_json(path)
    times = ", ".join(f"{v} {facts.get('wall_s_total', facts['wall_s']):.0f} s"
                      + (f" ({facts['seeds']} seeds)" if "seeds" in facts else "")
                      for v, facts in record["variants"].items())
    power = record.get("power") or {}
    seeds = ""
    if power:
        seeds = (f" Seeds by power: {power['seeds']} run"
                 + (f", {power['seeds_needed']} needed at 80% power"
                    if power.get("seeds_needed") else "")
                 + (f": the compute budget ({power['budget_s'] / 60:.0f} min) capped them"
                    if power.get("capped") else "") + ".")
    deviations = "".join(f"\n  - {' '.join(str(d).split())}" for d in record["deviations"])
    return (f", wall time on this machine: {times}.{seeds} Deviations from the paper:\n"
            f"{deviations}")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _claim_text(finding: Finding) -> str:
    return " ".join(finding.claim["claim"].split()).rstrip(".")


def _per_seed(row: dict) -> str:
    return ", ".join(f"{d:+.3g}" for d in row["differences"])


def _consistent(row: dict) -> bool:
    """Every seed's difference on the same side of zero (two seeds or more)."""
    d = row["differences"]
    return len(d) >= 2 and (all(v > 0 for v in d) or all(v < 0 for v in d))


CLEAR = 5  # the differences every seed agrees on that the first screen lists


def _agreeing_interval(row: dict) -> str:
    """The 95% interval of a difference every seed agrees on, as the first screen states it:
    agreement alone is no test (two seeds agree by chance half the time), the interval is."""
    low, high = row["difference_low"], row["difference_high"]
    if low is None or pd.isna(low) or math.isinf(low) or math.isinf(high):
        return "(no finite 95% interval at this number of seeds) "
    return f"(95% interval [{_number(low)}, {_number(high)}]) "


def _row_verdict(finding: Finding, row: dict) -> str:
    """The claim's verdict as one configuration's line shows it, with the configuration's own
    outcome where it differs: a configuration whose baseline is off the paper's own number (or
    was not checked) is not judged; one where it reproduces has an outcome of its own."""
    verdict = finding.verdict
    if verdict not in (HELD, CONTRADICTED, INCONCLUSIVE, NOT_REPRODUCED) or "outcome" not in row:
        return verdict
    if row.get("gate_ok") is None and verdict == NOT_REPRODUCED:  # a spread over variants
        return verdict
    if row.get("gate_ok") is False:
        return "not judged here (setting not reproduced)" + (
            f"; the claim: {verdict}" if verdict != NOT_REPRODUCED else "")
    if row["outcome"] != verdict:
        return f"{row['outcome']} here; the claim: {verdict}"
    return verdict


def first_screen(findings: list[Finding], lead: list[str] = ()) -> list[str]:
    """What a user can act on, before the rules: which claims are decided, the differences
    every seed agrees on, and per claim and configuration the matched-setting difference with
    its interval and seeds, whatever the baseline gate says (the gate names the verdict; it
    does not hide the data)."""
    decided = [f for f in findings if f.verdict in (HELD, CONTRADICTED)]
    compared = [(f, r) for f in findings for r in f.rows if r["seeds"] >= 2]
    repeats = same_runs(compared)
    clear = sorted((pair for pair in compared if _consistent(pair[1])
                    and (pair[0].claim["id"], pair[1]["label"]) not in repeats),
                   key=lambda pair: -abs(pair[1]["difference"]))
    held = [f for f in decided if f.verdict == HELD]
    # an advantage: a method better than its baseline (or the lowest, or steadier over a
    # range); a held "within" claim says a method costs little, not that it gains
    def advantage(f: Finding) -> bool:  # a reading of a claim is not another claim
        return f.claim.get("rule") in ADVANTAGE_RULES and not f.claim.get("reading_of") and \
            f.claim.get("method") != f.claim.get("baseline")

    readings = sum(1 for f in findings if f.claim.get("reading_of"))

    claimed = [f for f in findings if advantage(f)]
    gains = [f for f in held if advantage(f)]

    def listed(f: Finding) -> str:
        return (f"**{f.claim['id']}** ({_claim_text(f)}"
                + (f"; only where the mechanism acts, not in {', '.join(f.excluded)}"
                   if f.excluded else "") + ")")

    answer = (f"**Which method?** Held advantages ({len(gains)} of {len(claimed)} advantage "
              f"claims): " + "; ".join(map(listed, gains)) + "."
              if gains else
              f"**Which method?** DP-SGD: no advantage claim is held (0 of {len(claimed)}; "
              f"{_count(len(findings) - readings, 'claim')} in all"
              + (f", and {_count(readings, 'reading')} of them" if readings else "")
              + "), so no alternative to DP-SGD has a "
              "shown advantage in our runs.")
    others = [f for f in held if not advantage(f) and not f.claim.get("reading_of")]
    if others:
        answer += " Also held: " + "; ".join(map(listed, others)) + "."
    lines = ["## What the runs show", "", answer + " How sure: the differences below, each "
             "with its interval and seeds; every claim not listed here is undecided."]
    if lead:  # what the runs show beside the verdicts: mechanisms traced, post-hoc findings
        lines += ["", *lead]
        lines = lines[:-1] if lines[-1] == "" else lines
    contradicted = [f for f in decided if f.verdict == CONTRADICTED
                    and not f.claim.get("reading_of")]
    if contradicted:
        lines += ["", f"Contradicted under every reading run ({len(contradicted)}):", ""] + \
            [f"- {listed(f)}: {f.reason}." for f in contradicted]
    split = [f for f in findings if f.verdict != CONTRADICTED
             and any(verdict == CONTRADICTED for _, verdict in f.readings)]
    if split:
        lines += ["", f"Contradicted under some readings of the paper, not under all, so not "
                      f"contradicted ({len(split)}):", ""] + \
            [f"- **{f.claim['id']}** ({_claim_text(f)}): "
             + "; ".join(f"{verdict} under {name}" for name, verdict in f.readings) + "."
             for f in split]
    if contradicted or split:
        lines += ["", multiplicity(findings)]
    for heading, verdicts in (
            ("**Is the epsilon right?** Computed, no runs",
             (HELD_BY_ACCOUNTING, CONTRADICTED_BY_ACCOUNTING)),
            ("**What does it cost?** Measured by `dpclip bench`, no runs",
             (HELD_BY_BENCHMARK, CONTRADICTED_BY_BENCHMARK))):
        checked = [f for f in findings if f.verdict in verdicts]
        if checked:
            lines += ["", f"{heading}: " + "; ".join(
                f"**{f.claim['id']}** {f.verdict} ({_claim_text(f)}: {f.reason})"
                for f in checked) + "."]
    if clear:
        lines += ["", f"Differences every seed agrees on, largest first ({len(clear[:CLEAR])} of "
                  f"{len(clear)}; with 2 seeds both fall on one side by chance half the time, "
                  "with 6 once in 32):", ""]
        for f, r in clear[:CLEAR]:
            lines.append(f"- {f.claim['id']}, {r['label']}: {f.compared_method} minus "
                         f"{r['baseline']} in {f.metric_text or f.claim['metric']} is "
                         f"{r['difference']:+.3g} {_agreeing_interval(r)}"
                         f"on {r['seeds']} of {r['seeds']} seeds ({_per_seed(r)})"
                         + (f"; the paper's difference {r['paper_effect']:+.3g}"
                            if r.get("paper_effect") is not None else "")
                         + f" (verdict: {_row_verdict(f, r)})")
    lines += ["", "| claim | verdict | configuration | of | ours: method minus baseline, mean "
              "[95% interval] (per seed) | the paper's |", "|---|---|---|---|---|---|"]
    for f, r in compared:
        paper = "" if r.get("paper_effect") is None else f"{r['paper_effect']:+.3g}"
        same = repeats.get((f.claim["id"], r["label"]))
        numbers = (f"seed for seed the numbers of {same[0]}, {same[1]} (above)" if same
                   else f"{_interval_text(r['difference'], r['difference_low'], r['difference_high'])}"
                        f" ({_per_seed(r)})")
        lines.append(f"| {f.claim['id']} | {_row_verdict(f, r)} | {r['label']} | "
                     f"{f.metric_text or f.claim['metric']} | {numbers} | {paper} |")
    return lines + [""]


def same_runs(compared: list[tuple[Finding, dict]]) -> dict[tuple[str, str], tuple[str, str]]:
    """Rows that repeat another row: (claim, configuration) -> the first such row's. A row
    repeats another when its per-seed differences are equal (or negated: the same pair the
    other way round) on three or more seeds, not all zero: by chance that does not happen,
    but a variant where the mechanism never acts equals its twin bit for bit (the wider clamp
    that never binds, a probe whose controller never leaves C_0)."""
    seen: dict[tuple, tuple[str, str]] = {}
    first_of = {}
    for f, r in compared:
        differences = tuple(round(float(d), 12) for d in r.get("differences") or [])
        if len(differences) < 3 or not any(differences):
            continue
        here = (f.claim["id"], r["label"])
        for key in (differences, tuple(-d for d in differences)):
            if key in seen:
                first_of[here] = seen[key]
                break
        else:
            seen[differences] = here
    return first_of


def multiplicity(findings: list[Finding]) -> str:
    """The study-wide count: how many configuration rows were judged, and whether each
    contradicted row survives Bonferroni over all of them. The exact sign-flip test cannot:
    with 7 seeds its smallest p is 2 / 2^7 = 0.0156, so each contradiction there is "every
    seed on one side"; a one-sided paired t-test of the row's difference against what it lies
    below (the paper's effect, the margin, the bound) gives the p compared with 0.05 / N."""
    from scipy import stats

    judged = [r for f in findings for r in f.rows if r.get("outcome") in (HELD, CONTRADICTED,
                                                                          INCONCLUSIVE)]
    if not judged:
        return ""
    level = (1 - CONFIDENCE) / len(judged)
    tests = []
    for f in findings:  # a claim contradicted, or one of its readings (its own rows here)
        if CONTRADICTED not in (f.verdict, dict(f.readings).get(f.claim["id"])):
            continue
        for r in f.rows:
            if r.get("outcome") != CONTRADICTED or r["seeds"] < 2:
                continue
            d = r["sign"] * pd.Series(r["differences"], dtype=float)
            se = float(d.std(ddof=1)) / math.sqrt(len(d))
            p = float(stats.t.cdf((float(d.mean()) - r["bar"]) / se, len(d) - 1)) if se > 0 \
                else 0.0
            tests.append((f"{f.claim['id']} {r['label']}", p))
    if not tests:
        return ""
    failing = [name for name, p in tests if p >= level]
    worst = max(p for _, p in tests)
    return (f"**Multiplicity.** {len(judged)} configuration rows are judged across the claims; "
            f"the exact sign-flip test's smallest p at 7 seeds is 0.0156, so each contradiction "
            f"is \"every seed on one side\". A one-sided paired t-test of each contradicted "
            f"row against what it lies below gives p from {min(p for _, p in tests):.2g} to "
            f"{worst:.2g}, against 0.05 / {len(judged)} = {level:.2g}: "
            + ("every contradiction survives a study-wide Bonferroni correction." if not failing
               else "not significant study-wide: " + ", ".join(failing) + "."))


def evidence_markdown(findings: list[Finding], results: Path, command: str,
                      figures: dict[str, str] | None = None, lead: list[str] = ()) -> str:
    """The verdict report: what the runs show (:func:`first_screen`, with the ``lead`` of
    :mod:`dpclip.reporting.lead`), what the verdicts mean, a summary table, one section per
    claim."""
    lines = ["# Evidence: the papers' claims, tested", "", *first_screen(findings, lead),
             "## How to read it", "",
             f"Regenerate: `{command}`. Our numbers come from the preset runs' metrics "
             f"(`{results}/<preset>/<variant>/reports/comparison.csv`), as fractions where the "
             "papers give percentages. Each claim is paired over seeds per configuration "
             "(exact sign-flip test and its interval up to 16 seeds, which cannot reach 5% "
             f"below {minimum_exact_seeds()} seeds; 95% intervals; `dpclip.reporting.evidence`). A "
             "verdict is one of:", ""]
    lines += [f"- **{name}**: {meaning}." for name, meaning in VERDICT_MEANINGS.items()]
    lines += ["", "**Readings.** Where the paper leaves open a setting a verdict rests on (an "
              "estimator, a gain, a clamp, a learning rate, a partition), the claim is also run "
              "under each plausible other reading: the claims whose text starts \"(A reading: "
              "...)\". A claim is contradicted, or held, only when every reading run is; a "
              "reading that cannot be run here counts as not testable, and the claim's verdict "
              "names what each reading gave. A row whose numbers repeat another row's seed for "
              "seed (a variant where the mechanism never acts is its twin bit for bit) is shown "
              "once."]
    lines += ["", "| claim | source | verdict | seeds to decide | our baseline / the paper's "
              "(furthest configuration) |", "|---|---|---|---|---|"]
    for f in findings:
        needed = str(f.seeds_needed) if f.seeds_needed else \
            ("more than 1000 or unknown" if f.verdict == INCONCLUSIVE else "")
        baseline = "" if f.worst_baseline is None else \
            f"{f.worst_baseline[1]:.3f} / {f.worst_baseline[2]:.3f} ({f.worst_baseline[0]})"
        lines.append(f"| {f.claim['id']} | {f.claim['source']} | **{f.verdict}** | {needed} | "
                     f"{baseline} |")
    for f in findings:
        c = f.claim
        lines += ["", f"## {c['id']}: {f.verdict}", "", f"*Claim.* {' '.join(c['claim'].split())}",
                  "", f"*Source.* {c['source']}", "", f"*Paper.* {c['paper']}", ""]
        if "preset" in c:
            lines += [f"*Preset.* `{c['preset']}` (rule `{c['rule']}`" +
                      (f", margin {c['margin']:g}" if "margin" in c else "") + ")" +
                      _preset_facts(results / c["preset"] / "preset.json"), ""]
        if "note" in c:
            lines += [f"*Note.* {' '.join(c['note'].split())}", ""]
        if f.fidelity:
            lines += ["*Baseline against the paper's own.*", ""] + \
                [f"- {text}" for text in f.fidelity] + [""]
        elif "preset" in c and f.verdict != UNTESTABLE:
            lines += ["*Baseline against the paper's own.* Not checked: the claim names no "
                      "baseline number of the paper (`reproduce`).", ""]
        if f.preconditions:
            lines += ["*Can the mechanism act here?*", ""] + \
                [f"- {text}" for text in f.preconditions] + [""]
        if f.ours and c.get("rule") == "accounting":
            check = c["accounting"]["check"]
            lines += [f"*The computation* (`{accounting.module_of(check)}`, check "
                      f"`{check}`).", ""] + [f"- {text}" for text in f.ours] + [""]
        elif f.ours and c.get("rule") == "benchmark":
            lines += [f"*The measurement* (`dpclip.reporting.benchmarks`, check "
                      f"`{c['benchmark']['check']}`, `{c['benchmark']['file']}`).", ""] \
                + [f"- {text}" for text in f.ours] + [""]
        elif f.ours:
            lines += ["*Ours* (difference: method minus baseline, mean [95% interval]).", ""] + \
                [f"- {text}" for text in f.ours] + [""]
        if f.ablation:
            lines += ["*Ablation* (descriptive, no verdict).", ""] + \
                [f"- {text}" for text in f.ablation] + [""]
        if (figures or {}).get(c["id"]):
            lines += [f"![{c['id']}]({figures[c['id']]})", ""]
        lines += [f"*Verdict.* **{f.verdict}**: {f.reason}."]
    return "\n".join(lines) + "\n"


def write_evidence(claims_path: Path, results: Path, out: Path, command: str) -> list[Finding]:
    """Write the verdict report as Markdown at ``out`` and as HTML beside it, with a figure per
    tested claim in ``<out stem>/`` (the method and its baselines, mean and 95% interval)."""
    import markdown

    findings = evidence(claims_path, results)
    figures = {}
    for f in findings:
        if f.verdict == UNTESTABLE or not f.rows:
            continue
        metric = f.claim["metric"] + (" range over the variants"
                                      if f.claim["rule"] == "smaller_spread" else "")
        name = f"{out.stem}/{f.claim['id']}.png"
        if claim_figure(out.parent / name, f.rows, f.compared_method, metric,
                        f"{f.claim['id']}: {f.verdict}"):
            figures[f.claim["id"]] = name
    lead = lead_lines(claims_path, results, out)
    drawn = set(figures.values()) | {f"{out.stem}/{spec['id']}.png"
                                     for spec in load_mechanisms(claims_path)}
    for stale in sorted((out.parent / out.stem).glob("*.png")):  # a claim no longer drawn
        if f"{out.stem}/{stale.name}" not in drawn:
            stale.unlink()
    text = evidence_markdown(findings, results, command, figures, lead)
    write_text(out, text)
    body = markdown.markdown(text, extensions=["tables"])
    write_text(out.with_suffix(".html"), "<!doctype html><meta charset='utf-8'>"
               "<title>dpclip evidence</title><style>body{font-family:sans-serif;max-width:"
               "60em;margin:auto}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
               f"padding:2px 6px}}</style>{body}")
    return findings

