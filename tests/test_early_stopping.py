"""Early-stopping rules (issue 5): each fires on a series built to trigger it and stays silent
on one built not to."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpclip.train.early_stopping import (decide, endpoint_slope, fitted_slope,
                                         linear_trend_rule, slope_rule)


def _first_stop(rule, series, window, threshold):
    for epoch in range(1, len(series) + 1):
        if decide(rule, series[:epoch], window, threshold).stop:
            return epoch
    return None


def test_slopes_by_hand():
    assert endpoint_slope([1.0, 5.0, 2.0, 4.0], 3) == pytest.approx((4.0 - 5.0) / 2)
    assert math.isnan(endpoint_slope([1.0, 2.0], 3))
    # least squares through (0, 1), (1, 2), (2, 6): slope = sum (x - 1)(y - 3) / 2 = 5 / 2
    assert fitted_slope([1.0, 2.0, 6.0]) == pytest.approx(2.5)


def test_slope_rule_fires_when_a_rising_series_flattens():
    # rises by 0.1 per epoch for 10 epochs, then flat at 1.0
    series = [0.1 * e for e in range(1, 11)] + [1.0] * 10
    # window 5: the first window whose endpoints are both on the flat part ends at epoch 14;
    # the window ending at epoch 13 has slope (1.0 - 0.9) / 4 = 0.025 > T_s = 0.01
    assert _first_stop("slope", series, window=5, threshold=0.01) == 14
    assert slope_rule(series[:14], 5, 0.01).signal == pytest.approx(0.0)


def test_slope_rule_stays_silent_on_a_steadily_rising_series():
    series = [0.05 * e for e in range(1, 31)]
    assert _first_stop("slope", series, window=5, threshold=0.01) is None
    assert slope_rule(series, 5, 0.01).signal == pytest.approx(0.05)


def test_linear_trend_rule_fires_once_the_series_becomes_linear():
    # noisy-looking curvature for 8 epochs (alternating), then exactly linear (slope 0.2)
    head = [1.0, 1.6, 1.1, 1.9, 1.2, 2.0, 1.3, 2.1]
    tail = [2.1 + 0.2 * k for k in range(1, 13)]
    series = head + tail
    epoch = _first_stop("linear_trend", series, window=4, threshold=1e-6)
    # the last two windows of 4 must both lie on the linear part: epochs 8..11 and 9..12
    assert epoch == 12
    assert linear_trend_rule(series[:12], 4, 1e-6).signal == pytest.approx(0.0, abs=1e-12)


def test_linear_trend_rule_stays_silent_while_the_slope_keeps_changing():
    series = [0.01 * e ** 2 for e in range(1, 31)]  # a parabola: every window's slope differs
    assert _first_stop("linear_trend", series, window=5, threshold=1e-3) is None
    # consecutive windows' slopes of 0.01 e^2 differ by exactly 0.02
    assert linear_trend_rule(series, 5, 1e-3).signal == pytest.approx(0.02)


def test_rules_need_enough_epochs():
    assert math.isnan(slope_rule([1.0] * 4, 5, 1.0).signal)
    assert not linear_trend_rule([1.0] * 5, 5, 1.0).stop  # needs window + 1 epochs
    assert linear_trend_rule([1.0] * 6, 5, 0.0).stop
    with pytest.raises(ValueError, match="unknown early-stopping rule"):
        decide("patience", np.ones(10), 3, 0.1)
