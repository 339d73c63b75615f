"""The audit stage's choices: which runs it audits (a DP claim of the add/remove kind) and the
canaries' seeds (fixed by audit.seed, distinct per run and kind)."""

from __future__ import annotations

from dpclip.pipeline.params import parse_params
from dpclip.audit.status import why_not_audited
from dpclip.stages.audit import canary_seed


def test_only_add_remove_claims_are_audited():
    assert why_not_audited("dp_sgd") is None
    assert why_not_audited("lm_dp_sgd") is None
    assert why_not_audited("non_private") == "no DP claim"
    assert why_not_audited("sanitize").startswith("replace_one_features adjacency")
    assert why_not_audited("adaclip_opacus", kind="whitebox") == \
        "run kind 'opacus_optimizer' has no shared DP step"
    assert why_not_audited("adaclip_opacus", kind="blackbox") is None


def test_the_reason_follows_the_runs_options_as_its_record_does():
    """sanitize under the paper's accounting claims add/remove adjacency (its record says so):
    a black-box audit tests that claim, and the white-box audit has no DP step to use. The
    reason once came from the class and named replace_one_features for every run."""
    from dpclip.methods import get_method

    sanitize = get_method("sanitize")
    paper = sanitize.parse_options({"accounting": "paper"})
    assert sanitize.privacy_claim(paper).adjacency == "add_remove"
    assert sanitize.privacy_claim(paper).dp_guarantee is False
    assert why_not_audited("sanitize", paper, "blackbox") is None
    assert why_not_audited("sanitize", paper, "whitebox") == \
        "run kind 'sanitize' has no shared DP step"
    assert why_not_audited("sanitize", sanitize.default_options(), "blackbox").startswith(
        "replace_one_features adjacency")
    lm = get_method("lm_dp_sgd")
    assert lm.privacy_claim(lm.parse_options({"weights": "batch"})).dp_guarantee is False
    assert lm.privacy_claim().dp_guarantee is True


def test_canary_seeds_are_fixed_and_distinct(tiny_raw):
    params = parse_params(tiny_raw())
    other = parse_params(tiny_raw(audit={"seed": 1}))
    seeds = {canary_seed(params, run, kind) for run in ("a", "b") for kind in ("whitebox",
                                                                              "blackbox")}
    assert len(seeds) == 4
    assert canary_seed(params, "a", "whitebox") == canary_seed(params, "a", "whitebox")
    assert canary_seed(other, "a", "whitebox") != canary_seed(params, "a", "whitebox")


def test_the_audit_trains_on_streams_of_its_own(tmp_path, tiny_raw, write_params, monkeypatch):
    """A re-audit: the white-box audit trained with the released run's own noise and batches
    (RMS of the two models' difference 0.0068, the canaries' effect alone)."""
    from conftest import prepared_project

    from dpclip.layout import Layout
    from dpclip.run_keys import RunKey
    from dpclip.pipeline.inputs import run_inputs
    from dpclip.stages import audit as stage

    prepared_project(tmp_path, tiny_raw(), write_params)
    params = parse_params(tiny_raw())
    layout = Layout(tmp_path)
    key = RunKey("dp_sgd", params.privacy.target_epsilons[0], "iid", 0)
    released = run_inputs(params, key, layout).cfg.stream_key()
    seen = {}
    monkeypatch.setattr(stage, "audit_whitebox", lambda run, *a, **k: seen.setdefault(
        "whitebox", run.cfg.stream_key()))
    monkeypatch.setattr(stage, "audit_blackbox", lambda *a, **k: seen.setdefault(
        "blackbox", a[6].stream_key()))
    data = run_inputs(params, key, layout)
    for kind in ("whitebox", "blackbox"):
        stage._audit_kind(params, key, kind, layout, data)
    assert len({released, seen["whitebox"], seen["blackbox"]}) == 3


def test_the_printed_line_says_a_refuted_epsilon_that_was_no_guarantee():
    """A literal-paper variant's epsilon (no DP guarantee) refuted by its audit is no privacy
    bug, but the line said nothing of it; a guarantee refuted is REFUTED."""
    from dpclip.stages.audit import describe

    row = {"applicable": True, "epsilon_lower_bound": 9.5, "claimed_epsilon": 8.0}
    literal = {"blackbox": {**row, "violated": False, "refutes_reported_epsilon": True}}
    sound = {"blackbox": {**row, "violated": True, "refutes_reported_epsilon": True}}
    assert describe(literal, None) == \
        "blackbox eps >= 9.500 (claimed 8.000, refuted: no DP guarantee claimed)"
    assert describe(sound, None) == "blackbox eps >= 9.500 (claimed 8.000, REFUTED)"


def test_sanitize_under_the_papers_accounting_gets_a_black_box_bound_never_a_bug():
    """Its record claims add/remove adjacency with no guarantee: the black-box audit trains the
    run with input canaries and gives a bound, and a bound above the claim is no privacy bug
    (violated stays false)."""
    from conftest import gaussian_records, tiny_train_config

    from dpclip.audit.run import audit_blackbox

    x, y = gaussian_records(100)
    px, py = gaussian_records(60, seed=1)
    cfg = tiny_train_config("sanitize", method_options={
        "n": 2, "public_steps": 20, "epochs": 3, "accounting": "paper"})
    result = audit_blackbox(x, y, px, py, (6,), 3, cfg, m=20, seed=0, public=(px, py))
    assert result["applicable"] and result["violated"] is False
    assert result["claimed_epsilon"] is not None and result["epsilon_lower_bound"] >= 0
