"""The training entry point: :func:`build_run` seeds, builds the model and the method, plans
the steps and hands them to the run kind the method names (``Method.run_kind``,
:mod:`dpclip.train.runs`); :func:`train_model` resumes from a checkpoint when there is one and
returns the model, its trace and its privacy record. Every random draw comes from the run's
:class:`~dpclip.randomness.NoiseSources`, checkpointed with the rest of the state. The trace's
``train_loss`` and ``batch_size`` are computed from the private batch without noise
(:data:`~dpclip.trace_columns.PRIVATE_DIAGNOSTICS`): local, in MLflow only under
``tracking.private_diagnostics``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dpclip.errors import DpclipError
from dpclip.hashing import records_digest
from dpclip.methods import get_method
from dpclip.methods.base import MethodContext
from dpclip.models import as_model_input, build_model, count_parameters
from dpclip.pretraining import PUBLIC_PRETRAINING, pretrain
from dpclip.train.checkpoint import Checkpoint
from dpclip.train.runs import Run, run_class
from dpclip.train.setup import (PublicData, RunSetup, TrainConfig, TrainResult, resolve_device,
                                seed_everything)
from dpclip.train.book_keeping import LayerGroups


def build_run(feature_shape: tuple[int, ...], n_classes: int, n_records: int,
              cfg: TrainConfig, public: PublicData | tuple | None = None,
              model: nn.Module | None = None) -> Run:
    """Seed, build the model and method, plan the steps, and build the run of the method's
    kind (a private kind finds the noise). ``public``: the public data (:class:`PublicData`,
    or an (x, y) pair) a run kind may need (``Run.needs_public_data``) or early stopping
    watches. ``model``: a model of the caller's own (:mod:`dpclip.api`) instead of
    ``train.model``."""
    method_cls = get_method(cfg.method)
    seed_everything(cfg.seed)
    device = resolve_device(cfg.train.device)
    options = method_cls.typed_options(cfg.method_options)
    kind = run_class(method_cls.run_kind)
    if model is None:
        hidden = kind.model_hidden(options, cfg.train.hidden)
        model = build_model(cfg.train.model, feature_shape, n_classes, hidden)
    else:
        hidden = []
    model = model.to(device)
    # a method that pre-trains on public data itself (sanitize's frozen encoder) is not
    # pre-trained twice: both then have the same public pre-training
    own = kind.needs_public_data(options)
    public_fit = _public_init(model, cfg, public, device) \
        if cfg.train.public_init and not own else {}
    q, steps_per_epoch, total_steps = kind.plan(n_records, cfg, options)
    groups = LayerGroups.of(model)
    method = method_cls(MethodContext(cfg.train.clip_norm, groups.names, count_parameters(model),
                                      q * n_records, options, model,
                                      cfg.shadow_risk))
    loss_fn = nn.CrossEntropyLoss(reduction="none")
    run = kind(RunSetup(
        model=model, groups=groups, method=method, cfg=cfg, device=device, loss_fn=loss_fn,
        n_records=n_records, q=q, steps_per_epoch=steps_per_epoch, total_steps=total_steps,
        hidden=list(hidden), public=public))
    if cfg.train.early_stopping.rule != "none":
        run.watch_public(public)
    run.public_init = public_fit
    return run


def _public_init(model: nn.Module, cfg: TrainConfig, public, device) -> dict:
    """``train.public_init``: pre-train the whole model on the public split (its own seeded
    generator, so the run's sampling stream is the same with or without it)."""
    if public is None or len(public[0]) == 0:
        raise DpclipError("train.public_init: true needs the public shadow split, which this "
                          "run did not get (data.split.shadow_train)")
    generator = torch.Generator().manual_seed(cfg.seed)
    fit = pretrain(model, nn.CrossEntropyLoss(reduction="none"), public, PUBLIC_PRETRAINING,
                   min(cfg.train.batch_size, len(public[0])), generator, device)
    return {f"init_{k}": v for k, v in fit.items()}


def with_records_in_stream_key(cfg: TrainConfig, x: np.ndarray, y: np.ndarray) -> TrainConfig:
    """``cfg`` whose noise streams also depend on the records it trains on, so that a retrain
    after a record was deleted draws fresh noise (docs/privacy.md, "Independent noise across
    runs"); unchanged with shared or OS-entropy streams."""
    if cfg.stream_key() is None or cfg.privacy.secure_noise:
        return cfg
    return replace(cfg, data_label=f"{cfg.data_label} records={records_digest(x, y)}")


def check_records(x: np.ndarray, y: np.ndarray, n_classes: int) -> None:
    """Refuse, before any private step, labels that are not class indices 0..n_classes-1
    (a label of n_classes or -1 raised a bare IndexError inside the step, and -100 was
    silently ignored by the loss) and features that are not finite. The message counts the
    records; it shows none of their values."""
    labels = np.asarray(y)
    if len(labels) != len(x):
        raise DpclipError(f"train: {len(x)} records but {len(labels)} labels")
    if not np.issubdtype(labels.dtype, np.integer):
        whole = np.isfinite(labels) & (np.mod(labels, 1) == 0) if labels.size else labels
        if not np.all(whole):
            raise DpclipError(f"train: labels must be class indices 0..{n_classes - 1} "
                              f"(whole numbers); {int(np.size(labels) - np.sum(whole))} are not")
    outside = int(np.sum((labels < 0) | (labels >= n_classes)))
    if outside:
        raise DpclipError(f"train: {outside} labels are outside the class indices "
                          f"0..{n_classes - 1} (n_classes {n_classes})")
    features = np.asarray(x)
    if np.issubdtype(features.dtype, np.floating):
        # as training will see them: a float64 1e39 becomes inf in float32
        seen = features.astype(np.float32, copy=False)
        bad = int(np.sum(~np.isfinite(seen).reshape(len(seen), -1).all(axis=1)))
        if bad:
            raise DpclipError(f"train: {bad} records have features that are not finite (NaN "
                              f"or infinite); fill or drop them before training")


def train_model(x: np.ndarray, y: np.ndarray, feature_shape: tuple[int, ...], n_classes: int,
                cfg: TrainConfig, *, progress: bool = True, desc: str = "",
                checkpoint_path: Path | None = None, checkpoint_every: int = 5,
                public: PublicData | tuple | None = None, model: nn.Module | None = None,
                optimizer: torch.optim.Optimizer | None = None) -> TrainResult:
    """Train one configuration and return the model, its trace and its privacy record.
    Records are checked first (:func:`check_records`). ``model`` and ``optimizer``: the
    caller's own (:mod:`dpclip.api`) instead of ``train.model`` and ``train.optimizer``."""
    check_records(x, y, n_classes)
    cfg = with_records_in_stream_key(cfg, x, y)
    run = build_run(feature_shape, n_classes, len(x), cfg, public, model)
    if optimizer is not None:
        run.use_optimizer(optimizer)
    checkpoint = Checkpoint.for_run(checkpoint_path, checkpoint_every, cfg, x, y) \
        if checkpoint_path else None
    x_t = as_model_input(x, run.device)
    y_t = torch.as_tensor(y, dtype=torch.int64, device=run.device)
    started_at, started = time.time(), time.perf_counter()
    run.fit(x_t, y_t, progress=progress, desc=desc or cfg.method, checkpoint=checkpoint)
    train_s = time.perf_counter() - started
    step_times = np.array(run.step_times) if run.step_times else np.zeros(1)
    privacy = run.privacy_record()
    if privacy["epsilon"] is not None and run.trace:
        # a stopped run reports a bound of its own (odometer or planned): the trace ends on it
        run.trace[-1]["epsilon_spent"] = privacy["epsilon"]
    return TrainResult(
        model=run.plain_model().cpu(), trace=run.trace, privacy=privacy,
        time={"started_at": round(started_at, 3), "train_s": round(train_s, 4), "step_s_median": float(np.median(step_times)),
              "device": str(run.device), **run.timing_extras(),
              "step_ended_at": [round(t, 3) for t in run.step_ended_at]},
        training={"epochs_planned": run.cfg.train.epochs, "steps_planned": run.total_steps,
                  "steps_per_epoch": run.steps_per_epoch, "n_train": int(len(x)),
                  "stopped_by_budget": run.stopped_by_budget, **run.public_init,
                  **run.training_extras()},
        architecture=run.architecture(),
    )
