"""Early-stopping rules (issue 5): each fires on a series built to trigger it and stays silent
on one built not to."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import gaussian_records

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


# --- the privacy of a data-dependent stopping time ------------------------------------------

def test_stopped_epsilon_by_hand_for_the_gaussian_mechanism():
    """q = 1: each release has RDP a / (2 sigma^2), so the odometer is a closed form."""
    from dpclip.privacy import ODOMETER_ORDERS, stopped_epsilon

    orders = np.asarray(ODOMETER_ORDERS)
    for sigma, releases in ((2.0, 3), (3.5, 17)):
        by_hand = min(releases * a / (2 * sigma ** 2) + math.log(len(orders) / 1e-5) / (a - 1)
                      for a in orders)
        assert stopped_epsilon([(sigma, 1.0, releases)], 1e-5) == pytest.approx(by_hand, 1e-12)


def test_stopping_at_a_data_dependent_time_costs_more_than_a_fixed_horizon():
    """The odometer pays for the random horizon (above the fixed-horizon epsilon of the same
    steps) and grows with every step."""
    from dpclip.privacy import epsilon_of, stopped_epsilon

    for sigma, q, steps in ((1.3, 0.09, 200), (3.5, 1.0, 15), (0.8, 0.01, 1000)):
        odometer = stopped_epsilon([(sigma, q, steps)], 1e-5)
        assert epsilon_of("rdp", [(sigma, q, steps)], 1e-5) < odometer
        assert odometer < stopped_epsilon([(sigma, q, steps + 1)], 1e-5)


def test_early_stop_privacy_never_reports_more_than_the_planned_run():
    from dpclip.privacy import early_stop_privacy

    assert early_stop_privacy(8.0, 5.0) == {"epsilon": 5.0, "epsilon_planned": 8.0,
                                            "epsilon_saved": 3.0, "epsilon_bound": "odometer"}
    late = early_stop_privacy(8.0, 9.5)  # stopped near the end: the planned bound is tighter
    assert late["epsilon"] == 8.0 and late["epsilon_saved"] == 0.0
    assert late["epsilon_bound"] == "planned"


# --- early stopping for the gradient methods --------------------------------------------------

def _cfg(method, rule="slope", threshold=1e9, epochs=4):
    from dpclip.train import TrainConfig

    return TrainConfig.of(method=method, target_epsilon=4.0 if method != "non_private" else None,
                          delta=1e-5, accountant="rdp", epochs=epochs, batch_size=16, lr=0.1,
                          optimizer="sgd", momentum=0.0, clip_norm=1.0, seed=0, device="cpu",
                          model="mlp", hidden=(8, 5),
                          early_stopping={"rule": rule, "window": 2, "threshold": threshold})


def _data(seed=0):
    return gaussian_records(96, seed)


def test_dp_sgd_stops_early_on_the_public_series_and_reports_the_odometer_epsilon():
    from opacus.accountants.analysis import rdp as rdp_analysis

    from dpclip.privacy import ODOMETER_ORDERS, epsilon_of
    from dpclip.train import train_model

    x, y = _data()
    public = _data(seed=1)
    result = train_model(x, y, (6,), 3, _cfg("dp_sgd"), progress=False, public=public)
    # a threshold no slope can miss: the first full window (epoch 2) stops
    assert result.training["stopped_epoch"] == 2 and result.training["stopped_early"]
    privacy = result.privacy
    steps_done = 2 * result.training["steps_per_epoch"]
    assert privacy["steps"] == steps_done
    sigma, q = privacy["noise_multiplier"], privacy["sample_rate"]
    orders = np.asarray(ODOMETER_ORDERS)
    rdp = np.asarray(rdp_analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=steps_done,
                                              orders=orders))
    odometer = float(np.min(rdp + np.log(len(orders) / 1e-5) / (orders - 1)))
    planned = epsilon_of("rdp", [(sigma, q, result.training["steps_planned"])], 1e-5)
    assert privacy["epsilon"] == pytest.approx(min(planned, odometer), rel=1e-9)
    assert privacy["epsilon_saved"] == pytest.approx(planned - privacy["epsilon"])
    assert privacy["epsilon_bound"] == ("odometer" if odometer < planned else "planned")
    # the trace ends on the reported (ex-post) bound, not the fixed-horizon epsilon of the
    # steps run, which is smaller and no guarantee at a data-dependent stopping time
    fixed_horizon = epsilon_of("rdp", [(sigma, q, steps_done)], 1e-5)
    assert fixed_horizon < privacy["epsilon"]
    assert result.trace[-1]["epsilon_spent"] == privacy["epsilon"]
    # the watched value is the head's input on the public data under the released weights
    rows = [row for row in result.trace if "monitored_std" in row]
    assert [row["epoch"] for row in rows] == [1, 2]
    with torch.no_grad():
        head_input = result.model[:-1](torch.as_tensor(public[0]))
    assert rows[-1]["monitored_std"] == pytest.approx(float(head_input.std(dim=1).mean()))
    assert [row["early_stop_flag"] for row in rows] == [False, True]


def test_a_silent_rule_trains_every_epoch_and_reports_the_planned_epsilon():
    from dpclip.train import train_model

    x, y = _data()
    result = train_model(x, y, (6,), 3, _cfg("auto_s", threshold=-1e9), progress=False,
                         public=_data(seed=1))
    assert "stopped_epoch" not in result.training and "epsilon_saved" not in result.privacy
    assert result.privacy["epsilon_bound"] == "fixed_horizon"
    assert result.trace[-1]["epsilon_spent"] == result.privacy["epsilon"]
    assert sum("monitored_std" in row for row in result.trace) == 4


def test_non_private_runs_stop_early_too():
    from dpclip.train import train_model

    x, y = _data()
    result = train_model(x, y, (6,), 3, _cfg("non_private"), progress=False,
                         public=_data(seed=1))
    assert result.training["stopped_epoch"] == 2 and result.privacy["epsilon"] is None


def test_early_stopping_without_public_data_names_the_keys():
    from dpclip.errors import DpclipError
    from dpclip.train import build_run

    with pytest.raises(DpclipError, match=r"train.early_stopping.rule.*data.split.shadow_train"):
        build_run((6,), 3, 96, _cfg("dp_sgd"), None)


def test_dp_sgd_early_stopping_through_the_cli_and_the_report(tmp_path, tiny_raw, write_params):
    import json

    from conftest import prepared_project
    from dpclip.cli import main

    raw = tiny_raw(train={"methods": ["dp_sgd"], "epochs": 3,
                          "early_stopping": {"rule": "slope", "window": 2, "threshold": 1e9}})
    base = prepared_project(tmp_path, raw, write_params)
    run = ["--method", "dp_sgd", "--epsilon", "8", "--alpha", "iid", "--seed", "0"]
    assert main([*base, "train", *run]) == 0
    assert main([*base, "evaluate", *run]) == 0
    assert main([*base, "report"]) == 0
    metrics = json.loads((tmp_path / "metrics" / "dp_sgd-eps8-iid-seed0.json").read_text())
    assert metrics["training"]["stopped_epoch"] == 2
    assert metrics["training"]["epochs_planned"] == 3
    privacy = metrics["privacy"]
    assert privacy["epsilon"] + privacy["epsilon_saved"] == pytest.approx(
        privacy["epsilon_planned"])
    assert (tmp_path / "figures" / "dp_sgd-eps8-iid-seed0" / "early_stopping.png").exists()
    table = (tmp_path / "reports" / "comparison.csv").read_text().splitlines()
    header, row = table[0].split(","), table[1].split(",")
    assert row[header.index("stopped_epoch")] == "2"
