"""The evaluate stage's summaries of a run's step trace."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from dpclip.methods import get_method
from dpclip.methods.base import MethodContext, StepRelease
from dpclip.stages.evaluate import clamp_activity, clip_summary


def test_clamp_activity_by_hand():
    # 6 steps, the controller updates at steps 2, 4 and 6: the clamp acts at the lower bound
    # at step 2 and at the upper at step 6, so 2 of 3 updates
    trace = pd.DataFrame({"step": range(1, 7), "clip_threshold": [1, 1, 1, 1, 1, 3.0],
                          "ww_zeta": [math.nan, 3.1, math.nan, 4.0, math.nan, 5.2],
                          "ww_clamp_hits_min": [0, 1, 1, 1, 1, 1],
                          "ww_clamp_hits_max": [0, 0, 0, 0, 0, 1]})
    assert clamp_activity(trace) == {"clamp_hits_min": 1, "clamp_hits_max": 1,
                                     "clamp_updates": 3, "clamp_share": pytest.approx(2 / 3)}
    assert clip_summary(trace)["clamp_share"] == pytest.approx(2 / 3)


def test_a_method_without_a_clamp_has_no_clamp_activity():
    trace = pd.DataFrame({"step": [1, 2], "clip_threshold": [1.0, 1.2]})
    assert set(clamp_activity(trace).values()) == {None}
    assert clip_summary(trace)["c_final"] == 1.2


def test_clamp_activity_counts_what_ww_dp_sgd_writes():
    """The real controller's trace rows: C_0 = 0.25 under the clamp [1, 3], gain 0.5, the
    signal saturated at +1 (zeta far above the zone), without anti-windup: u = log 0.25 + 0.5 k
    after k probes, below log 1 for k = 1, 2 (clamped to C_min), between log 1 and log 3 = 1.099
    for k = 3, 4 (u = 0.11, 0.61) and above it from k = 5 (u = 1.11): 2 hits at the lower bound
    and 6 at the upper over 10 probes, K = 4 steps apart."""
    model = torch.nn.Sequential()
    model.add_module("fc1", torch.nn.Linear(40, 30))
    cls = get_method("ww_dp_sgd")
    ww = cls(MethodContext(1.0, ["fc1"], model=model, options=cls.parse_options(
        {"probe": "fc1", "beta": 0.0, "kappa": 0.5, "c_min": 1.0, "c_max": 3.0,
         "anti_windup": False, "probe_every": 4})))
    ww.clip_threshold, ww.log_c = 0.25, np.log(0.25)
    ww.measure = lambda: 100.0  # the probe's exponent, far above the zone on every probe
    rows = []
    for step in range(1, 41):  # the training loop's order: the step's release, then its row
        ww.update(StepRelease(step=step, noisy_grad=[]))
        rows.append({"step": step, "clip_threshold": ww.clip_threshold, **ww.trace_row()})
    assert clamp_activity(pd.DataFrame(rows)) == {
        "clamp_hits_min": 2, "clamp_hits_max": 6, "clamp_updates": 10,
        "clamp_share": pytest.approx(0.8)}
