"""Issue 5 groundwork: the sanitization layer's mechanism and its per-record accounting."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from dpclip.sanitization import (RDP_ORDERS, clip_activations, funnel_widths,
                                 noise_for_record_epsilon, record_epsilon, sanitize, sensitivity)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 32), clip=st.floats(1e-3, 1e3), drop_p=st.floats(0.0, 0.95),
       scale=st.floats(1e-3, 1e4), signed=st.booleans(), seed=st.integers(0, 2 ** 31 - 1))
def test_two_records_never_differ_by_more_than_the_sensitivity(n, clip, drop_p, scale, signed,
                                                               seed):
    gen = torch.Generator().manual_seed(seed)
    a, b = (torch.randn(1, n, generator=gen, dtype=torch.float64) * scale for _ in range(2))
    keep = (torch.rand(1, n, generator=gen) >= drop_p).double()  # the mask: drawn first
    gap = ((clip_activations(a, clip, signed) - clip_activations(b, clip, signed)) * keep).norm()
    assert gap <= sensitivity(clip, keep.sum(dim=1), signed)[0] * (1 + 1e-12)


def test_noise_std_is_sigma_clip_sqrt_kept_units():
    gen = torch.Generator().manual_seed(0)
    z = torch.zeros(4000, 16)  # clipped to 0: the output is the noise on kept units
    out, kept = sanitize(z, clip=0.5, drop_p=0.0, sigma=1.5, generator=gen)
    assert torch.all(kept == 16)
    assert out.std().item() == pytest.approx(1.5 * 0.5 * math.sqrt(16), rel=0.02)
    out, kept = sanitize(z, clip=0.5, drop_p=0.5, sigma=1.5, generator=gen)
    assert torch.all((out != 0).sum(dim=1) == kept)  # dropped units get no noise
    per_unit = out / kept.clamp_min(1).sqrt()[:, None]  # divide by each record's sqrt(k)
    assert per_unit[out != 0].std().item() == pytest.approx(1.5 * 0.5, rel=0.02)
    assert kept.float().mean().item() == pytest.approx(8.0, rel=0.02)


def test_record_epsilon_equals_the_rdp_formula_by_hand():
    # sigma 2, 3 releases, delta 1e-5: RDP(alpha) = 3 alpha / (2 * 4); Opacus's conversion
    # eps(alpha) = RDP - (log delta + log alpha) / (alpha - 1) + log((alpha - 1) / alpha)
    delta = 1e-5
    by_hand = min(3 * a / 8 - (math.log(delta) + math.log(a)) / (a - 1) + math.log((a - 1) / a)
                  for a in RDP_ORDERS)
    assert record_epsilon(2.0, 3, delta) == pytest.approx(by_hand, rel=1e-12)
    assert record_epsilon(2.0, 0, delta) == 0.0


def test_record_epsilon_bounds_the_exact_gaussian_composition():
    # E releases at sigma compose to one Gaussian with mu = sqrt(E) / sigma; its exact delta at
    # the RDP epsilon (Balle and Wang 2018) must not exceed the target delta
    sigma, uses, delta = 3.0, 10, 1e-5
    eps = record_epsilon(sigma, uses, delta)
    mu = math.sqrt(uses) / sigma
    exact = norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu)
    assert exact <= delta
    assert eps < 1.25 * _exact_epsilon(mu, delta)  # and RDP is not far above the truth


def _exact_epsilon(mu: float, delta: float) -> float:
    lo, hi = 0.0, 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        d = norm.cdf(mu / 2 - mid / mu) - math.exp(mid) * norm.cdf(-mu / 2 - mid / mu)
        lo, hi = (mid, hi) if d > delta else (lo, mid)
    return hi


def test_noise_for_a_target_epsilon_stays_within_it():
    sigma = noise_for_record_epsilon(4.0, 1e-5, uses=20)
    assert 3.96 <= record_epsilon(sigma, 20, 1e-5) <= 4.0
    assert record_epsilon(sigma, 10, 1e-5) < record_epsilon(sigma, 20, 1e-5)  # stopping early


def test_funnel_widths():
    assert funnel_widths(8) == [64, 32, 16, 8]
    with pytest.raises(ValueError, match="methods.sanitize.n: 0"):
        funnel_widths(0)
    assert np.all(np.diff(funnel_widths(3)) < 0)
