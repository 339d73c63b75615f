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
