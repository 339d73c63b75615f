"""Every clip factor rounded the safe way (an audit: auto_s's total norm underflowed to 0 in
float32 below about 1e-23 and the factor became C / gamma, 1.8e4 C at gamma 1e-30)."""

from __future__ import annotations

import pytest
import torch
from conftest import shadow_risk_for

from dpclip.errors import ConfigError
from dpclip.methods import get_method
from dpclip.methods.base import MethodContext, clip_factors, total_norms


def test_total_norms_do_not_underflow_and_never_fall_below_the_true_norm():
    tiny = torch.full((3, 2), 1e-23, dtype=torch.float32)
    assert float(tiny.pow(2).sum(dim=1).sqrt()[0]) == 0.0  # what float32 alone gives
    truth = tiny.double().pow(2).sum(dim=1).sqrt()
    assert (total_norms(tiny).double() >= truth).all() and (total_norms(tiny) > 0).all()
    gen = torch.Generator().manual_seed(0)
    norms = torch.rand(2000, 4, generator=gen) * 10.0 ** torch.randint(-20, 20, (2000, 4),
                                                                         generator=gen)
    assert (total_norms(norms).double() >= norms.double().pow(2).sum(dim=1).sqrt()).all()


@pytest.mark.parametrize("name, options", [("dp_sgd", {}), ("auto_s", {"gamma": 1e-12}),
                                           ("auto_s", {"gamma": 0.01}), ("dp_psac", {})])
def test_factor_times_norm_never_exceeds_c_even_by_rounding(name, options):
    gen = torch.Generator().manual_seed(1)
    norms = torch.rand(5000, 2, generator=gen) * 10.0 ** torch.randint(-25, 6, (5000, 2),
                                                                         generator=gen)
    method = get_method(name)(MethodContext(
        0.7, ["fc1", "head"], n_params=100, expected_batch=10.0,
        options=get_method(name).parse_options(options),
        shadow_risk=shadow_risk_for(["fc1", "head"])))
    factors = method.scale(norms)
    scaled = factors.double() * norms.double().pow(2).sum(dim=1).sqrt()
    assert float(scaled.max()) <= 0.7, float(scaled.max() / 0.7 - 1)


def test_clip_factors_round_down():
    totals = torch.tensor([3.0, 7.0, 0.3, 1e-30])
    factors = clip_factors(totals[:, None], 1.0)
    assert (factors.double() * totals.double() <= 1.0).all()


def test_auto_s_gamma_has_a_lower_bound(tiny_raw):
    from dpclip.pipeline.params import parse_params

    with pytest.raises(ConfigError, match="methods.auto_s.gamma"):
        parse_params(tiny_raw(methods={"auto_s": {"gamma": 1e-30}}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lm_dp_sgd_factors_round_down_and_its_shares_sum_in_float64(dtype):
    # a re-audit: 1.000000068 C in float32 and 1.0041 C in bfloat16; the share query (of
    # sensitivity 1) summed in bfloat16 moved by 4.1 at a batch of 1024
    from dpclip.methods.lm_dp_sgd import reweighted_factors
    from dpclip.randomness import NoiseSources

    gen = torch.Generator().manual_seed(2)
    norms = (torch.rand(4096, 3, generator=gen) * 10.0 ** torch.randint(-6, 4, (4096, 3),
                                                                         generator=gen))
    weights = torch.tensor([0.6, 0.0, 0.8], dtype=torch.float64)
    factors = reweighted_factors(norms.to(dtype), 0.9, weights)
    per_record = (factors.double() * norms.to(dtype).double()).square().sum(dim=1).sqrt()
    assert float(per_record.max()) <= 0.9
    method = get_method("lm_dp_sgd")(MethodContext(
        1.0, ["a", "b", "c"], n_params=100, expected_batch=1024.0,
        shadow_risk=shadow_risk_for(["a", "b", "c"])))
    method.bind_noise(0.0, 1.0)
    if method.source != "private":
        pytest.skip("the default weights are not the private query's")
    aligned = torch.tensor([[1.0, 0.3, 0.2]]).repeat(1024, 1).to(dtype) * \
        torch.linspace(1, 1.4, 1024)[:, None].to(dtype)
    everyone = torch.tensor(method.release_extras(aligned, NoiseSources.seeded(0))["layer_shares"],
                            dtype=torch.float64)
    method._totals = None
    without = torch.tensor(method.release_extras(aligned[:-1], NoiseSources.seeded(0))
                           ["layer_shares"], dtype=torch.float64)
    assert float((everyone - without).norm()) <= 1 + 1e-9
