"""Adaptive clipping methods: their rules on hand-made cases, their accounting, and a short
real training run of each."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpclip.pipeline.params import parse_params
from dpclip.errors import ConfigError
from dpclip.methods import get_method
from dpclip.methods.base import MethodContext, StepRelease
from dpclip.methods.common.dc_sgd import error_threshold, norm_histogram, percentile_threshold
from dpclip.privacy import combined_sigma, epsilon_of, split_sigma
from dpclip.randomness import NoiseSources
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
    release = StepRelease(step=1, noisy_grad=[], extras={"hist": np.array(
        [0.0] * 10 + [4.0] + [0.0] * 9)})
    method.update(release)
    assert method.clip_threshold == pytest.approx(11 * 5.0 / 20)


def test_sigma_h_ratio_must_exceed_one(tiny_raw):
    with pytest.raises(ConfigError, match="methods.dc_sgd_e.sigma_h_ratio"):
        parse_params(tiny_raw(methods={"dc_sgd_e": {"sigma_h_ratio": 0.5}}))
    with pytest.raises(ConfigError, match="methods.dc_sgd_p.p"):
        parse_params(tiny_raw(methods={"dc_sgd_p": {"p": 1.5}}))
    with pytest.raises(ConfigError, match="methods.dc_sgd_p.bins"):
        parse_params(tiny_raw(methods={"dc_sgd_p": {"bins": 1}}))


@pytest.mark.parametrize("name", ["auto_s", "dp_psac", "dc_sgd_p", "dc_sgd_e", "ww_dp_sgd",
                                  "adaclip"])
def test_each_method_trains_within_budget_and_traces_its_threshold(name):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(200, 6)).astype(np.float32), rng.integers(0, 3, size=200)
    options = {"dc_sgd_p": {"hist_every": 5}, "dc_sgd_e": {"hist_every": 5},
               "ww_dp_sgd": {"probe_every": 5, "kappa": 0.5, "min_tail": 4}}.get(name, {})
    cfg = TrainConfig.of(method=name, target_epsilon=4.0, delta=1e-5, accountant="rdp",
                         epochs=3, batch_size=20, lr=0.1, optimizer="sgd", momentum=0.0,
                         clip_norm=1.0, seed=0, device="cpu", model="mlp", hidden=(8,),
                         method_options=options)
    result = train_model(x, y, (6,), 3, cfg, progress=False)
    p = result.privacy
    assert p["epsilon"] <= 4.0 and p["epsilon"] >= 4.0 - 0.02
    thresholds = [row["clip_threshold"] for row in result.trace]
    if name.startswith("dc_sgd"):
        assert p["sigma_hist"] == pytest.approx(5.0 * p["noise_multiplier"])
        assert p["sigma_train"] > p["noise_multiplier"]
        assert len(set(thresholds)) > 1  # the controller moved C
        assert any("noisy_histogram" in row for row in result.trace)
    elif name == "adaclip":
        # centred count, sensitivity 1/2, std 0.05 B = 1: sigma_T^-2 = sigma^-2 - (2 * 1)^-2
        assert p["sigma_unclipped"] == pytest.approx(1.0)
        assert p["sigma_train"] == pytest.approx(
            (p["noise_multiplier"] ** -2 - 0.25) ** -0.5)
        assert len(set(thresholds)) > 1
    elif name == "ww_dp_sgd":
        assert p["sigma_train"] == p["noise_multiplier"]
        probed = [row for row in result.trace if not np.isnan(row["ww_zeta"])]
        assert probed and all(row["step"] % 5 == 0 for row in probed)
        assert len(set(thresholds)) > 1
    else:
        assert p["sigma_train"] == p["noise_multiplier"] and set(thresholds) == {1.0}


# ---------------------------------------------------------------------------------------------
# WW-DP-SGD: the tail-exponent estimator and the controller

from dpclip.methods.ww_dp_sgd import (WWDPSGD, spectrum, tail_exponent,  # noqa: E402
                                      tail_exponent_loglog)


def _pareto(alpha: float, n: int, seed: int) -> np.ndarray:
    """Samples with density ~ x^-alpha on [1, inf) (inverse-CDF sampling)."""
    u = np.random.default_rng(seed).random(n)
    return (1 - u) ** (-1.0 / (alpha - 1.0))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tail_exponent_recovers_a_pareto_exponent_of_three(seed):
    # pure power law: the MLE's standard error is (alpha - 1) / sqrt(n) ~ 0.06 at n = 1000
    assert tail_exponent(_pareto(3.0, 1000, seed)) == pytest.approx(3.0, abs=0.3)


def test_tail_exponent_agrees_with_the_powerlaw_package():
    powerlaw = pytest.importorskip("powerlaw")
    rng = np.random.default_rng(5)
    # a power-law tail above 10 on top of a uniform bulk: the KS search must find the cut
    data = np.concatenate([rng.uniform(0.1, 10.0, 300), 10.0 * _pareto(3.0, 400, 6)])
    fit = powerlaw.Fit(data, verbose=False)
    ours = tail_exponent(data, min_tail=10)
    assert ours == pytest.approx(fit.power_law.alpha, rel=1e-6)


def test_tail_exponent_falls_back_to_top_k_on_small_spectra():
    eigs = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    # top 3 with lambda_min = 4: alpha = 1 + 3 / (log 1 + log 2 + log 4) = 1 + 3 / (3 log 2)
    assert tail_exponent(eigs, min_tail=10, top_k=3) == pytest.approx(1 + 1 / np.log(2))


# the paper's estimator (loglog_topk): Theil-Sen on the rank plot of the top k eigenvalues,
# zeta = 1 - 1 / slope of log lambda_(i) against log i

def test_loglog_estimator_is_exact_on_an_exact_rank_plot_and_ignores_the_bulk_below_top_k():
    # lambda_(i) = i^(-1/3): slope -1/3 on the rank plot, so zeta = 1 + 3 = 4 exactly; below
    # the top 10 the 22 others fall with slope -3 (zeta 4/3), which only top_k = 10 leaves out
    top = np.arange(1, 11, dtype=float) ** (-1 / 3)
    bulk = top[-1] * (np.arange(11, 33) / 10.0) ** -3.0
    eigs = np.concatenate([top, bulk])
    rng = np.random.default_rng(0)
    assert tail_exponent_loglog(rng.permutation(eigs), top_k=10) == pytest.approx(4.0, abs=1e-9)
    assert tail_exponent_loglog(eigs, top_k=32) < 3.0
    # lambda_(i) = 3 i^(-2): slope -2, zeta = 1.5; the scale does not enter
    assert tail_exponent_loglog(3 * np.arange(1, 6.0) ** -2, top_k=5) == pytest.approx(1.5)
    # top_k above the spectrum's size fits the whole spectrum
    assert tail_exponent_loglog(top, top_k=50) == pytest.approx(4.0)


def test_loglog_estimator_is_robust_to_one_outlying_eigenvalue():
    # the largest of an exact i^(-1/3) plot made 100 times larger: 9 of the 45 pairwise slopes
    # change (all steeper), 36 stay -1/3, so their median (the 23rd) is still -1/3: zeta 4.
    # Ordinary least squares on the same points would give about 2.3
    eigs = np.arange(1, 11, dtype=float) ** (-1 / 3)
    eigs[0] *= 100.0
    assert tail_exponent_loglog(eigs, top_k=10) == pytest.approx(4.0, abs=1e-9)
    x, y = np.log(np.arange(1, 11)), np.log(eigs)
    assert 1 - 1 / np.polyfit(x, y, 1)[0] < 2.5


def test_loglog_estimator_edge_cases():
    assert tail_exponent_loglog(np.ones(10)) == np.inf  # no spread: no tail, as the MLE
    with pytest.raises(ValueError, match="at least 2 positive eigenvalues"):
        tail_exponent_loglog(np.array([2.0, 0.0, 0.0]))


@pytest.mark.parametrize("estimator", ["loglog_topk", "mle_ks"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_both_estimators_recover_a_pareto_tail_exponent_of_four(estimator, seed):
    # 5,000 draws of density ~ x^-4 on [1, inf): the top 1,000 are again a pure power law.
    # Spread over draws (simulated): Theil-Sen on k = 1,000 about 0.10, the MLE on 5,000 about
    # (zeta - 1) / sqrt(n) = 0.04; 0.3 is three of the larger
    ww = _ww(estimator=estimator, top_k=1000)
    assert ww.exponent(_pareto(4.0, 5000, seed)) == pytest.approx(4.0, abs=0.3)


def test_loglog_estimator_is_median_unbiased_on_small_spectra():
    # fc1 of the paper CNN gives 32 eigenvalues: the top 32 of 1,000 draws at zeta 4, the
    # median estimate over 200 draws (one estimate's spread ~0.7, the median's ~0.06)
    estimates = [tail_exponent_loglog(_pareto(4.0, 1000, seed), top_k=32) for seed in range(200)]
    assert np.median(estimates) == pytest.approx(4.0, abs=0.2)


def test_the_paper_estimator_is_the_default_and_the_option_is_validated(tiny_raw):
    assert get_method("ww_dp_sgd").default_options().estimator == "loglog_topk"
    assert parse_params(tiny_raw()).method_options("ww_dp_sgd").estimator == "loglog_topk"
    assert parse_params(tiny_raw(methods={"ww_dp_sgd": {"estimator": "mle_ks"}})
                        ).method_options("ww_dp_sgd").estimator == "mle_ks"
    with pytest.raises(ConfigError) as info:
        parse_params(tiny_raw(methods={"ww_dp_sgd": {"estimator": "hill"}}))
    assert "methods.ww_dp_sgd.estimator" in str(info.value) and "'hill'" in str(info.value)
    assert "loglog_topk" in str(info.value) and "mle_ks" in str(info.value)


def test_ww_measures_with_the_configured_estimator():
    torch.manual_seed(0)
    for estimator, expected in (("loglog_topk", lambda e: tail_exponent_loglog(e, 10)),
                                ("mle_ks", lambda e: tail_exponent(e, 10, 10))):
        ww = _ww(estimator=estimator)
        eigs = spectrum(ww.probes[0])
        assert eigs.size == 30  # fc1 is 30 x 40
        assert ww.measure() == expected(eigs)
    assert _ww().measure() != _ww(estimator="mle_ks").measure()


def test_ww_traces_the_probed_weights_norm_at_its_probes():
    """The trace's ww_probe_norm is the probed weights' Frobenius norm, measured when the
    controller probes (the noise feedback shows in it) and NaN between probes."""
    ww = _ww(probe_every=2)
    with torch.no_grad():
        ww.probes[0].weight.copy_(torch.diag(torch.tensor([3.0] * 30)).repeat(1, 2)[:, :40])
    expected = float(ww.probes[0].weight.norm())  # 40 entries of 3
    assert expected == pytest.approx(3 * np.sqrt(40))
    ww.update(StepRelease(step=1, noisy_grad=[]))
    assert np.isnan(ww.trace_row()["ww_probe_norm"])
    ww.update(StepRelease(step=2, noisy_grad=[]))
    assert ww.trace_row()["ww_probe_norm"] == pytest.approx(expected, rel=1e-5)


def _ww(**options):
    model = torch.nn.Sequential()
    model.add_module("fc1", torch.nn.Linear(40, 30))
    ctx = MethodContext(1.0, ["fc1"], options=get_method("ww_dp_sgd").parse_options(
        {"probe": "fc1", **options}), model=model)
    return WWDPSGD(ctx)


def test_ww_controller_sign_saturation_ema_and_clamp():
    ww = _ww(beta=0.5, kappa=0.1, r=2.0, zeta_star=4.0, c_max=1.1)
    assert ww.zeta_hat == 4.0  # EMA starts at zeta*
    ww.control(6.0)            # zeta_hat = 0.5*4 + 0.5*6 = 5: error 0.5 -> C = e^0.05
    assert ww.zeta_hat == pytest.approx(5.0) and ww.signal == pytest.approx(0.5)
    assert ww.clip_threshold == pytest.approx(np.exp(0.05))
    ww.control(100.0)  # zeta_hat = 52.5: saturates at +1 -> log C = 0.15 > log 1.1: clamped
    assert ww.signal == 1.0 and ww.clip_threshold == pytest.approx(1.1)
    assert ww.clamp_hits == {"min": 0, "max": 1}
    low = _ww(beta=0.0, kappa=0.1)
    low.control(1.0)           # below the centre: C shrinks
    assert low.signal == pytest.approx(-1.0) and low.clip_threshold == pytest.approx(np.exp(-0.1))


def test_ww_with_zero_gain_is_the_clamp_alone():
    """kappa = 0 (the clamp-only ablation): C_0 outside [c_min, c_max] goes to the nearest bound
    at the first probe and stays there whatever the spectrum says; inside, C never moves."""
    outside = _ww(kappa=0.0, c_min=1.0, c_max=3.0)
    outside.clip_threshold, outside.log_c = 0.25, np.log(0.25)
    for zeta in (100.0, 1.0, 6.0):
        outside.control(zeta)
        assert outside.clip_threshold == pytest.approx(1.0)
    assert outside.clamp_hits == {"min": 1, "max": 0}  # once: C then sits on the bound
    inside = _ww(kappa=0.0, c_min=0.5, c_max=3.0)
    for zeta in (100.0, 1.0):
        inside.control(zeta)
        assert inside.clip_threshold == pytest.approx(1.0)
    assert inside.clamp_hits == {"min": 0, "max": 0}


def test_ww_without_anti_windup_winds_u_on_while_c_sits_on_the_clamp():
    """Algorithm 1 (anti_windup false) clamps C only: from C_0 = 0.25 under [1, 3] with kappa
    0.5 and the signal saturated at +1, u = log 0.25 + 0.5 k = -1.386 + 0.5 k after k probes:
    C = exp(u) is below 1 (clamped to 1) until k = 3 (u = 0.114, C = 1.12). With anti-windup
    u jumps to log 1 = 0 at the first probe: C = e^0.5 = 1.65 at the second."""
    literal = _ww(beta=0.0, kappa=0.5, c_min=1.0, c_max=3.0, anti_windup=False)
    ours = _ww(beta=0.0, kappa=0.5, c_min=1.0, c_max=3.0)
    for ww in (literal, ours):
        ww.clip_threshold, ww.log_c = 0.25, np.log(0.25)
    seen = {"literal": [], "ours": []}
    for _ in range(3):
        for name, ww in (("literal", literal), ("ours", ours)):
            ww.control(100.0)  # zeta_hat = 100: signal +1
            seen[name].append(ww.clip_threshold)
    assert seen["literal"] == pytest.approx([1.0, 1.0, np.exp(np.log(0.25) + 1.5)])
    assert literal.log_c == pytest.approx(np.log(0.25) + 1.5)
    assert seen["ours"] == pytest.approx([1.0, np.exp(0.5), np.exp(1.0)])


def test_ww_u_winding_far_does_not_overflow():
    ww = _ww(beta=0.0, kappa=1000.0, c_min=1.0, c_max=3.0, anti_windup=False)
    ww.control(100.0)  # u = 1000: exp(u) would overflow; C sits on the clamp
    assert ww.clip_threshold == 3.0 and ww.log_c == pytest.approx(1000.0)


def test_ww_probes_only_every_k_steps_and_ignores_empty_batches():
    ww = _ww(probe_every=3)
    measured = []
    ww.measure = lambda: measured.append(1) or 4.5
    for step in range(1, 10):
        ww.update(StepRelease(step=step, noisy_grad=[]))
    assert len(measured) == 3  # steps 3, 6, 9
    before = ww.state_dict()
    # the state only changes through update (which an empty batch reaches too: its release
    # is the noise alone, see test_dp_step)
    assert ww.state_dict() == before


def test_ww_probe_layer_must_exist(tiny_raw):
    with pytest.raises(ConfigError, match="methods.ww_dp_sgd.probe: 'fc9'"):
        parse_params(tiny_raw(methods={"ww_dp_sgd": {"probe": "fc9"}}))
    with pytest.raises(ConfigError, match="methods.ww_dp_sgd.beta"):
        parse_params(tiny_raw(methods={"ww_dp_sgd": {"beta": 1.0}}))
    with pytest.raises(ConfigError, match="methods.ww_dp_sgd.probe_every"):
        parse_params(tiny_raw(methods={"ww_dp_sgd": {"probe_every": 0}}))


def test_spectrum_is_the_squared_singular_values():
    from dpclip.methods.ww_dp_sgd import spectrum

    layer = torch.nn.Linear(7, 4)
    expected = np.sort(torch.linalg.svdvals(layer.weight.detach().double()).numpy() ** 2)
    assert np.allclose(np.sort(spectrum(layer)), expected)
    conv = torch.nn.Conv2d(3, 5, 3)  # reshaped to 5 x 27
    assert spectrum(conv).shape == (5,)



def test_adaclip_controller_by_hand():
    ada = get_method("adaclip")(MethodContext(1.0, ["fc1"], expected_batch=10.0))
    # half of the records unclipped = the target quantile: C does not move
    ada.update(StepRelease(step=1, noisy_grad=[], extras={"unclipped_fraction": 0.5}))
    assert ada.clip_threshold == pytest.approx(1.0)
    # all unclipped: C shrinks by exp(-eta_C * 0.5) with eta_C = 0.05
    ada.update(StepRelease(step=2, noisy_grad=[], extras={"unclipped_fraction": 1.0}))
    assert ada.clip_threshold == pytest.approx(np.exp(-0.025))


def test_adaclip_release_is_the_centred_count_over_the_expected_batch():
    ada = get_method("adaclip")(MethodContext(1.0, ["fc1"], expected_batch=4.0,
                                              options=get_method("adaclip").parse_options(
                                                  {"count_noise_fraction": 1e-12})))
    norms = torch.tensor([[0.5], [0.9], [2.0]])  # two unclipped of three, B = 4
    released = ada.release_extras(norms, NoiseSources.seeded(0))
    # ((1 - .5) + (1 - .5) + (0 - .5)) / 4 + .5 = 0.625 (not 2/3: |L_t| stays private)
    assert released["unclipped_fraction"] == pytest.approx(0.625)


def test_adaclip_count_noise_too_small_for_the_split_names_its_key():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(100, 6)).astype(np.float32), rng.integers(0, 3, size=100)
    cfg = TrainConfig.of(method="adaclip", target_epsilon=4.0, delta=1e-5, accountant="rdp",
                         epochs=2, batch_size=10, lr=0.1, optimizer="sgd", momentum=0.0,
                         clip_norm=1.0, seed=0, device="cpu", model="mlp", hidden=(8,),
                         method_options={"count_noise_fraction": 0.01})
    from dpclip.errors import DpclipError

    with pytest.raises(DpclipError, match="methods.adaclip.count_noise_fraction"):
        train_model(x, y, (6,), 3, cfg, progress=False)


def test_adaclip_opacus_runs_opacus_optimizer_and_is_flagged():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(200, 6)).astype(np.float32), rng.integers(0, 3, size=200)
    cfg = TrainConfig.of(method="adaclip_opacus", target_epsilon=4.0, delta=1e-5,
                         accountant="rdp", epochs=3, batch_size=20, lr=0.1, optimizer="sgd",
                         momentum=0.0, clip_norm=1.0, seed=0, device="cpu", model="mlp",
                         hidden=(8,))
    result = train_model(x, y, (6,), 3, cfg, progress=False)
    p = result.privacy
    assert p["dp_guarantee"] is False  # the literal variant: epsilon is not a guarantee
    # Opacus's adjusted noise multiplier (sigma^-2 - (2 sigma_u)^-2)^(-1/2), sigma_u = 0.05 B
    assert p["sigma_train"] == pytest.approx((p["noise_multiplier"] ** -2 - 0.25) ** -0.5)
    thresholds = [row["clip_threshold"] for row in result.trace]
    assert len(set(thresholds)) > 1  # Opacus moved C, and the trace follows it


def test_a_section_that_is_no_methods_is_refused_by_name(tiny_raw):
    """The rules that once shared a section (dc_sgd, adaclip) read their own only."""
    for section in ("dcsgd", "dc_sgd"):
        with pytest.raises(ConfigError, match=rf"methods\.{section}"):
            parse_params(tiny_raw(methods={section: {"bins": 12}}))

def test_adaclip_moves_c_on_an_empty_batch_from_the_released_count_alone():
    """An empty Poisson batch releases the count's noise alone; the controller reads it as
    usual (docs/privacy.md, "Empty batches"), so C moves although no record was seen."""
    from conftest import gaussian_records, tiny_train_config

    from dpclip.train import build_run

    x, y = gaussian_records(100)
    run = build_run((6,), 3, len(x), tiny_train_config(
        "adaclip", method_options={"count_noise_fraction": 0.2}))
    run.step(torch.as_tensor(x), torch.as_tensor(y), [], epoch=1)
    assert run.method.clip_threshold != 1.0


def test_options_reach_a_method_typed_once_and_a_raw_mapping_is_refused():
    import pickle

    cls = get_method("ww_dp_sgd")
    with pytest.raises(TypeError, match="WWDPSGDOptions"):
        cls(MethodContext(1.0, ["fc1"], options={"kappa": 0.1}))
    options = cls.parse_options({"kappa": 0.1})
    assert cls(MethodContext(1.0, ["fc1"], options=options)).options.kappa == 0.1
    # a Dask worker unpickles the parameters: still an instance of the method's own model
    assert isinstance(pickle.loads(pickle.dumps(options)), cls.options_model())
    assert cls(MethodContext(1.0, ["fc1"])).options == cls.default_options()
