"""evaluate: utility, calibration and membership inference of one trained configuration.

Members are the records the run actually trained on (its partition of target train);
non-members are the target holdout, which is also the utility test set. Two attacks: the loss
threshold on the output, and (``evaluate.ir_attack``) one classifier per layer on its
intermediate representations. Writes ``metrics/<run>.json`` (the metrics contract), ROC,
reliability and per-layer IR-attack CSVs for ``dvc plots``, and PNG figures.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pandas as pd
import torch

from dpclip.attacks import attack_every_layer, layer_representations
from dpclip.config import Params, run_name
from dpclip.errors import DpclipError
from dpclip.io import read_json, write_csv_frame, write_json
from dpclip.layout import Layout
from dpclip.metrics import attack_metrics, calibration_metrics, dp_bound_check, reliability_bins
from dpclip.plots import (clip_figure, early_stopping_figure, layer_attack_figure,
                          reliability_figure, roc_figure)
from dpclip.stages.partition import load_partition
from dpclip.stages.prepare import load_split
from dpclip.stages.train import load_model

log = logging.getLogger(__name__)


@torch.no_grad()
def predict(model: torch.nn.Module, x: np.ndarray, batch: int = 2048) -> np.ndarray:
    """Class probabilities, in batches."""
    outs = [torch.softmax(model(torch.as_tensor(x[i:i + batch])), dim=1)
            for i in range(0, len(x), batch)]
    return torch.cat(outs).double().numpy()


def per_sample_loss(probs: np.ndarray, y: np.ndarray) -> np.ndarray:
    return -np.log(np.clip(probs[np.arange(len(y)), y], 1e-12, 1.0))


def _finite_or_none(value):
    return None if value is None or (isinstance(value, float) and not math.isfinite(value)) \
        else value


def clip_summary(trace: pd.DataFrame) -> dict:
    c = trace["clip_threshold"].dropna() if "clip_threshold" in trace else pd.Series([], float)
    if c.empty:
        return {"c_initial": None, "c_final": None, "c_median": None}
    return {"c_initial": float(c.iloc[0]), "c_final": float(c.iloc[-1]),
            "c_median": float(c.median())}


def evaluate(params: Params, method: str, epsilon, alpha, seed: int,
             layout: Layout = Layout()) -> dict:
    run = run_name(method, epsilon, alpha, seed)
    record_path = layout.run_dir(run) / "record.json"
    if not record_path.exists():
        raise DpclipError(f"run {run!r} has no trained model at {str(record_path)!r}: run the "
                          f"train stage first")
    record = read_json(record_path)
    model = load_model(layout, run)
    x_train, y_train, _ = load_split(layout, "target_train")
    members = load_partition(layout, alpha)["positions"]
    x_out, y_out, _ = load_split(layout, "target_holdout")

    probs_out = predict(model, x_out)
    probs_in = predict(model, x_train[members])
    utility = calibration_metrics(probs_out, y_out, params.evaluate.ece_bins)
    # loss-threshold attack: a lower loss means "member", so the score is -loss
    attack = attack_metrics(-per_sample_loss(probs_in, y_train[members]),
                            -per_sample_loss(probs_out, y_out))
    roc = attack.pop("roc")
    privacy = record["privacy"]
    if privacy.get("epsilon") is not None and privacy.get("dp_guarantee"):
        check = dp_bound_check(roc["fpr"], roc["tpr"], attack["n_members"],
                               attack["n_nonmembers"], privacy["epsilon"], privacy["delta"])
        attack["dp_bound"] = check
        if check["violated"]:
            log.error("PRIVACY BUG in %s: the loss attack beats the DP bound TPR <= e^eps FPR + "
                      "delta at %d ROC points (max excess %.4f)", run,
                      check["violating_points"], check["max_excess"])
    trace = pd.read_csv(layout.trace(run))
    metrics = {
        "run": run, "dataset": record["dataset"], "method": method,
        "alpha": record["alpha"], "seed": record["seed"],
        "privacy": {k: _finite_or_none(v) for k, v in privacy.items()},
        "utility": utility, "mia": {"loss": attack}, "clip": clip_summary(trace),
        "time": {k: v for k, v in record["time"].items() if k != "device"},
        "training": record["training"], "device": record["time"].get("device"),
    }
    if params.evaluate.ir_attack:
        metrics["mia"]["ir"] = ir_attack(params, model, x_train[members], x_out)
        _write_ir_plots(layout, run, metrics["mia"]["ir"])
    _write_plots(layout, run, roc, probs_out, y_out, params.evaluate.ece_bins, trace, metrics)
    write_json(layout.metrics(run), metrics)
    return metrics


def ir_attack(params: Params, model: torch.nn.Module, x_members: np.ndarray,
              x_nonmembers: np.ndarray) -> dict:
    """Layer-wise membership inference on intermediate representations (METHODS.md,
    evaluation): per layer, a classifier of members vs non-members scored on held-out folds;
    accuracy and AUC per layer and the peak over layers."""
    a = params.attack
    reps_in = layer_representations(model, x_members, a.max_features)
    reps_out = layer_representations(model, x_nonmembers, a.max_features)
    results = attack_every_layer(reps_in, reps_out, classifier=a.classifier, evaluation="cv",
                                 folds=a.folds, max_records=a.max_records, seed=params.data.seed)
    layers = {name: {k: r[k] for k in ("accuracy", "auc", "features")}
              for name, r in results.items()}
    peak = max(layers, key=lambda n: layers[n]["accuracy"])
    return {"layers": layers, "peak_accuracy": layers[peak]["accuracy"], "peak_layer": peak,
            "peak_auc": max(v["auc"] for v in layers.values()), "classifier": a.classifier,
            "folds": a.folds, "n_each": results[peak]["n_each"]}


def _write_ir_plots(layout: Layout, run: str, ir: dict) -> None:
    frame = pd.DataFrame([{"layer": name, **values} for name, values in ir["layers"].items()])
    write_csv_frame(layout.ir_attack(run), frame)
    layer_attack_figure(layout.figures(run) / "ir_mia.png", ir["layers"],
                        title=f"IR-level MIA per layer: {run} (peak {ir['peak_accuracy']:.3f} "
                              f"at {ir['peak_layer']})")


def _write_plots(layout, run, roc, probs, labels, n_bins, trace, metrics) -> None:
    write_csv_frame(layout.roc(run), pd.DataFrame({"fpr": roc["fpr"], "tpr": roc["tpr"]}))
    bins = reliability_bins(probs.max(axis=1), probs.argmax(axis=1) == labels, n_bins)
    frame = pd.DataFrame({k: bins[k] for k in ("lower", "upper", "count", "confidence",
                                               "accuracy")})
    frame["bin_center"] = (frame["lower"] + frame["upper"]) / 2
    write_csv_frame(layout.reliability(run), frame)
    folder = layout.figures(run)
    title = f"{run} (acc {metrics['utility']['accuracy']:.3f})"
    roc_figure(folder / "roc.png", {run: roc}, title=f"Loss-attack ROC: {title}")
    reliability_figure(folder / "reliability.png", frame, metrics["utility"]["ece"], title)
    clip_figure(folder / "clip_threshold.png", {run: trace}, title=f"C_t: {run}")
    if "monitored_std" in trace:
        series = "sanitized-output std" if metrics["method"] == "sanitize" else \
            "public head-input std"
        early_stopping_figure(folder / "early_stopping.png", trace,
                              title=f"Early-stopping series by epoch: {run}", series=series)
