"""Early-stopping rules on a per-epoch series s_1, s_2, ... (the sanitization-layer paper,
Monir et al., Algorithms 2 and 4), over the last ``window`` epochs: ``slope`` stops when the
endpoint slope (s_e - s_{e-window+1}) / (window - 1) is <= T_s (sign kept), ``linear_trend``
when the least-squares slopes of the last two overlapping windows differ by <= tau. The series
is a released representation's mean per-record std (:func:`public_representation_std`, or a
run kind's own released series): no rule reads private data. Each rule returns its signal
(NaN until enough epochs) and the flag. docs/privacy.md, "The stopping rules".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from dpclip.config import EARLY_STOPPING_RULES
from dpclip.models import per_record_std


@torch.no_grad()
def public_representation_std(model: nn.Module, x: torch.Tensor) -> float:
    """:func:`per_record_std` of the input of the model's ``head`` layer on public ``x``."""
    captured = []
    hook = model.head.register_forward_hook(lambda _m, inputs, _o: captured.append(inputs[0]))
    was_training = model.training
    try:
        model.eval()
        model(x)
    finally:
        hook.remove()
        model.train(was_training)
    return per_record_std(captured[0].flatten(1))


@dataclass(frozen=True)
class StopDecision:
    signal: float
    stop: bool


def endpoint_slope(series, window: int) -> float:
    """(s_last - s_first) / (window - 1) over the last ``window`` values; NaN if too few."""
    if len(series) < window:
        return math.nan
    return (float(series[-1]) - float(series[-window])) / (window - 1)


def fitted_slope(values) -> float:
    """Least-squares slope of ``values`` against 0, 1, 2, ..."""
    y = np.asarray(values, dtype=np.float64)
    x = np.arange(len(y), dtype=np.float64)
    x -= x.mean()
    return float(x @ (y - y.mean()) / (x @ x))


def slope_rule(series, window: int, threshold: float) -> StopDecision:
    """Algorithm 2: stop when the window's endpoint slope is <= T_s."""
    gamma = endpoint_slope(series, window)
    return StopDecision(gamma, bool(not math.isnan(gamma) and gamma <= threshold))


def linear_trend_rule(series, window: int, tolerance: float) -> StopDecision:
    """Algorithm 4: stop when the fitted slopes of the last two windows differ by <= tau."""
    if len(series) < window + 1:
        return StopDecision(math.nan, False)
    gap = abs(fitted_slope(series[-window:]) - fitted_slope(series[-window - 1:-1]))
    return StopDecision(gap, gap <= tolerance)


def decide(rule: str, series, window: int, threshold: float) -> StopDecision:
    """The named rule; ``threshold`` is T_s for ``slope`` and tau for ``linear_trend``."""
    if rule == "slope":
        return slope_rule(series, window, threshold)
    if rule == "linear_trend":
        return linear_trend_rule(series, window, threshold)
    raise ValueError(f"unknown early-stopping rule {rule!r}; expected one of {EARLY_STOPPING_RULES}")
