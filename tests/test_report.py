"""The comparison table and its notes: neighbouring notion, noise seeding, epsilon bound kind,
DP-bound margins, the label-only baseline and the data-use page."""

from __future__ import annotations

import pandas as pd
import pytest

from dpclip.pipeline.params import parse_params
from dpclip.files import write_csv_frame, write_json
from dpclip.layout import Layout
from dpclip.stages.evaluate import run_summary
from dpclip.stages.report import COLUMNS, data_use_markdown, report

# the columns other tools read, in their order, before this change
LEGACY = ["run", "method", "dp_guarantee", "target_epsilon", "epsilon", "alpha", "seed",
          "accuracy", "ece", "mce", "brier", "nll", "mia_auc", "mia_balanced_accuracy",
          "mia_tpr_at_fpr_1pct", "mia_tpr_at_fpr_0.1pct", "peak_ir_mia", "peak_ir_layer",
          "noise_multiplier", "c_final", "stopped_epoch", "epsilon_saved"]
ADDED = ["adjacency", "secure_noise", "epsilon_bound", "dp_bound_margin", "dp_bound_violated",
         "label_only_auc", "label_only_auc_unmatched", "audit_whitebox", "audit_blackbox",
         "audit_violated", "lira_auc", "lira_tpr_at_fpr_0.1pct", "rmia_auc",
         "rmia_tpr_at_fpr_0.1pct", "strongest_attack", "strongest_tpr_at_fpr_0.1pct",
         "tpr_bound_at_fpr_0.1pct", "audit_status", "strongest_auc", "test_auc",
         "attack", "attack_auc", "attack_low_fpr", "attack_tpr_at_low_fpr",
         "attack_tpr_at_zero_fp", "c_initial", "c_median", "peak_ir_mia_train",
         "clamp_hits_min", "clamp_hits_max", "clamp_share", "noise_shared",
         "public_accuracy"]
NEW_RUN, OLD_RUN = "sanitize-eps8-0.1-seed0", "dp_sgd-eps8-0.1-seed0"


def _metrics(run: str, method: str, privacy: dict, mia: dict) -> dict:
    return {"run": run, "dataset": "digits", "method": method, "alpha": 0.1, "seed": 0,
            "privacy": {"dp_guarantee": True, "target_epsilon": 8.0, "epsilon": 7.5,
                        "delta": 1e-5, "noise_multiplier": 1.1, **privacy},
            "utility": {"accuracy": 0.9, "ece": 0.05, "mce": 0.1, "brier": 0.2, "nll": 0.3},
            "mia": mia, "clip": {"c_initial": 1.0, "c_final": 1.0, "c_median": 1.0},
            "time": {"train_s": 1.0, "step_s_median": 0.01}, "training": {}}


def _check(margin: float) -> dict:
    return {"checked": True, "violated": margin > 0, "worst_margin": margin}


@pytest.fixture
def reported(tmp_path, tiny_raw):
    params = parse_params(tiny_raw(partition={"alphas": [0.1]},
                                   train={"methods": ["dp_sgd", "sanitize"]}))
    layout = Layout(tmp_path)
    new = _metrics(NEW_RUN, "sanitize",
                   {"adjacency": "replace_one_features", "secure_noise": False,
                    "epsilon_bound": "odometer",
                    "data_use": {"dp_mechanism": "members (target_train partition)",
                                 "encoder": "public shadow_train split | frozen"}},
                   {"loss": {"auc": 0.51, "balanced_accuracy": 0.52, "tpr_at_fpr_1pct": 0.01,
                             "tpr_at_fpr_0.1pct": 0.0, "dp_bound": _check(-0.3)},
                    "ir": {"peak_accuracy": 0.55, "peak_layer": "fc1",
                           "dp_bound": {**_check(-0.1), "layer": "fc1"}},
                    "label_only": {"auc": 0.5, "auc_unmatched": 0.93}})
    new["clip"].update(clamp_hits_min=2, clamp_hits_max=6, clamp_updates=10, clamp_share=0.8)
    # written before this change: no adjacency, seeding, bound kind, data use, label-only;
    # its dp_bound is the old point-wise check, not comparable
    old = _metrics(OLD_RUN, "dp_sgd", {},
                   {"loss": {"auc": 0.95, "balanced_accuracy": 0.94, "tpr_at_fpr_1pct": 0.07,
                             "tpr_at_fpr_0.1pct": 0.0,
                             "dp_bound": {"violated": True, "max_excess": 0.7}}})
    for m in (new, old):
        write_json(layout.metrics(m["run"]), m)
        write_json(layout.summary(m["run"]), run_summary(m))
        write_csv_frame(layout.reliability(m["run"]), pd.DataFrame(
            {"confidence": [0.3, 0.9], "accuracy": [0.25, 0.95], "count": [4, 0]}))
        write_csv_frame(layout.trace(m["run"]), pd.DataFrame({"step": [1],
                                                              "clip_threshold": [1.0]}))
        write_csv_frame(layout.roc(m["run"]), pd.DataFrame({"fpr": [0.0, 1.0],
                                                            "tpr": [0.0, 1.0]}))
    return report(params, layout, track=False), layout


def test_new_columns_come_after_the_old_ones(reported):
    result, layout = reported
    assert COLUMNS == LEGACY + ADDED
    assert list(pd.read_csv(layout.reports / "comparison.csv").columns) == LEGACY + ADDED
    row = result.table.set_index("run").loc[NEW_RUN]
    assert (row["adjacency"], row["secure_noise"], row["epsilon_bound"]) == \
        ("replace_one_features", False, "odometer")
    assert row["dp_bound_margin"] == -0.1  # the worse of the loss (-0.3) and IR (-0.1) checks
    assert row["dp_bound_violated"] is not None and not row["dp_bound_violated"]
    assert (row["label_only_auc"], row["label_only_auc_unmatched"]) == (0.5, 0.93)
    assert (row["clamp_hits_min"], row["clamp_hits_max"], row["clamp_share"]) == (2, 6, 0.8)


def test_older_metrics_show_a_dash_and_the_notes_explain_the_columns(reported):
    _, layout = reported
    text = (layout.reports / "comparison.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| run |"))
    names = [c.strip() for c in header.strip("|").split("|")]
    old = next(line for line in text.splitlines() if line.startswith(f"| {OLD_RUN} |"))
    cells = dict(zip(names, (c.strip() for c in old.strip("|").split("|"))))
    # the strongest attack and the bound follow from any metrics file with a loss attack, the
    # initial clip threshold from its clip section
    derived = {"strongest_attack": "loss", "strongest_tpr_at_fpr_0.1pct": "0",
               "tpr_bound_at_fpr_0.1pct": "1", "strongest_auc": "0.95",  # 1 - 1e-7, 4 digits
               "c_initial": "1", "c_median": "1"}
    assert all(cells[name] == derived.get(name, "—") for name in ADDED), cells
    new = next(line for line in text.splitlines() if line.startswith(f"| {NEW_RUN} |"))
    cells = dict(zip(names, (c.strip() for c in new.strip("|").split("|"))))
    assert (cells["adjacency"], cells["epsilon_bound"], cells["dp_bound_margin"]) == \
        ("replace_one_features", "odometer", "-0.1")
    for phrase in ("not comparable as the same number", "`fixed_horizon`", "`odometer`",
                   "`planned`", "deterministic function of train.seed",
                   "(2 eps, (1 + e^eps) delta) for add_remove", "[data_use.md](data_use.md)"):
        assert phrase in text, phrase


def test_data_use_page_has_one_section_per_distinct_record(reported):
    _, layout = reported
    page = (layout.reports / "data_use.md").read_text()
    assert f"## `{NEW_RUN}`" in page and f"## `{OLD_RUN}`" in page
    assert "| dp_mechanism | members (target_train partition) |" in page
    assert "| encoder | public shadow_train split \\| frozen |" in page  # pipe escaped
    old_section = page.split(f"## `{OLD_RUN}`")[1]
    assert "not recorded" in old_section


def test_identical_data_use_is_one_table():
    use = {"dp_mechanism": "members", "shadow_model": "public shadow_train split"}
    page = data_use_markdown([{"run": "a", "privacy": {"data_use": use}},
                              {"run": "b", "privacy": {"data_use": dict(use)}}])
    assert page.count("## ") == 1 and "## All runs" in page
    assert page.count("| shadow_model | public shadow_train split |") == 1


def test_the_tpr_bound_at_low_fpr_follows_the_adjacency_by_hand():
    from dpclip.stages.report import tpr_bound_at

    # add/remove, eps 1: the replace-one game allows e^2 FPR + (1 + e) delta
    add_remove = {"epsilon": 1.0, "delta": 1e-5, "dp_guarantee": True, "adjacency": "add_remove"}
    assert tpr_bound_at(0.001, add_remove) == pytest.approx(
        7.38905609893065 * 0.001 + 3.718281828459045 * 1e-5)
    # replace-one features, eps 1: e FPR + delta
    assert tpr_bound_at(0.001, {**add_remove, "adjacency": "replace_one_features"}) == \
        pytest.approx(2.718281828459045e-3 + 1e-5)
    # eps 8: e^16 / 1000 > 1, and the other side of the bound, 1 - e^-16 (1 - delta' - FPR)
    # with delta' = (1 + e^8) 1e-5, is just below 1
    e8 = 2980.9579870417283
    assert tpr_bound_at(0.001, {**add_remove, "epsilon": 8.0}) == pytest.approx(
        1 - (1 - (1 + e8) * 1e-5 - 0.001) / e8 ** 2, abs=1e-15)
    assert tpr_bound_at(0.001, {**add_remove, "epsilon": 8.0}) < 1.0
    assert tpr_bound_at(0.001, {**add_remove, "dp_guarantee": False}) is None
    assert tpr_bound_at(0.001, {"epsilon": None, "delta": 1e-5}) is None


def test_a_refuted_audit_is_impossible_to_miss():
    from dpclip.stages.report import markdown_table

    table = pd.DataFrame({"run": ["a", "b"], "audit_violated": [True, False],
                          "dp_guarantee": [True, True]})
    lines = markdown_table(table).splitlines()
    assert lines[2] == "| a | 🔴 **True (REFUTED)** | True |"
    assert lines[3] == "| b | False | True |"


def test_the_audit_status_says_why_a_run_has_no_bound():
    from dpclip.audit.status import audit_status

    def entry(kind, applicable, reason=None):
        return {"kind": kind, "applicable": applicable, "reason": reason,
                "epsilon_lower_bound": 1.0 if applicable else None}

    assert audit_status({}) is None
    assert audit_status({"whitebox": entry("whitebox", True),
                         "blackbox": entry("blackbox", False, "not in audit.kinds")}) == \
        "audited (whitebox)"
    adjacency = "replace_one_features adjacency (the canaries are added or removed whole records)"
    assert audit_status({"whitebox": entry("whitebox", False, adjacency),
                         "blackbox": entry("blackbox", False, "not in audit.kinds")}) == \
        f"not applicable ({adjacency})"
    assert audit_status({k: entry(k, False, "not in audit.kinds")
                         for k in ("whitebox", "blackbox")}) == "off (audit.kinds is empty)"


def test_one_seed_says_no_difference_is_tested(reported):
    _, layout = reported
    text = (layout.reports / "comparison.md").read_text()
    assert "## Over seeds" in text and "no difference between methods is tested" in text
    assert (layout.reports / "seeds.csv").exists()


def test_several_seeds_give_intervals_and_paired_verdicts(tmp_path):
    from dpclip.reporting.seed_stats import paired_comparison, seed_summary
    from dpclip.stages.report import seeds_section

    def section(frame):
        return seeds_section(seed_summary(frame), paired_comparison(frame), tmp_path)

    def table(seeds):
        rows = []
        for method, shift, noises in (("dp_sgd", 0.0, (0.0, 0.002, -0.001, 0.001, 0.0, -0.002)),
                                      ("auto_s", 0.05, (0.001, 0.001, -0.001, 0.0, 0.002, 0.0))):
            for seed, noise in enumerate(noises[:seeds]):
                rows.append({"method": method, "target_epsilon": 8.0, "alpha": "iid",
                             "seed": seed, "accuracy": 0.9 + shift + noise, "ece": 0.05,
                             "attack_auc": 0.55, "attack_tpr_at_low_fpr": 0.0,
                             "audit_whitebox": 1.5 + seed, "audit_blackbox": None})
        return pd.DataFrame(rows)

    text = "\n".join(section(table(6)))
    assert "| 8 | iid | auto_s | 6 | 0.9505 [" in text  # mean [interval]: 0.95 + 0.003 / 6
    assert "| 1.5 to 6.5 |" in text  # the audited bounds: per-seed range, not a mean
    line = next(l for l in text.splitlines() if l.startswith("| 8 | iid | auto_s | accuracy"))
    # differences 0.05 + (0.001, -0.001, 0, -0.001, 0.002, 0.002), every one a gain: sign-flip
    # p = 2 / 64 = 0.03125; the interval is [min, max] of them
    assert line.endswith("| better |") and "0.0505 [0.049, 0.052]" in line
    assert pd.read_csv(tmp_path / "paired_vs_dp_sgd.csv")["verdict"].tolist().count("better") == 1
    # three seeds: p = 2 / 8 = 0.25 at best, no bound: a 0.05 gain is not distinguishable
    text = "\n".join(section(table(3)))
    line = next(l for l in text.splitlines() if l.startswith("| 8 | iid | auto_s | accuracy"))
    assert line.endswith("| not distinguishable |") and "[-inf, inf]" in line


def test_a_figure_of_what_is_gone_does_not_stay(tmp_path, tiny_raw):
    """A report written where an earlier one left LiRA / audit figures (the Prefect flow and
    the CLI reuse reports/) removes those it does not draw again."""
    from dpclip.stages.report import OPTIONAL_FIGURES

    params = parse_params(tiny_raw(partition={"alphas": [0.1]}, train={"methods": ["dp_sgd"]}))
    layout = Layout(tmp_path)
    run = OLD_RUN
    m = _metrics(run, "dp_sgd", {}, {"loss": {"auc": 0.5, "balanced_accuracy": 0.5,
                                              "tpr_at_fpr_1pct": 0.0, "tpr_at_fpr_0.1pct": 0.0}})
    write_json(layout.metrics(run), m)
    write_json(layout.summary(run), run_summary(m))
    write_csv_frame(layout.reliability(run), pd.DataFrame(
        {"confidence": [0.3], "accuracy": [0.25], "count": [4]}))
    write_csv_frame(layout.trace(run), pd.DataFrame({"step": [1], "clip_threshold": [1.0]}))
    write_csv_frame(layout.roc(run), pd.DataFrame({"attack": "loss", "fpr": [0.0, 1.0],
                                                   "tpr": [0.0, 1.0]}))
    layout.reports.mkdir(parents=True)
    for name in [*OPTIONAL_FIGURES, "roc_lira.png", "roc_rmia.png", "controller.csv"]:
        (layout.reports / name).write_bytes(b"stale")
    report(params, layout, track=False)
    assert not (layout.reports / "roc_lira.png").exists()  # no LiRA rows, no audit
    assert not (layout.reports / "roc_rmia.png").exists()
    assert not (layout.reports / "claimed_vs_audited_epsilon.png").exists()
    assert not (layout.reports / "controller.png").exists()  # no WW-DP-SGD run
    assert not (layout.reports / "controller.csv").exists()
    assert (layout.reports / "privacy_utility.png").read_bytes() != b"stale"  # drawn again


def test_the_controller_rows_are_the_ww_runs_probes():
    """controller.csv: WW-DP-SGD's rows at its probes (zeta measured), every other run and
    step left out; the columns are the figure's."""
    from dpclip.stages.report import controller_frame

    nan = float("nan")
    ww = pd.DataFrame({"step": [1, 2, 3, 4], "clip_threshold": [1.0, 1.1, 1.1, 1.3],
                       "ww_zeta": [nan, 3.5, nan, 4.5], "ww_zeta_ema": [4.0, 3.9, 3.9, 4.1],
                       "ww_probe_norm": [nan, 2.0, nan, 2.5]})
    plain = pd.DataFrame({"step": [1, 2], "clip_threshold": [1.0, 1.0]})
    frame = controller_frame({"ww_dp_sgd-eps8-iid-seed0": ww, "dp_sgd-eps8-iid-seed0": plain})
    assert frame["step"].tolist() == [2, 4]
    assert frame["run"].unique().tolist() == ["ww_dp_sgd-eps8-iid-seed0"]
    assert frame["clip_threshold"].tolist() == [1.1, 1.3]
    assert frame["ww_probe_norm"].tolist() == [2.0, 2.5]
    assert controller_frame({"dp_sgd-eps8-iid-seed0": plain}).empty
