"""Adaptive clipping methods: their rules on hand-made cases, their accounting, and a short
real training run of each."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpclip.config import parse_params
from dpclip.errors import ConfigError
from dpclip.methods import get_method
from dpclip.methods.base import MethodContext, StepRelease
from dpclip.methods.dc_sgd import error_threshold, norm_histogram, percentile_threshold
from dpclip.privacy import combined_sigma, epsilon_of, split_sigma
from dpclip.train import TrainConfig, train_model


def test_auto_s_and_psac_factors_by_hand():
    norms = torch.tensor([[3.0, 4.0]])  # n = 5
    auto = get_method("auto_s")(MethodContext(2.0, ["a", "b"]))
    assert auto.scale(norms).item() == pytest.approx(2.0 / (5 + 0.01))
    psac = get_method("dp_psac")(MethodContext(2.0, ["a", "b"]))
    assert psac.scale(norms).item() == pytest.approx(2.0 / (5 + 0.1 / 5.1))


def test_histogram_bins_and_overflow():
    norms = torch.tensor([0.0, 0.49, 0.5, 1.2, 1.99, 2.0, 7.5])
    # 4 bins of width 0.5 on [0, 2]: [0, .5) gets 0 and .49; [.5, 1) gets .5; [1, 1.5) gets 1.2;
    # the last bin gets 1.99 and the two norms >= b_max
    assert norm_histogram(norms, 4, 2.0).tolist() == [2, 1, 1, 3]


def test_percentile_rule_picks_the_right_bin():
    counts = torch.tensor([2.0, 3.0, 5.0, 0.0])  # width 1: cumulative shares .2, .5, 1, 1
    assert percentile_threshold(counts, 4.0, 0.5) == 2.0   # bin 1 reaches 0.5: upper edge 2
    assert percentile_threshold(counts, 4.0, 0.51) == 3.0
    assert percentile_threshold(counts, 4.0, 0.1) == 1.0
    assert percentile_threshold(torch.zeros(4), 4.0, 0.5) is None


def test_error_rule_argmin_worked_out_by_hand():
    # 4 bins of width 1 on [0, 4], midpoints .5 1.5 2.5 3.5; noisy counts 1, 0, 0, 1 (total 2)
    # variance term: sigma_T^2 C^2 d / B^2 with sigma_T = 1, d = 4, B = 4 -> C^2 / 4
    # bias term: [max(.5-C,0)^2 + max(3.5-C,0)^2] / 2
    #   C=1: 1/4 + 6.25/2 = 3.375;  C=2: 1 + 2.25/2 = 2.125;  C=3: 2.25 + .25/2 = 2.375;
    #   C=4: 4 + 0 = 4  ->  argmin C = 2
    counts = torch.tensor([1.0, 0.0, 0.0, 1.0])
    assert error_threshold(counts, 4.0, 1.0, 4, 4.0) == 2.0
    # much more gradient noise per unit C pulls the threshold down to the first edge
    assert error_threshold(counts, 4.0, 10.0, 4, 4.0) == 1.0


@pytest.mark.parametrize("name", ["dc_sgd_p", "dc_sgd_e"])
def test_dc_sgd_split_gives_back_the_overall_sigma_through_the_accountant(name):
    method = get_method(name)(MethodContext(1.0, ["fc1"], n_params=10, expected_batch=8.0))
    sigma = 1.3
    extras = method.extra_queries(sigma)
    sigma_t = split_sigma(sigma, extras)
    assert sigma_t == pytest.approx((sigma ** -2 - (5.0 * sigma) ** -2) ** -0.5)
    assert combined_sigma(sigma_t, extras) == pytest.approx(sigma)
    # the accountant sees one Gaussian mechanism with sigma: same epsilon as plain DP-SGD
    eps_split = epsilon_of("rdp", [(combined_sigma(sigma_t, extras), 0.05, 100)], 1e-5)
    assert eps_split == pytest.approx(epsilon_of("rdp", [(sigma, 0.05, 100)], 1e-5))


def test_dc_sgd_controller_reads_only_the_noisy_histogram():
    method = get_method("dc_sgd_p")(MethodContext(1.0, ["fc1"]))
    method.bind_noise(1.0, 1.02)
    # the update gets a release; whatever the raw norms were, only extras["hist"] is read
    release = StepRelease(step=1, noisy_grad=[], extras={"hist": torch.tensor(
        [0.0] * 10 + [4.0] + [0.0] * 9)})
    method.update(release)
    assert method.clip_threshold == pytest.approx(11 * 5.0 / 20)


def test_sigma_h_ratio_must_exceed_one(tiny_raw):
    with pytest.raises(ConfigError, match="methods.dc_sgd.sigma_h_ratio"):
        parse_params(tiny_raw(methods={"dc_sgd": {"sigma_h_ratio": 0.5}}))
    with pytest.raises(ConfigError, match="methods.dc_sgd.p"):
        parse_params(tiny_raw(methods={"dc_sgd": {"p": 1.5}}))
    with pytest.raises(ConfigError, match="methods.dc_sgd.bins"):
        parse_params(tiny_raw(methods={"dc_sgd": {"bins": 1}}))


@pytest.mark.parametrize("name", ["auto_s", "dp_psac", "dc_sgd_p", "dc_sgd_e"])
def test_each_method_trains_within_budget_and_traces_its_threshold(name):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(200, 6)).astype(np.float32), rng.integers(0, 3, size=200)
    cfg = TrainConfig(method=name, target_epsilon=4.0, delta=1e-5, accountant="rdp", epochs=3,
                      batch_size=20, lr=0.1, optimizer="sgd", momentum=0.0, clip_norm=1.0,
                      seed=0, device="cpu", model="mlp", hidden=(8,),
                      method_options={"hist_every": 5} if name.startswith("dc") else {})
    result = train_model(x, y, (6,), 3, cfg, progress=False)
    p = result.privacy
    assert p["epsilon"] <= 4.0 and p["epsilon"] >= 4.0 - 0.02
    thresholds = [row["clip_threshold"] for row in result.trace]
    if name.startswith("dc_sgd"):
        assert p["sigma_hist"] == pytest.approx(5.0 * p["noise_multiplier"])
        assert p["sigma_train"] > p["noise_multiplier"]
        assert len(set(thresholds)) > 1  # the controller moved C
        assert any("noisy_histogram" in row for row in result.trace)
    else:
        assert p["sigma_train"] == p["noise_multiplier"] and set(thresholds) == {1.0}
