"""evaluate: utility, calibration and membership inference of one trained configuration.

Utility and calibration on the whole target holdout; membership on class-matched members and
non-members (:mod:`dpclip.attacks.common.membership`) by every attack of ``attack.kinds`` and
the per-layer IR attack, each ROC checked against the run's DP bound
(:func:`dpclip.metrics.dp_bound_check`; a certified violation is logged as a PRIVACY BUG).
See docs/attacks.md, "Membership evaluation", and docs/pipeline.md for the files it writes.
"""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import torch

from dpclip.summaries import filed
from dpclip.pipeline.inputs import load_model
from dpclip.stage_outputs import (load_partition, load_signals, load_split, population_source,
                                  public_population)
from dpclip.attacks import (AttackEvidence, ReferenceEvidence, baseline_attack, get_attack,
                            headline_attack)
from dpclip.attacks import build as build_attack
from dpclip.attacks.common.layerwise import attack_every_layer
from dpclip.attacks.common.membership import (class_matched_indices, evaluation_seed,
                                              label_only_auc)
from dpclip.attacks.common.representations import layer_representations
from dpclip.attacks.common.signals import unseen_fit
from dpclip.config import Params
from dpclip.errors import DpclipError
from dpclip.files import read_json, write_csv_frame, write_json
from dpclip.layout import Layout
from dpclip.run_keys import RunKey, alpha_tag
from dpclip.metrics import (RUN_CONFIDENCE, attack_metrics, calibration_metrics, classifier_auc,
                            dp_bound_check, dp_bound_unchecked, family_confidence,
                            reliability_bins, roc_points, strongest_attack)
from dpclip.methods import get_method
from dpclip.models import logits_of, parameterised_layers
from dpclip.reporting.plots import (clip_figure, controller_figure, early_stopping_figure,
                                    layer_attack_figure, reliability_figure, roc_figure)
from dpclip.catalog import BY_NAME
from dpclip.pipeline import provenance
from dpclip.threads import use_threads

log = logging.getLogger(__name__)


STAGE = BY_NAME["evaluate"]


def softmax(logits: np.ndarray) -> np.ndarray:
    """Class probabilities from logits (n, C), in float64."""
    return torch.softmax(torch.as_tensor(logits), dim=1).double().numpy()


def public_accuracy(layout: Layout, model: torch.nn.Module) -> float | None:
    """Accuracy on the public shadow holdout when it is drawn from the same data set as the
    members (None otherwise, or when it is empty): a score a choice between runs can read
    without reading private records (``dpclip advise --rank-on public``)."""
    if read_json(layout.prepared_meta).get("shadow_dataset") is not None:
        return None
    x, y, _ = load_split(layout, "shadow_holdout")
    if len(x) == 0:
        return None
    return float((logits_of(model, x).argmax(1) == y).mean())


def clip_summary(trace: pd.DataFrame) -> dict:
    c = trace["clip_threshold"].dropna() if "clip_threshold" in trace else pd.Series([], float)
    if c.empty:
        return {"c_initial": None, "c_final": None, "c_median": None, **clamp_activity(trace)}
    return {"c_initial": float(c.iloc[0]), "c_final": float(c.iloc[-1]),
            "c_median": float(c.median()), **clamp_activity(trace)}


def clamp_activity(trace: pd.DataFrame) -> dict:
    """How often a clamped controller's clamp set C_t (docs/methods.md, "Traces"), from the
    trace's cumulative ``<p>_clamp_hits_min`` / ``_max`` and its ``<p>_zeta``, present exactly
    at the controller's updates (``ww_dp_sgd``): ``clamp_hits_min``, ``clamp_hits_max`` (at
    the last step), ``clamp_updates`` and ``clamp_share`` = (hits_min + hits_max) / updates;
    all None for a method without such a controller."""
    none = {"clamp_hits_min": None, "clamp_hits_max": None, "clamp_updates": None,
            "clamp_share": None}
    prefixes = [col[:-len("_clamp_hits_min")] for col in trace.columns
                if col.endswith("_clamp_hits_min")]
    if len(prefixes) != 1 or trace.empty:
        return none
    prefix = prefixes[0]
    hits = {side: int(trace[f"{prefix}_clamp_hits_{side}"].iloc[-1]) for side in ("min", "max")}
    updates = int(trace[f"{prefix}_zeta"].notna().sum()) if f"{prefix}_zeta" in trace else 0
    return {"clamp_hits_min": hits["min"], "clamp_hits_max": hits["max"],
            "clamp_updates": updates,
            "clamp_share": (hits["min"] + hits["max"]) / updates if updates else None}


def evaluate(params: Params, method: str, epsilon, alpha, seed: int,
             layout: Layout = Layout()) -> dict:
    key = RunKey(method, epsilon, alpha, int(seed))
    run = key.name
    record_path = layout.run_dir(run) / "record.json"
    if not record_path.exists():
        raise DpclipError(f"run {run!r} has no trained model at {str(record_path)!r}: run the "
                          f"train stage first")
    inputs = provenance.inputs(STAGE, params, key, layout)
    use_threads(params.train.threads)
    record = read_json(record_path)
    model = load_model(layout, run)
    x_train, y_train, _ = load_split(layout, "target_train")
    members = load_partition(layout, alpha)["positions"]
    x_in, y_in = x_train[members], y_train[members]
    x_out, y_out, _ = load_split(layout, "target_holdout")

    holdout_logits = logits_of(model, x_out)
    probs_out = softmax(holdout_logits)
    utility = calibration_metrics(probs_out, y_out, params.evaluate.ece_bins)
    utility["auc"] = classifier_auc(probs_out, y_out)  # the papers' tabular utility metric
    utility["public_accuracy"] = public_accuracy(layout, model)
    # membership: class-matched members and non-members, the same sets for every attack
    game_seed = evaluation_seed(params.data.seed, f"{alpha_tag(alpha)}-seed{int(seed)}")
    rng = np.random.default_rng(game_seed)
    pick_in, pick_out = class_matched_indices(y_in, y_out, rng)
    signals = load_signals(layout, run)
    x_attacked_in = x_in[pick_in]  # every attack sees the same records: members first
    evidence = AttackEvidence(
        x=np.concatenate([x_attacked_in, x_out[pick_out]]),
        labels=np.concatenate([y_in[pick_in], y_out[pick_out]]),
        logits=np.concatenate([logits_of(model, x_attacked_in), holdout_logits[pick_out]]),
        model=model, references=None if signals is None else reference_evidence(
            params, run, model, signals, pick_in, x_out, y_out, pick_out, layout))
    scores, not_run = run_attacks(params, evidence, len(pick_in), seed=game_seed + 1)
    privacy = record["privacy"]
    # the run's flag ORs its checks (each record-level attack, each IR layer): each gets its
    # share of the 5%
    checks = len(scores) + (len(parameterised_layers(model)) if params.evaluate.ir_attack else 0)
    confidence = family_confidence(checks)
    mia, rocs = {}, {}
    for name, (member_scores, nonmember_scores) in scores.items():
        mia[name] = attack_metrics(member_scores, nonmember_scores)
        rocs[name] = mia[name].pop("roc")
        mia[name]["dp_bound"] = checked_bound(
            run, name, rocs[name]["fpr"], rocs[name]["tpr"], mia[name]["n_members"],
            mia[name]["n_nonmembers"], privacy, confidence)
    headline = headline_attack(params.attack)  # chosen in advance, not the best of the run
    if headline in mia:
        mia["headline"] = {"attack": headline, "auc": mia[headline]["auc"],
                           "low_fpr": mia[headline]["low_fpr"]["fpr"],
                           "tpr_at_low_fpr": mia[headline]["low_fpr"]["tpr"],
                           "tpr_at_zero_fp": mia[headline]["tpr_at_zero_fp"],
                           "n_nonmembers": mia[headline]["n_nonmembers"]}
    if signals is not None:
        mia["references"] = {**signals["facts"], "match": reference_match(
            privacy, len(y_in), signals, holdout_logits, y_out)}
    if not_run:
        mia["not_run"] = not_run
    mia.update({
        "label_only": {"auc": label_only_auc(y_in[pick_in], y_out[pick_out]),
                       "auc_unmatched": label_only_auc(y_in, y_out)},
        "matching": {"n_members": int(len(pick_in)), "n_nonmembers": int(len(pick_out)),
                     "class_matched": True, "members_available": int(len(y_in)),
                     "holdout_available": int(len(y_out))},
        "dp_bound_family": {"checks": checks, "confidence": RUN_CONFIDENCE,
                            "confidence_each": confidence}})
    _write_scores(layout, run, scores, members[pick_in], y_in[pick_in], pick_out,
                  y_out[pick_out])
    trace = pd.read_csv(layout.trace(run))
    metrics = {
        "run": run, "dataset": record["dataset"],
        "dataset_id": read_json(layout.prepared_meta)["dataset_id"], "method": method,
        "alpha": record["alpha"], "seed": record["seed"],
        "privacy": {k: None if isinstance(v, float) and not math.isfinite(v) else v
                    for k, v in privacy.items()},
        "utility": utility, "mia": mia, "clip": clip_summary(trace),
        "training": record["training"], "device": record["device"],
    }
    if layout.audit(run).exists():  # the audit stage's lower bounds (audit.<kind>)
        metrics["audit"] = read_json(layout.audit(run))
    if params.evaluate.ir_attack:
        same_records = copy.deepcopy(rng)  # the train-scored attack subsamples the same records
        metrics["mia"]["ir"] = ir_attack(params, model, x_attacked_in, y_in[pick_in],
                                         x_out[pick_out], y_out[pick_out], rng, privacy, run,
                                         confidence)
        _write_ir_plots(layout, run, metrics["mia"]["ir"])
        if params.evaluate.ir_train_scoring:
            metrics["mia"]["ir_train"] = ir_attack(
                params, model, x_attacked_in, y_in[pick_in], x_out[pick_out], y_out[pick_out],
                same_records, evaluation="train")
    _write_plots(layout, run, rocs, probs_out, y_out, params.evaluate.ece_bins, trace, metrics,
                 baseline_attack().name)
    write_json(layout.metrics(run), metrics)
    write_json(layout.summary(run), run_summary(metrics))
    provenance.record(STAGE, layout, key, inputs)
    return metrics


def _read_only(array):
    if array is not None:
        array.setflags(write=False)
    return array


def shuffled(evidence: AttackEvidence, order: np.ndarray) -> AttackEvidence:
    """The same evidence with its records in ``order`` (the reference models' arrays too),
    every array read-only: one attack cannot change what the next one sees."""
    ref = evidence.references
    if ref is not None:
        ref = replace(ref, logits=_read_only(ref.logits[:, order]),
                      inside=None if ref.inside is None else _read_only(ref.inside[:, order]),
                      population_labels=_read_only(np.array(ref.population_labels)),
                      population_logits=_read_only(np.array(ref.population_logits)),
                      population_reference_logits=_read_only(
                          np.array(ref.population_reference_logits)))
    return replace(evidence, x=_read_only(evidence.x[order]),
                   labels=_read_only(evidence.labels[order]),
                   logits=_read_only(evidence.logits[order]), references=ref)


def run_attacks(params: Params, evidence: AttackEvidence, n_members: int, seed: int
                ) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, str]]:
    """Every attack of ``attack.kinds`` on the same evidence, whose first ``n_members``
    records are the members: the attacks see the records in an order shuffled with ``seed``
    (no attack can tell a member by its position), and their scores come back split into the
    members' and the non-members'. Also the attacks not run, with why (one that needs
    reference models on a run without them)."""
    order = np.random.default_rng(seed).permutation(len(evidence.labels))
    seen = shuffled(evidence, order)
    scores, not_run = {}, {}
    for name in params.attack.kinds:
        attack = build_attack(name, params.attack)
        if attack.needs_references and evidence.references is None:
            not_run[name] = ("needs reference models: this run has none (attack.references is "
                             "0, or the reference stage has not run)")
            continue
        # its own copy of the model: an attack that trains or changes it changes nothing else
        given = np.asarray(attack.scores(replace(seen, model=copy.deepcopy(seen.model))),
                           dtype=np.float64)
        if given.shape != (len(order),) or not np.isfinite(given).all():
            raise DpclipError(f"attack {name!r} returned scores of shape {given.shape} "
                              f"(finite: {bool(np.isfinite(given).all())}), not "
                              f"{len(order)} finite numbers, one per record")
        values = np.empty_like(given)
        values[order] = given  # back in the evidence's order: members first
        scores[name] = (values[:n_members], values[n_members:])
    return scores, not_run


def reference_evidence(params: Params, run: str, model: torch.nn.Module, signals: dict,
                       pick_in: np.ndarray, x_out: np.ndarray, y_out: np.ndarray,
                       pick_out: np.ndarray, layout: Layout) -> ReferenceEvidence:
    """The run's reference models (:mod:`dpclip.stages.reference`) on the attacked records:
    the members at positions ``pick_in`` of the run's members, then the non-members at
    positions ``pick_out`` of the holdout ``x_out``; and on the population (the holdout
    online, the public population offline)."""
    a, facts = params.attack, signals["facts"]
    online = facts["mode"] == "online"
    pop_x, pop_y = (x_out, y_out) if online else public_population(params, layout)
    if (facts["mode"], facts["population"]) != (a.mode, population_source(params)) or \
            signals["logits_population"].shape[1] != len(pop_x):
        raise DpclipError(f"references/{run} were made for attack.mode {facts['mode']!r} and "
                          f"the population {facts['population']!r} "
                          f"({signals['logits_population'].shape[1]} records), not for "
                          f"{a.mode!r} and {population_source(params)!r} ({len(pop_x)}): "
                          f"run the reference stage again")
    return ReferenceEvidence(
        logits=np.concatenate([signals["logits_members"][:, pick_in],
                               signals["logits_holdout"][:, pick_out]], axis=1),
        inside=np.concatenate([signals["in_members"][:, pick_in],
                               signals["in_holdout"][:, pick_out]], axis=1) if online else None,
        population_labels=pop_y, population_logits=logits_of(model, pop_x),
        population_reference_logits=signals["logits_population"])


def reference_match(privacy: dict, n_members: int, signals: dict, target_holdout_logits,
                    y_out: np.ndarray) -> dict:
    """The target's (n, q, T, sigma) beside its reference models' and whether they agree, and
    how each fits records it did not train on (the holdout: :func:`unseen_fit`), so a reader
    can check that the attack's reference models are as strong as the target."""
    models = signals["facts"]["models"]
    target = {"n_train": n_members, "sample_rate": privacy.get("sample_rate"),
              "steps": privacy.get("steps"), "noise_multiplier": privacy.get("noise_multiplier")}
    references = {key: [m.get(key) for m in models] for key in target}

    def same(key):
        return all(v is not None and target[key] is not None and
                   math.isclose(float(v), float(target[key]), rel_tol=1e-9, abs_tol=1e-12)
                   for v in references[key])

    return {"target": {**target, **{f"unseen_{k}": v for k, v in unseen_fit(
                target_holdout_logits, y_out).items() if k != "phi_correlation"}},
            "references": {**references, **{f"unseen_{k}": v for k, v in unseen_fit(
                signals["logits_holdout"], y_out, signals["in_holdout"]).items()}},
            "matched": {key: same(key) for key in target}}


def run_summary(metrics: dict) -> dict:
    """The scalars git tracks for a run (``summary/<run>.json``, DVC's ``metrics:``; the keys:
    docs/pipeline.md, "The metrics contract"), filed under the data's identity
    (:mod:`dpclip.summaries`). Flags are booleans, as DVC compares numbers; epsilon is null
    without a DP claim."""
    privacy = metrics["privacy"]
    summary = {"epsilon": privacy["epsilon"], "dp_guarantee": bool(privacy["dp_guarantee"]),
               "adjacency_add_remove": privacy.get("adjacency", "add_remove") == "add_remove",
               "accuracy": metrics["utility"]["accuracy"], "ece": metrics["utility"]["ece"]}
    strongest = strongest_attack(metrics["mia"])
    if strongest is not None:
        summary.update({"strongest_auc": strongest[1]["auc"],
                        "strongest_tpr_at_fpr_0.1pct": strongest[1]["tpr_at_fpr_0.1pct"],
                        "strongest_tpr_at_fpr_1pct": strongest[1].get("tpr_at_fpr_1pct")})
        # a fixed-level TPR the non-members cannot support (fewer than 10 false positives
        # allowed) says so beside it
        summary.update({f"strongest_tpr_at_fpr_{level}_meaningful": strongest[1][key]
                        for level in ("0.1pct", "1pct")
                        if (key := f"tpr_at_fpr_{level}_meaningful") in strongest[1]})
    headline = metrics["mia"].get("headline")
    if headline:  # the attack chosen in advance (attack.headline), at its honest low FPR
        summary.update({"attack_auc": headline["auc"],
                        "attack_tpr_at_low_fpr": headline["tpr_at_low_fpr"],
                        "attack_low_fpr": headline["low_fpr"]})
    bounds = [kind.get("epsilon_lower_bound") for kind in (metrics.get("audit") or {}).values()
              if isinstance(kind, dict) and kind.get("epsilon_lower_bound") is not None]
    if bounds:
        summary["audit_epsilon_lower_bound"] = max(bounds)
    return filed(metrics.get("dataset_id") or metrics["dataset"], summary)


def checked_bound(run: str, attack: str, fpr: np.ndarray, tpr: np.ndarray, n_members: int,
                  n_nonmembers: int, privacy: dict, confidence: float = RUN_CONFIDENCE) -> dict:
    """The DP-bound check of one attack's ROC under the run's privacy record (``adjacency``
    missing = add_remove) at ``confidence``, or why it was not checked; logs a certified
    violation as an ERROR."""
    skipped = dp_bound_unchecked(privacy)
    if skipped is not None:
        return skipped
    check = dp_bound_check(fpr, tpr, n_members, n_nonmembers, float(privacy["epsilon"]),
                           float(privacy["delta"]), adjacency=privacy.get("adjacency"),
                           confidence=confidence)
    if check["violated"]:
        _log_violation(run, attack, check)
    return check


def _log_violation(run: str, attack: str, check: dict) -> None:
    at = check["worst_at"]
    log.error("PRIVACY BUG in %s: the %s attack beats the DP bound %s (adjacency %s: eps' = "
              "%.4g, delta' = %.3g) beyond the %.0f%% simultaneous band at %d ROC points; worst "
              "certified margin %.4f at FPR %.4f, TPR %.4f", run, attack, at["direction"],
              check["adjacency"], check["epsilon_used"], check["delta_used"],
              100 * check["confidence"], check["violating_points"], check["worst_margin"],
              at["fpr"], at["tpr"])


def ir_attack(params: Params, model: torch.nn.Module, x_members: np.ndarray,
              y_members: np.ndarray, x_nonmembers: np.ndarray, y_nonmembers: np.ndarray,
              rng: np.random.Generator, privacy: dict | None = None, run: str = "",
              confidence: float = RUN_CONFIDENCE, evaluation: str = "cv") -> dict:
    """Layer-wise membership inference on intermediate representations of the class-matched
    sets (subsampled with ``rng`` to ``attack.max_records`` a side): per layer, a classifier
    scored on held-out folds (``evaluation="train"``: on its own training records, unchecked);
    accuracy and AUC per layer, the peak, and with a DP claim in ``privacy`` each layer's
    DP-bound check at ``confidence`` (docs/attacks.md, "The DP-bound check")."""
    a = params.attack
    keep_in, keep_out = class_matched_indices(y_members, y_nonmembers, rng,
                                              max_per_side=a.max_records)
    reps_in = layer_representations(model, x_members[keep_in], a.max_features)
    reps_out = layer_representations(model, x_nonmembers[keep_out], a.max_features)
    results = attack_every_layer(reps_in, reps_out, classifier=a.classifier,
                                 evaluation=evaluation, folds=a.folds, max_records=a.max_records,
                                 seed=params.data.seed, return_scores=True)
    skipped = dp_bound_unchecked(privacy or {}) if evaluation == "cv" else {
        "checked": False, "reason": "scored on the classifier's own training records"}
    layers, checks = {}, {}
    for name, r in results.items():
        layers[name] = {k: r[k] for k in ("accuracy", "auc", "features")}
        if skipped is None:
            z, score = r["membership"], r["scores"]
            fpr, tpr = roc_points(score[z == 1], score[z == 0])
            checks[name] = checked_bound(run, f"IR ({name})", fpr, tpr, int((z == 1).sum()),
                                         int((z == 0).sum()), privacy, confidence)
        layers[name]["dp_bound_margin"] = checks[name]["worst_margin"] if checks else None
    peak = max(layers, key=lambda n: layers[n]["accuracy"])
    if checks:
        worst = max(checks, key=lambda n: checks[n]["worst_margin"])
        bound = {**checks[worst], "layer": worst}
    else:
        bound = skipped
    return {"layers": layers, "peak_accuracy": layers[peak]["accuracy"], "peak_layer": peak,
            "peak_auc": max(v["auc"] for v in layers.values()), "classifier": a.classifier,
            "folds": a.folds, "evaluation": evaluation, "n_each": results[peak]["n_each"],
            "dp_bound": bound}


def _write_ir_plots(layout: Layout, run: str, ir: dict) -> None:
    frame = pd.DataFrame([{"layer": name, **values} for name, values in ir["layers"].items()])
    write_csv_frame(layout.ir_attack(run), frame)
    layer_attack_figure(layout.figures(run) / "ir_mia.png", ir["layers"],
                        title=f"IR-level MIA per layer: {run} (peak {ir['peak_accuracy']:.3f} "
                              f"at {ir['peak_layer']})")


def _write_scores(layout: Layout, run: str, scores: dict, member_positions: np.ndarray,
                  member_labels: np.ndarray, holdout_positions: np.ndarray,
                  holdout_labels: np.ndarray) -> None:
    """Every attack's score of every attacked record (higher = member), by split and position:
    the data owner's per-record view (which records leak); never logged to MLflow."""
    frame = pd.DataFrame({
        "split": ["target_train"] * len(member_positions) + ["target_holdout"] *
        len(holdout_positions),
        "position": np.concatenate([member_positions, holdout_positions]),
        "label": np.concatenate([member_labels, holdout_labels]),
        "member": np.r_[np.ones(len(member_positions), int), np.zeros(len(holdout_positions), int)],
        **{name: np.concatenate(pair) for name, pair in scores.items()}})
    write_csv_frame(layout.attack_scores(run), frame)


def _write_plots(layout, run, rocs, probs, labels, n_bins, trace, metrics, baseline) -> None:
    write_csv_frame(layout.roc(run), pd.concat(
        [pd.DataFrame({"attack": name, "fpr": roc["fpr"], "tpr": roc["tpr"]})
         for name, roc in rocs.items()], ignore_index=True))
    bins = reliability_bins(probs.max(axis=1), probs.argmax(axis=1) == labels, n_bins)
    frame = pd.DataFrame({k: bins[k] for k in ("lower", "upper", "count", "confidence",
                                               "accuracy")})
    frame["bin_center"] = (frame["lower"] + frame["upper"]) / 2
    write_csv_frame(layout.reliability(run), frame)
    folder = layout.figures(run)
    title = f"{run} (acc {metrics['utility']['accuracy']:.3f})"
    check = metrics["mia"][baseline]["dp_bound"]
    bound = (check["epsilon_used"], check["delta_used"]) if check["checked"] else None
    roc_figure(folder / "roc.png", {get_attack(n).label: r for n, r in rocs.items()},
               title=f"Membership-attack ROC: {title}", bound=bound)
    reliability_figure(folder / "reliability.png", frame, metrics["utility"]["ece"], title)
    clip_figure(folder / "clip_threshold.png", {run: trace}, title=f"C_t: {run}")
    if "ww_zeta" in trace:
        controller_figure(folder / "controller.png", {run: trace},
                          title=f"WW-DP-SGD's controller at its probes: {run}")
    if "monitored_std" in trace:
        series = get_method(metrics["method"]).early_stopping_series
        early_stopping_figure(folder / "early_stopping.png", trace,
                              title=f"Early-stopping series by epoch: {run}", series=series)


def describe(metrics: dict, layout: Layout) -> str:
    """The line ``dpclip evaluate`` prints: accuracy, ECE, the loss attack's AUC, peak IR."""
    ir = metrics["mia"].get("ir")
    peak = f" peak_ir_mia={ir['peak_accuracy']:.4f} ({ir['peak_layer']})" if ir else ""
    return (f"accuracy={metrics['utility']['accuracy']:.4f} ece={metrics['utility']['ece']:.4f} "
            f"loss attack AUC={metrics['mia']['loss']['auc']:.4f}{peak}")
