"""Stratified splits and the Dirichlet sampler: proportions, disjointness, no repeats."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpclip.data.splits import dirichlet_subsample, largest_remainder, stratified_split


def test_largest_remainder_hand_case():
    # 10 * (0.45, 0.35, 0.2) = 4.5, 3.5, 2 -> floors 4, 3, 2 (sum 9); the one left unit goes to
    # the larger fractional part, a tie at 0.5 broken by order -> (5, 3, 2)
    assert largest_remainder(10, np.array([0.45, 0.35, 0.2])).tolist() == [5, 3, 2]
    # caps are respected
    assert largest_remainder(10, np.array([0.5, 0.5]), caps=np.array([3, 10])).tolist() == [3, 7]


def test_stratified_split_is_a_disjoint_cover_with_class_balance():
    y = np.repeat(np.arange(4), [100, 50, 30, 20])
    parts = stratified_split(y, {"a": 0.4, "b": 0.2, "c": 0.2, "d": 0.2}, seed=1)
    everything = np.concatenate(list(parts.values()))
    assert sorted(everything.tolist()) == list(range(len(y)))
    assert np.bincount(y[parts["a"]]).tolist() == [40, 20, 12, 8]
    again = stratified_split(y, {"a": 0.4, "b": 0.2, "c": 0.2, "d": 0.2}, seed=1)
    assert all(np.array_equal(parts[k], again[k]) for k in parts)


@settings(max_examples=60, deadline=None)
@given(alpha=st.sampled_from([0.05, 0.1, 0.3, 0.5, 1.0, 10.0]), seed=st.integers(0, 10_000),
       counts=st.lists(st.integers(5, 400), min_size=2, max_size=10))
def test_dirichlet_subsample_matches_proportions_without_repeats(alpha, seed, counts):
    y = np.repeat(np.arange(len(counts)), counts)
    chosen, pi = dirichlet_subsample(y, len(counts), alpha, seed)
    # never repeats a record
    assert len(np.unique(chosen)) == len(chosen)
    hist = np.bincount(y[chosen], minlength=len(counts))
    size = len(chosen)
    # the largest subset matching pi: M = min_k floor(n_k / pi_k) (capped at N)
    expected = min(int(np.floor(min(n / p for n, p in zip(counts, pi) if p > 0) + 1e-9)),
                   len(y))
    assert size == expected
    # each class within one record of M * pi_k (largest-remainder rounding), and within caps
    assert np.all(np.abs(hist - size * pi) <= 1.0 + 1e-9)
    assert np.all(hist <= np.array(counts))


def test_dirichlet_small_alpha_is_skewed_and_large_alpha_is_near_uniform():
    y = np.repeat(np.arange(10), 500)
    _, pi_small = dirichlet_subsample(y, 10, 0.1, seed=3)
    _, pi_large = dirichlet_subsample(y, 10, 100.0, seed=3)
    assert pi_small.max() > 0.3
    assert np.abs(pi_large - 0.1).max() < 0.05


def test_dirichlet_rejects_non_positive_alpha():
    with pytest.raises(Exception, match="partition.alphas"):
        dirichlet_subsample(np.zeros(10, dtype=int), 2, 0.0, seed=0)


def test_max_records_draws_a_stratified_subset_before_the_splits(tmp_path, tiny_raw):
    from dpclip.pipeline.params import parse_params
    from dpclip.layout import Layout
    from dpclip.stage_outputs import load_split
    from dpclip.stages.prepare import prepare

    layout = Layout(tmp_path)
    meta = prepare(parse_params(tiny_raw(data={"dataset": "digits", "max_records": 500})),
                   layout)
    sizes = meta["sizes"]
    assert abs(sum(sizes.values()) - 500) <= 10  # per-class rounding
    indices = np.concatenate([load_split(layout, s)[2] for s in sizes])
    assert len(np.unique(indices)) == len(indices)  # no record twice
    counts = np.bincount(load_split(layout, "target_train")[1])
    assert counts.max() - counts.min() <= 2  # digits' classes stay balanced
    full = prepare(parse_params(tiny_raw()), Layout(tmp_path / "full"))["sizes"]
    assert sum(full.values()) == 1797
