"""train: one configuration (method, target epsilon, alpha, seed) on its partition.

Writes ``runs/<run>/model.pt``, ``record.json`` (the privacy record: epsilon, ``adjacency``,
``secure_noise``, ``data_use``) and ``provenance.json`` (:mod:`dpclip.pipeline.provenance`),
and ``traces/<run>.csv`` (per step; its loss and batch-size columns come from the private batch
without noise and reach MLflow only with ``tracking.private_diagnostics``); wall-clock times go
to ``timings/<run>.json``, outside DVC's outputs. docs/pipeline.md, "Reproducible outputs".
"""

from __future__ import annotations

import hashlib

import pandas as pd

from dpclip.config import IID, Params
from dpclip.files import write_csv_frame, write_json, write_torch
from dpclip.layout import Layout
from dpclip.methods import get_method
from dpclip.run_keys import RunKey
from dpclip.numerics import kernels_in_use
from dpclip.catalog import BY_NAME
from dpclip.pipeline import provenance
from dpclip.threads import use_threads
from dpclip.train import TrainConfig, train_model
from dpclip.pipeline.inputs import checkpoint_of, run_inputs

STAGE = BY_NAME["train"]


def train(params: Params, method: str, epsilon, alpha, seed: int, layout: Layout = Layout(),
          progress: bool = True) -> dict:
    key = RunKey(method, epsilon, alpha, int(seed))
    run = key.name
    data = run_inputs(params, key, layout)  # the run resolved once (tuned values included)
    # before training: what this run was made from
    inputs = provenance.inputs(STAGE, params, key, layout, tuned=data.tuned)
    threads = use_threads(params.train.threads)
    meta, cfg = data.meta, data.cfg
    result = train_model(data.x, data.y, data.shape, data.n_classes, cfg, progress=progress,
                         desc=run, checkpoint_path=layout.checkpoint(run),
                         checkpoint_every=params.train.checkpoint_every, public=data.public)
    checkpoint = checkpoint_of(result, cfg, meta)
    run_dir = layout.run_dir(run)
    write_torch(run_dir / "model.pt", checkpoint)
    record = {
        "run": run, "dataset": params.data.dataset, "method": method,
        "alpha": None if alpha == IID else alpha, "seed": int(seed),
        "privacy": result.privacy, "training": result.training, "device": result.time["device"],
        "weights_sha256": weights_sha256(checkpoint["state_dict"]),
        "n_members": int(len(data.x)), "threads": threads, "numerics": kernels_in_use(),
        "tuned": data.tuned,  # None: params.yaml's values
    }
    result.privacy["data_use"] = data_use(result.privacy.get("data_use", {}), cfg, meta,
                                          len(data.x), alpha, tuned=record["tuned"] is not None)
    write_csv_frame(layout.trace(run), pd.DataFrame(result.trace))
    write_json(run_dir / "record.json", record)
    write_json(layout.timing(run), {"run": run, **result.time})
    provenance.record(STAGE, layout, key, inputs)
    return {**record, "time": result.time}  # the caller prints the time; the file has no time


def data_use(method_use: dict, cfg: TrainConfig, meta: dict, n_members: int, alpha,
             tuned: bool = False) -> dict:
    """``privacy.data_use``: which data each component of the run saw (docs/privacy.md, "Public
    data"): the method's own components, then preprocessing, early stopping and evaluation."""
    partition = "iid" if alpha == IID else f"Dirichlet alpha {alpha}"
    preprocessing = meta["preprocessing"]["fitted_on"]
    rule = cfg.train.early_stopping.rule
    stopping = "not used" if rule == "none" else \
        f"{rule} rule on {get_method(cfg.method).early_stopping_watches} (post-processing)"
    return {"members": f"{n_members} records of target_train ({partition} partition)",
            **method_use,
            "feature_preprocessing": preprocessing,
            "early_stopping": stopping,
            "initialisation": "pre-trained on the public shadow_train split (Adam, stopped "
                              "on the public shadow_holdout split; no member read)"
                              if cfg.train.public_init else "random, from train.seed (no data)",
            "hyperparameters": "chosen by dpclip tune on the public shadow splits only (no "
                               "member read)" if tuned else "params.yaml's values (not tuned)",
            "evaluation": "members and the target holdout, after training (the metrics are "
                          "measurements for the data owner, not DP releases)"}


def weights_sha256(state_dict: dict) -> str:
    """Fingerprint of the trained weights (names, shapes and values), independent of the file
    format: two runs that trained the same model have the same fingerprint."""
    digest = hashlib.sha256()
    for name, tensor in state_dict.items():
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def describe(record: dict, layout: Layout) -> str:
    """The line ``dpclip train`` prints for a trained run: its epsilon and training time."""
    eps = record["privacy"]["epsilon"]
    return f"epsilon={'inf' if eps is None else f'{eps:.3f}'}, {record['time']['train_s']:.1f} s"
