"""One audit training run per kind of canary, each turned into a lower bound on epsilon at the
run's claimed delta (:mod:`dpclip.audit.bound`, :mod:`dpclip.audit.canaries`).

The audited model is an extra model trained with the run's own configuration (method, options,
epsilon, seed) on its members plus the included canaries; it is never released, and its
results are measurements for the data owner (like the metrics: a second model trained on the
members, not covered by the run's epsilon). A bound above the epsilon the run claims is a
privacy bug, logged as an ERROR: at confidence c a sound mechanism gives one with probability
at most 1 - c per audit (so among many audited runs, an occasional false alarm is expected).
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from dpclip.audit.bound import audit
from dpclip.audit.canaries import GradientCanaries, input_canaries
from dpclip.errors import DpclipError
from dpclip.train import build_run
from dpclip.train.runs import Run
from dpclip.train.setup import TrainConfig

log = logging.getLogger(__name__)


def not_applicable(kind: str, reason: str) -> dict:
    return {"kind": kind, "applicable": False, "reason": reason, "epsilon_lower_bound": None}


def _verdict(kind: str, result: dict, privacy: dict, run_name: str) -> dict:
    claimed = privacy["epsilon"]
    refuted = claimed is not None and result["epsilon_lower_bound"] > claimed
    violated = refuted and bool(privacy.get("dp_guarantee", True))  # a literal variant: no claim
    if violated:
        log.error("PRIVACY BUG in %s: the %s audit refutes the claimed epsilon %.4g: lower bound "
                  "%.4g at %.0f%% confidence (%d of %d guesses right, %d canaries)", run_name,
                  kind, claimed, result["epsilon_lower_bound"], 100 * result["confidence"],
                  result["correct"], result["guesses"], result["canaries"])
    return {"kind": kind, "applicable": True, **result, "claimed_epsilon": claimed,
            "delta": privacy["delta"], "refutes_reported_epsilon": bool(refuted),
            "violated": bool(violated)}


def per_layer_rule(run: Run) -> bool:
    """Whether the run's method scales each layer of a record on its own (factors B x L), as
    a spanning canary shows it (LM-DP-SGD): then a one-layer canary is clipped below C."""
    probe = torch.full((1, len(run.groups.names)), 1.0, device=run.device)
    return run.method.scale(probe).dim() == 2


def canary_span(run: Run, choice: str = "auto") -> str:
    """``audit.canary_span``: auto is every_layer for a per-layer rule, else one_layer (which
    fits the most canaries in the model)."""
    if choice != "auto":
        return choice
    return "every_layer" if per_layer_rule(run) else "one_layer"


def canaries_that_fit(run: Run, m: int, span: str) -> int:
    """At most ``m`` canaries with distinct coordinates: one each in the model, or one in
    every layer group (the smallest group's size)."""
    sizes = [sum(p.numel() for p in group) for group in run.groups.params]
    return min(m, sum(sizes) if span == "one_layer" else min(sizes))


def audit_whitebox(run: Run, x: np.ndarray, y: np.ndarray, m: int, seed: int,
                   confidence: float = 0.95, name: str = "", span: str = "auto") -> dict:
    """Fit ``run`` (built by :func:`dpclip.train.build_run`, not yet trained) on ``x, y`` with
    at most ``m`` gradient canaries of ``span`` (:func:`canary_span`) in its DP step; the
    bound from their movement."""
    if not run.takes_gradient_canaries:  # the audit stage asks why_not_audited first
        raise ValueError(f"run kind {run.kind!r} has no shared DP step for gradient canaries")
    span = canary_span(run, span)
    canaries = GradientCanaries(run.groups, canaries_that_fit(run, m, span), run.q, seed, span)
    run.canaries = canaries
    start = [p.detach().clone() for p in run.groups.flat()]
    run.fit(torch.as_tensor(x, dtype=torch.float32, device=run.device),
            torch.as_tensor(y, dtype=torch.int64, device=run.device), progress=False,
            desc=name or "audit")
    if canaries.steps_sampled != len(run.trace):  # a kind that inherited the flag, say
        raise DpclipError(f"{name or 'audit'}: run kind {run.kind!r} says it takes gradient "
                          f"canaries, but its DP step drew them at {canaries.steps_sampled} of "
                          f"its {len(run.trace)} steps: the white-box audit would measure "
                          f"nothing (set takes_gradient_canaries = False, or pass run.canaries "
                          f"to dp_step)")
    scores = canaries.scores(start, run.groups.flat())
    privacy = run.privacy_record()
    return {**_verdict("whitebox", audit(scores, canaries.included, privacy["delta"],
                                         confidence), privacy, name), **canaries.facts()}


def audit_blackbox(x: np.ndarray, y: np.ndarray, public_x: np.ndarray, public_y: np.ndarray,
                   feature_shape: tuple[int, ...], n_classes: int, cfg: TrainConfig, m: int,
                   seed: int, confidence: float = 0.95, name: str = "", public=None) -> dict:
    """Train the run's configuration on its members plus the included input canaries (public
    records with a wrong label); the bound from the canaries' losses under the final model.

    The mechanism must not depend on which canaries are in: its plan (sample rate q, steps,
    noise) is made for the members plus m / 2 records, whatever the draw, and training then
    samples each record present with that q."""
    cx, cy, included = input_canaries(public_x, public_y, n_classes, m, seed)
    run = build_run(feature_shape, n_classes, len(x) + m // 2, cfg, public)
    run.fit(torch.as_tensor(np.concatenate([x, cx[included]]), dtype=torch.float32,
                            device=run.device),
            torch.as_tensor(np.concatenate([y, cy[included]]), dtype=torch.int64,
                            device=run.device), progress=False, desc=name or "audit")
    model = run.plain_model().eval()
    with torch.no_grad():
        logits = model(torch.as_tensor(cx, dtype=torch.float32, device=run.device))
        losses = torch.nn.functional.cross_entropy(
            logits, torch.as_tensor(cy, device=run.device), reduction="none").cpu()
    return _verdict("blackbox", audit(-losses.numpy(), included, cfg.privacy.delta,
                                      confidence), run.privacy_record(), name)
