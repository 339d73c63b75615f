"""Accounting: our epsilon equals Opacus's accountants; the noise search reaches the target
without passing it; the sigma split; the budget guard."""

from __future__ import annotations

import math

import pytest
from opacus.accountants import PRVAccountant, RDPAccountant

from dpclip.errors import DpclipError
from dpclip.privacy import (BudgetGuard, ExtraQuery, combined_sigma, epsilon_of,
                            noise_for_epsilon, split_sigma)


@pytest.mark.parametrize("sigma, q, steps", [(1.0, 0.01, 1000), (1.3, 0.089, 330),
                                             (0.8, 0.5, 20), (2.0, 1.0, 5)])
def test_rdp_epsilon_equals_opacus_accountant(sigma, q, steps):
    accountant = RDPAccountant()
    for _ in range(steps):
        accountant.step(noise_multiplier=sigma, sample_rate=q)
    assert epsilon_of("rdp", [(sigma, q, steps)], 1e-5) == pytest.approx(
        accountant.get_epsilon(delta=1e-5), rel=1e-12)


def test_rdp_mixed_history_equals_opacus_accountant():
    history = [(1.0, 0.05, 100), (1.5, 0.05, 50), (1.0, 0.1, 10)]
    accountant = RDPAccountant()
    accountant.history = list(history)
    assert epsilon_of("rdp", history, 1e-6) == pytest.approx(accountant.get_epsilon(1e-6))


def test_prv_epsilon_equals_opacus_accountant():
    accountant = PRVAccountant()
    accountant.history = [(1.1, 0.05, 200)]
    assert epsilon_of("prv", [(1.1, 0.05, 200)], 1e-5) == pytest.approx(
        accountant.get_epsilon(delta=1e-5), rel=1e-9)


@pytest.mark.parametrize("kind", ["rdp", "prv"])
@pytest.mark.parametrize("target", [1.0, 8.0])
def test_noise_for_target_reaches_it_without_exceeding(kind, target):
    q, steps, delta, tol = 0.05, 400, 1e-5, 0.01
    sigma = noise_for_epsilon(target, delta, q, steps, kind, tol)
    eps = epsilon_of(kind, [(sigma, q, steps)], delta)
    assert eps <= target
    assert eps >= target - tol - 1e-9


def test_a_remembered_sigma_is_the_searched_one_and_is_checked_before_use(tmp_path,
                                                                          monkeypatch):
    """The memo across processes gives the sigma the search gives (without searching), and
    a memo entry that would pass the target, or fall short of it by more than the tolerance,
    is searched again."""
    import json

    from opacus.accountants import utils as opacus_utils

    from dpclip import privacy

    monkeypatch.delenv("DPCLIP_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert privacy.noise_memo_path() == tmp_path / "dpclip" / "noise_multipliers.json"
    monkeypatch.setenv("DPCLIP_CACHE", str(tmp_path / "own"))
    args = (4.0, 1e-5, 0.05, 300, "rdp", 0.01)
    noise_for_epsilon.cache_clear()
    searched = noise_for_epsilon(*args)
    memo = privacy.noise_memo_path()
    assert memo.parent == tmp_path / "own" and list(json.loads(memo.read_text()).values()) \
        == [searched]

    searches = []
    real_search = opacus_utils.get_noise_multiplier
    monkeypatch.setattr(opacus_utils, "get_noise_multiplier",
                        lambda **kw: searches.append(kw) or real_search(**kw))
    noise_for_epsilon.cache_clear()
    assert noise_for_epsilon(*args) == searched and searches == []
    key = next(iter(json.loads(memo.read_text())))
    for wrong in (searched * 0.9, searched * 1.5):  # epsilon above target; far below it
        memo.write_text(json.dumps({key: wrong}))
        noise_for_epsilon.cache_clear()
        assert noise_for_epsilon(*args) == searched
    assert len(searches) == 2
    noise_for_epsilon.cache_clear()


def test_sigma_split_round_trip_and_paper_formula():
    extras = [ExtraQuery("hist", 1.0, 10.0)]
    sigma_t = split_sigma(1.2, extras)
    # sigma_T = (sigma^-2 - sigma_H^-2)^(-1/2), by hand
    assert sigma_t == pytest.approx((1.2 ** -2 - 10.0 ** -2) ** -0.5)
    assert combined_sigma(sigma_t, extras) == pytest.approx(1.2)
    assert split_sigma(1.2, []) == pytest.approx(1.2)


def test_sigma_split_rejects_too_little_extra_noise():
    with pytest.raises(DpclipError, match="hist"):
        split_sigma(2.0, [ExtraQuery("hist", 1.0, 1.5)])


def test_budget_guard_stops_exactly_before_the_target():
    sigma, q, delta = 1.0, 0.1, 1e-5
    target = epsilon_of("rdp", [(sigma, q, 50)], delta)
    guard = BudgetGuard("rdp", delta, target)
    steps = 0
    while guard.allows(sigma, q) and steps < 1000:
        guard.record(sigma, q)
        steps += 1
    assert steps == 50
    assert guard.epsilon() <= target
    assert not guard.allows(sigma, q)


def test_budget_guard_horizon_approval_matches_step_by_step():
    sigma, q, delta = 1.0, 0.1, 1e-5
    target = epsilon_of("rdp", [(sigma, q, 30)], delta) + 1e-9
    guard = BudgetGuard("rdp", delta, target)
    steps = 0
    while guard.allows(sigma, q, horizon=100):
        guard.record(sigma, q)
        steps += 1
    assert steps == 30


def test_non_private_guard_never_blocks():
    guard = BudgetGuard("rdp", 1e-5, None)
    assert guard.allows(0.0, 1.0) and guard.epsilon() is None
    assert math.isfinite(1.0)
