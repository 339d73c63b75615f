"""The short summary table (what `make run` prints last): one row per configuration over its
seeds, numbers worked out by hand, and never wider than 120 characters."""

from __future__ import annotations

import math

import pandas as pd

from dpclip.reporting.seed_stats import paired_comparison, seed_summary
from dpclip.reporting.summary_table import MAX_WIDTH, summary_frame, text_table

T_975_DF5 = 2.570582  # Student t quantile, 0.975, 5 degrees of freedom (tables)


def _run(method, seed, accuracy, *, epsilon=7.99, target=8.0, adjacency="add_remove",
         guarantee=True, ece=0.05, auc=0.55, audit=1.5):
    return {"method": method, "target_epsilon": target, "alpha": "iid", "seed": seed,
            "epsilon": epsilon, "adjacency": adjacency, "dp_guarantee": guarantee,
            "accuracy": accuracy, "ece": ece, "attack": "lira", "attack_auc": auc,
            "attack_tpr_at_low_fpr": 0.01, "audit_whitebox": audit, "audit_blackbox": None}


def _summary(rows):
    table = pd.DataFrame(rows)
    return summary_frame(table, seed_summary(table), paired_comparison(table))


def test_six_seeds_give_the_t_interval_and_a_decided_verdict():
    base = [0.90, 0.91, 0.92, 0.90, 0.93, 0.91]
    rows = [_run("dp_sgd", s, a) for s, a in enumerate(base)]
    # better on every seed: the exact sign-flip test's p is 2/64 = 0.03125 (one method: no Holm)
    rows += [_run("auto_s", s, a + 0.02 + 0.001 * s, audit=1.0 + s) for s, a in enumerate(base)]
    summary = _summary(rows).set_index("method")
    sd = pd.Series(base).std(ddof=1)
    half = T_975_DF5 * sd / math.sqrt(6)
    assert math.isclose(summary.loc["dp_sgd", "accuracy_high"] - summary.loc["dp_sgd", "accuracy"],
                        half, rel_tol=1e-5)
    assert summary.loc["auto_s", "vs_dp_sgd"] == "acc better"
    assert summary.loc["dp_sgd", "vs_dp_sgd"] == "(baseline)"
    text = text_table(summary.reset_index())
    (line,) = [x for x in text.splitlines() if x.startswith("dp_sgd")]
    assert f"{sum(base) / 6:.3f} ± {half:.3f}" in line
    (line,) = [x for x in text.splitlines() if x.startswith("auto_s")]
    assert "1.00–6.00" in line  # the audited bounds' range over seeds, not their mean


def test_the_epsilon_shown_is_the_largest_over_seeds():
    rows = [_run("dp_sgd", 0, 0.9, epsilon=7.5), _run("dp_sgd", 1, 0.9, epsilon=7.99)]
    assert _summary(rows)["epsilon"].tolist() == [7.99]


def test_one_seed_marks_epsilons_of_another_notion_or_no_guarantee():
    rows = [_run("dp_sgd", 0, 0.9), _run("sanitize", 0, 0.92, adjacency="replace_one_features",
                                          audit=None),
            _run("sanitize_paper", 0, 0.98, guarantee=False, audit=None),
            _run("non_private", 0, 0.97, epsilon=None, target=None, guarantee=False, audit=None)]
    text = text_table(_summary(rows))
    lines = {x.split()[0]: x for x in text.splitlines()[1:]}
    assert "7.99*" in lines["sanitize"] and "7.99!" in lines["sanitize_paper"]
    assert "1 seed: untested" in lines["sanitize"]
    assert "±" not in text  # one seed: no interval
    assert lines["non_private"].split()[1] == "—"  # no target epsilon


def test_two_seeds_say_they_are_too_few():
    rows = [_run(m, s, 0.9 + 0.01 * s) for m in ("dp_sgd", "ww_dp_sgd") for s in (0, 1)]
    assert _summary(rows).set_index("method").loc["ww_dp_sgd", "vs_dp_sgd"] == \
        "2 seeds: too few (< 6)"


def test_holm_over_several_methods_needs_more_seeds_than_one_method():
    """Two methods, each better on all 6 seeds: p = 2/64 each, Holm's adjusted p 2 x 2/64 =
    0.0625 for the first, so nothing reaches 5%, and 7 seeds are the least that can (2 2^-6
    <= 0.05); one method alone would be decided ("acc better" in the test above)."""
    base = [0.90, 0.91, 0.92, 0.90, 0.93, 0.91]
    rows = [_run("dp_sgd", s, a) for s, a in enumerate(base)]
    rows += [_run(m, s, a + 0.02 + 0.001 * s) for m in ("auto_s", "dp_psac")
             for s, a in enumerate(base)]
    verdicts = _summary(rows).set_index("method")["vs_dp_sgd"]
    assert verdicts["auto_s"] == verdicts["dp_psac"] == "6 seeds: too few (< 7)"


def test_no_line_is_wider_than_120_characters():
    rows = [_run("dp_sgd", s, 0.9 + 0.01 * s) for s in range(6)]
    rows += [_run(f"a_plugin_method_with_a_rather_long_name_{i}", s, 0.95 + 0.001 * s - 0.01 * i,
                  ece=0.01 + 0.001 * s, auc=0.5 - 0.001 * s) for i in range(3) for s in range(6)]
    text = text_table(_summary(rows))
    assert max(len(line) for line in text.splitlines()) <= MAX_WIDTH
    assert "…" in text  # the long verdict (acc, ECE, AUC) was cut to fit


def test_the_attacks_tpr_names_the_fpr_it_is_read_at():
    """What a user could not tell: TPR at 2.8% FPR on the default data, at 10% on a 500-row
    CSV. 10 false positives of 357 holdout records: FPR 10 / 357 = 2.8%."""
    rows = [{**_run("dp_sgd", s, 0.9), "attack_low_fpr": 10 / 357} for s in range(2)]
    text = text_table(_summary(rows))
    assert "lira 0.550 / 0.010 @2.8%" in text and "attack AUC / TPR @FPR" in text


def test_a_dash_in_the_attack_or_audit_column_is_explained_below_the_table():
    """An attack that did not run (no reference models yet) and a run without an audit show
    "—"; a reader once found the audit's dash explained and the attack's not."""
    from dpclip.reporting.summary_table import legend

    rows = [_run("adaclip_opacus", s, 0.9, auc=None, audit=None) for s in range(2)]
    row = text_table(_summary(rows)).splitlines()[1]
    assert row.count("—") >= 2  # the attack and the audit
    text = " ".join(legend().split())
    assert "— = it did not run: the metrics' mia.not_run says why" in text
    assert "no audit kind that fits the method" in text
