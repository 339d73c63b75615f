"""What one run trains from, resolved once: its members, the data's shape, its configuration
(with the values ``dpclip tune`` chose) and the public data it needs. The train stage, the
stages that train the run's configuration again (audit, reference) and provenance all take
this one resolution (:func:`run_inputs`); ``tuned/tuned.json`` is read once per run. The
training library (:mod:`dpclip.train`) gets only the :class:`~dpclip.train.TrainConfig` and
arrays, and reads no file. What the stages after training read of a run, its trained model
(:func:`load_model`), is here too: the stages before training import none of the training
code."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from dpclip.stage_outputs import load_partition, load_risk, load_split
from dpclip.config import Params
from dpclip.files import read_json
from dpclip.layout import Layout
from dpclip.methods import get_method
from dpclip.models import build_model, layer_names
from dpclip.run_keys import RunKey
from dpclip.train import PublicData, TrainConfig
from dpclip.train.runs import run_class
from dpclip.pipeline.tuned import tuned_values, with_values


def train_config(params: Params, method: str, epsilon, seed: int,
                 layout: Layout | None = None, tuned: bool | dict | None = True) -> TrainConfig:
    """The loop's configuration of one run. ``tuned``: True reads the values ``dpclip tune``
    chose for it when tuning is on (:mod:`dpclip.pipeline.tuned`); a mapping is those values
    already read (None or False: params.yaml's). A method that needs the shadow stage's risks
    gets them from ``layout``, checked against the model first."""
    layout = layout or Layout()
    values = tuned_values(params, layout, method, epsilon) if tuned is True else tuned or None
    if values:
        params = with_values(params, values)
    t = params.train
    risk = None
    if get_method(method).needs_shadow_risk:
        meta = read_json(layout.prepared_meta)
        risk = load_risk(layout, params, meta, layer_names(t.model, t.hidden,
                                                           meta["feature_shape"],
                                                           int(meta["n_classes"])))
    target = float(epsilon) if get_method(method).private else None
    options = get_method(method).resolved_options(params.method_options(method), params)
    return TrainConfig(method, target, int(seed), t, params.privacy, options, risk)


def load_public(layout: Layout) -> PublicData:
    """The public shadow splits: train, and holdout as the held-out check of public fitting."""
    x, y, _ = load_split(layout, "shadow_train")
    held_x, held_y, _ = load_split(layout, "shadow_holdout")
    return PublicData(x, y, (held_x, held_y))


@dataclass
class RunInputs:
    """What training one run reads: its members, the data's shape, its configuration and the
    public data it needs (the train stage, and the audit stage training it again)."""

    x: np.ndarray
    y: np.ndarray
    meta: dict
    cfg: TrainConfig
    public: PublicData | None
    tuned: dict | None = None  # the values dpclip tune chose (None: params.yaml's)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.meta["feature_shape"])

    @property
    def n_classes(self) -> int:
        return int(self.meta["n_classes"])


def run_inputs(params: Params, key: RunKey, layout: Layout) -> RunInputs:
    """The run resolved once: its tuned values (read here, the one read of the run), its
    configuration with them set, its members and the public data it needs."""
    x, y, _ = load_split(layout, "target_train")
    members = load_partition(layout, key.alpha)["positions"]
    tuned = tuned_values(params, layout, key.method, key.epsilon)
    cfg = replace(train_config(params, key.method, key.epsilon, key.seed, layout, tuned=tuned),
                  data_label=f"{params.data.as_written()} alpha={key.alpha}")
    return RunInputs(x[members], y[members], read_json(layout.prepared_meta), cfg,
                     load_public(layout) if needs_public(cfg) else None, tuned)


def needs_public(cfg: TrainConfig) -> bool:
    """Whether the run reads public data: a method's own use (a public pre-training) or early
    stopping's watched series."""
    method = get_method(cfg.method)
    return run_class(method.run_kind).needs_public_data(
        method.typed_options(cfg.method_options)) or \
        cfg.train.early_stopping.rule != "none" or cfg.train.public_init


def checkpoint_of(result, cfg: TrainConfig, meta: dict) -> dict:
    """What ``model.pt`` holds: the trained weights and the architecture that rebuilds them."""
    return {"state_dict": result.model.state_dict(),
            "architecture": {"model": cfg.train.model, "feature_shape": meta["feature_shape"],
                             "n_classes": meta["n_classes"], "hidden": list(cfg.train.hidden),
                             **result.architecture}}


def load_model(layout: Layout, run: str) -> torch.nn.Module:
    """The trained model of ``run`` for evaluation, as its run kind rebuilds it
    (``Run.rebuild_for_evaluation``)."""
    checkpoint = torch.load(layout.run_dir(run) / "model.pt", map_location="cpu",
                            weights_only=True)
    return evaluation_model(checkpoint, read_json(layout.run_dir(run) / "record.json")["method"])


def evaluation_model(checkpoint: dict, method_name: str) -> torch.nn.Module:
    """A checkpoint's model (:func:`checkpoint_of`) in evaluation mode, as its run kind rebuilds
    it (``Run.rebuild_for_evaluation``)."""
    arch = checkpoint["architecture"]
    method = get_method(method_name)
    model = build_model(arch["model"], tuple(arch["feature_shape"]), int(arch["n_classes"]),
                        list(arch["hidden"]))
    model = run_class(method.run_kind).rebuild_for_evaluation(model, arch)
    model.load_state_dict(checkpoint["state_dict"])
    return model.eval()
