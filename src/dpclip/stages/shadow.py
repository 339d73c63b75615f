"""shadow: per-layer membership-inference risk from a shadow model on public data (LM-DP-SGD:
Meng et al., "Mitigating Membership Inference in Intermediate Representations via Layer-wise
MIA-risk-aware DP-SGD", Algorithm 2).

The target architecture, trained without privacy on the public shadow train split: one
membership classifier per layer on its intermediate representations gives the layer's error
rate ER^(l) (its risk), and the per-layer gradient-norm shares mean_i n_i^(l) / n_i over its
members under its trained weights feed ``lm_dp_sgd``'s ``public`` weights. Trains only when
a configured method reads the risk. See docs/methods.md, "The shadow stage", and
docs/pipeline.md for what it writes.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch import nn

from dpclip.stage_outputs import architecture, load_split
from dpclip.attacks.common.layer_risk import layer_risks
from dpclip.config import IID, EarlyStopping, Params
from dpclip.data.splits import dirichlet_subsample
from dpclip.errors import DpclipError
from dpclip.files import read_json, write_json, write_torch
from dpclip.layout import Layout
from dpclip.methods import get_method
from dpclip.methods.base import REGISTRY
from dpclip.run_keys import alpha_tag
from dpclip.reporting.plots import layer_attack_figure
from dpclip.catalog import BY_NAME
from dpclip.pipeline import provenance
from dpclip.pipeline.provenance import shadow_key
from dpclip.threads import use_threads
from dpclip.train import TrainConfig, train_model

log = logging.getLogger(__name__)


def shadow_batch_size(asked: int, n_records: int) -> int:
    """``shadow.batch_size``, or a quarter of the shadow model's training set (four steps an
    epoch) where it asks for more records than there are: small public data still gives a
    shadow model, and the notice says so."""
    if asked <= n_records:
        return asked
    used = max(1, n_records // 4)
    log.warning("shadow.batch_size: %d is larger than the shadow model's training set (%d "
                "public records): using %d, a quarter of them", asked, n_records, used)
    return used


def shadow_config(params: Params, batch_size: int | None = None) -> TrainConfig:
    """The target architecture and optimizer, trained without privacy (public data: no early
    stopping, seeded noise) on the CPU for the shadow section's epochs and batch size."""
    s = params.shadow
    # no public_init: the shadow model trains on public records already, and its members and
    # non-members are the public splits a pre-training would read
    train = params.train.model_copy(update={"epochs": s.epochs,
                                            "batch_size": batch_size or s.batch_size,
                                            "device": "cpu", "early_stopping": EarlyStopping(),
                                            "public_init": False})
    privacy = params.privacy.model_copy(update={"secure_noise": False})
    return TrainConfig("non_private", None, s.seed, train, privacy)


def _shadow_members(params: Params, y: np.ndarray, n_classes: int) -> np.ndarray:
    alpha = params.shadow.alpha
    if alpha == IID:
        positions = np.arange(len(y))
    else:
        positions, _ = dirichlet_subsample(y, n_classes, float(alpha), params.shadow.seed)
    return _at_most(positions, params.shadow.max_records, params.shadow.seed)


def _at_most(positions: np.ndarray, limit: int | None, seed: int) -> np.ndarray:
    """A seeded subset of ``limit`` positions (in their order), or all when fewer: the full
    public split costs minutes on real data for a risk estimate of the same kind
    (``shadow.max_records`` in docs/parameters.md)."""
    if limit is None or len(positions) <= limit:
        return positions
    pick = np.random.default_rng([seed, 7]).choice(len(positions), size=limit, replace=False)
    return positions[np.sort(pick)]


STAGE = BY_NAME["shadow"]


def not_needed(layout: Layout) -> dict:
    """Write a risk file that says why there is no shadow model, and remove the outputs of an
    earlier one (nothing may pass for current). The record does not name the configured
    methods: the tune stage hashes it, and adding a method that does not read it must leave the
    searches done current."""
    for name in ("model.pt", "risk.png", "provenance.json"):
        (layout.shadow / name).unlink(missing_ok=True)
    needing = sorted(name for name, cls in REGISTRY.items() if cls.needs_shadow_risk)
    record = {"needed": False, "reason": f"no configured method reads the shadow risk (those "
                                         f"that do: {needing})"}
    write_json(layout.shadow_risk, record)
    return record


def shadow(params: Params, layout: Layout = Layout(), progress: bool = True,
           force: bool = False) -> dict:
    """The shadow model's per-layer risk (module docstring), when a configured method reads
    it; else a risk file saying it was not needed. A shadow model made from the same inputs
    (its provenance: :mod:`dpclip.pipeline.provenance`) is kept unless ``force``."""
    if not any(get_method(m).needs_shadow_risk for m in params.train.methods):
        return not_needed(layout)
    key = shadow_key(params)
    reused = None if force else provenance.reuse(STAGE, params, key, layout)
    if reused is not None:
        return {**reused, "kept": True}  # "kept": for the command's line, not in the file
    inputs = provenance.inputs(STAGE, params, key, layout)
    record = train_shadow(params, layout, progress)
    provenance.record(STAGE, layout, key, inputs)
    return record


def train_shadow(params: Params, layout: Layout, progress: bool) -> dict:
    use_threads(params.train.threads)
    meta = read_json(layout.prepared_meta)
    x_in, y_in, _ = load_split(layout, "shadow_train")
    x_out, _, _ = load_split(layout, "shadow_holdout")
    for name, x in (("shadow_train", x_in), ("shadow_holdout", x_out)):
        if len(x) == 0:
            raise DpclipError(f"the shadow stage needs public data, but the {name} split is "
                              f"empty (data.split.{name} = "
                              f"{getattr(params.data.split, name)})")
    members = _shadow_members(params, y_in, int(meta["n_classes"]))
    x_in, y_in = x_in[members], y_in[members]
    x_out = x_out[_at_most(np.arange(len(x_out)), params.shadow.max_records,
                           params.shadow.seed + 1)]
    batch_size = shadow_batch_size(params.shadow.batch_size, len(x_in))
    result = train_model(x_in, y_in, tuple(meta["feature_shape"]), int(meta["n_classes"]),
                         shadow_config(params, batch_size), progress=progress, desc="shadow")
    model = result.model.eval()
    a = params.attack
    layers = layer_risks(model, x_in, y_in, x_out, classifier=a.classifier,
                         evaluation=params.shadow.risk_eval, folds=a.folds,
                         max_features=a.max_features, max_records=a.max_records,
                         seed=params.shadow.seed)
    record = {
        "needed": True,
        "architecture": architecture(params, meta), "layer_names": list(layers),
        "risk_eval": params.shadow.risk_eval, "classifier": a.classifier,
        "alpha": None if params.shadow.alpha == IID else params.shadow.alpha,
        "n_members": int(len(x_in)), "n_nonmembers": int(len(x_out)), "batch_size": batch_size,
        "shadow_accuracy": _accuracy(model, *load_split(layout, "shadow_holdout")[:2]),
        "layers": layers,
    }
    checkpoint = {"state_dict": model.state_dict(), "architecture": record["architecture"]}
    write_torch(layout.shadow / "model.pt", checkpoint)
    layer_attack_figure(layout.shadow / "risk.png", layers, metrics=("error_rate", "auc"),
                        title=f"shadow model: per-layer MIA error rate ER "
                              f"({record['risk_eval']}, alpha {alpha_tag(params.shadow.alpha)})")
    write_json(layout.shadow_risk, record)
    return record


@torch.no_grad()
def _accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    pred = model(torch.as_tensor(x, dtype=torch.float32)).argmax(dim=1).numpy()
    return float(np.mean(pred == y))


def describe(record: dict, layout: Layout) -> str:
    """The line ``dpclip shadow`` prints: the shadow model's accuracy and per-layer risks."""
    if not record.get("needed", True):
        return f"no shadow model: {record['reason']}"
    risks = ", ".join(f"{n} {v['error_rate']:.3f}" for n, v in record["layers"].items())
    kept = "up to date, kept: " if record.get("kept") else ""
    return (f"shadow model ({kept}holdout accuracy {record['shadow_accuracy']:.4f}): per-layer "
            f"MIA error rate ({record['risk_eval']}): {risks}")
