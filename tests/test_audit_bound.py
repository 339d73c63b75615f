"""The one-run audit's lower bound (Steinke et al. 2023) against numbers worked out by hand and
against the randomized-response mechanism it is tight for."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpclip.audit.bound import audit, epsilon_lower_bound, guesses, p_value


def test_all_guesses_right_without_delta_has_a_closed_form():
    # delta = 0, v = r: p = q^r, so the bound solves q^r = 0.05: q = 0.05^(1/50) = 0.941845,
    # eps = log(q / (1 - q)) = 2.78477
    q = 0.05 ** (1 / 50)
    assert p_value(100, 50, 50, math.log(q / (1 - q)), 0.0) == pytest.approx(0.05)
    assert epsilon_lower_bound(100, 50, 50, 0.0) == pytest.approx(2.78477, abs=1e-4)


def test_the_delta_term_by_hand():
    # r = 2, v = 2, eps = 0 (q = 1/2): beta = 1/4; alpha = max(P[Bin = 1] / 1,
    # P[Bin <= 1] / 2) = max(1/2, 3/8) = 1/2; p = 1/4 + 2 m delta / 2 = 0.25 + 0.1 (m = 10)
    assert p_value(10, 2, 2, 0.0, 0.01) == pytest.approx(0.35)
    assert p_value(10, 2, 2, 0.0, 0.0) == pytest.approx(0.25)


def test_chance_guesses_and_delta_lower_the_bound():
    assert epsilon_lower_bound(1000, 200, 100, 1e-5) == 0.0  # half right: nothing refuted
    strong = epsilon_lower_bound(1000, 200, 190, 0.0)
    assert 0 < epsilon_lower_bound(1000, 200, 190, 1e-4) < strong


def test_guesses_take_the_top_as_in_and_the_bottom_as_out():
    scores = np.array([0.9, 0.1, 0.8, 0.2, 0.5, 0.4])
    included = np.array([True, False, False, False, True, True])
    # r = 4: IN guesses 0.9 (in, right), 0.8 (out, wrong); OUT guesses 0.1, 0.2 (both right)
    assert guesses(scores, included, 4) == (4, 3)
    assert guesses(scores, included, 3) == (3, 2)  # IN: 0.9, 0.8; OUT: 0.1


def test_the_bound_is_valid_for_randomized_response():
    """eps-DP randomized response tells each canary's inclusion correctly with probability
    e^eps / (1 + e^eps), the most an eps-DP mechanism allows: the 95% bound must exceed eps in
    at most about 5% of audits (here: 400 audits of 200 canaries, at most 8% allowed)."""
    rng = np.random.default_rng(0)
    eps, m = 1.0, 200
    q = math.exp(eps) / (1 + math.exp(eps))
    above, bounds = 0, []
    for _ in range(400):
        included = rng.random(m) < 0.5
        told = np.where(rng.random(m) < q, included, ~included)
        scores = told + rng.random(m) * 0.1  # ties broken at random
        result = audit(scores, included, delta=0.0)
        above += result["epsilon_lower_bound"] > eps
        bounds.append(result["epsilon_lower_bound"])
    assert above / 400 <= 0.08
    assert np.median(bounds) > 0.3  # and it has power: most audits refute a good part of eps


def test_a_perfect_attack_reaches_the_guess_limit():
    included = np.arange(100) % 2 == 0
    result = audit(included.astype(float), included, delta=1e-5)
    assert result["correct"] == result["guesses"] == 100
    assert result["epsilon_lower_bound"] > 3.0  # about log(100) minus the confidence's cost
    assert len(result["tried"]) == 4 and result["confidence_each"] == pytest.approx(0.9875)
