"""The audit stage's choices: which runs it audits (a DP claim of the add/remove kind) and the
canaries' seeds (fixed by audit.seed, distinct per run and kind)."""

from __future__ import annotations

from dpclip.pipeline.params import parse_params
from dpclip.stages.audit import canary_seed, why_not_audited


def test_only_add_remove_claims_are_audited(tiny_raw):
    params = parse_params(tiny_raw())
    assert why_not_audited(params, "dp_sgd") is None
    assert why_not_audited(params, "lm_dp_sgd") is None
    assert why_not_audited(params, "non_private") == "no DP claim"
    assert why_not_audited(params, "sanitize").startswith("replace_one_features adjacency")


def test_canary_seeds_are_fixed_and_distinct(tiny_raw):
    params = parse_params(tiny_raw())
    other = parse_params(tiny_raw(audit={"seed": 1}))
    seeds = {canary_seed(params, run, kind) for run in ("a", "b") for kind in ("whitebox",
                                                                              "blackbox")}
    assert len(seeds) == 4
    assert canary_seed(params, "a", "whitebox") == canary_seed(params, "a", "whitebox")
    assert canary_seed(other, "a", "whitebox") != canary_seed(params, "a", "whitebox")
