"""The verdict report from synthetic preset results: each rule's held / not held / not testable
cases, with differences and p-values worked out by hand, and the committed claims file."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from dpclip.cli import main
from dpclip.evidence import HELD, NOT_HELD, UNTESTABLE, evidence, judge, load_claims
from dpclip.errors import DpclipError

PROJECT = Path(__file__).resolve().parents[1]


def _write(results: Path, preset: str, rows: list[dict], variant: str = "main") -> None:
    folder = results / preset / variant / "reports"
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(folder / "comparison.csv", index=False)


def _rows(values: dict[str, list[float]], metric: str, epsilon: float = 8.0) -> list[dict]:
    """One run per (method, seed) with the given metric values, seeds 0, 1, 2, ..."""
    return [{"method": m, "target_epsilon": epsilon, "alpha": "iid", "seed": s, metric: v}
            for m, vs in values.items() for s, v in enumerate(vs)]


def _claim(rule: str, metric: str = "ece", **extra) -> dict:
    return {"id": "c", "claim": "x", "source": "s", "paper": "p", "preset": "p", "rule": rule,
            "method": "ww_dp_sgd", "baseline": "dp_sgd", "metric": metric, **extra}


def _table(rows):
    return pd.DataFrame(rows).assign(variant="main")


def test_better_needs_a_significant_gain_in_the_metrics_direction():
    # differences -0.010, -0.011, -0.009: mean -0.01, sd 0.001, t = -17.3 on 2 df, p = 0.0033
    rows = _rows({"ww_dp_sgd": [0.020, 0.019, 0.021], "dp_sgd": [0.030, 0.030, 0.030]}, "ece")
    finding = judge(_claim("better"), _table(rows))
    assert finding.verdict == HELD
    assert finding.rows[0]["difference"] == pytest.approx(-0.01)
    assert finding.rows[0]["p"] == pytest.approx(0.00332, abs=2e-5)
    assert "Holm p 0.00332" in finding.ours[0]
    # the same gain in accuracy, where higher is better, is a loss
    rows = _rows({"ww_dp_sgd": [0.020, 0.019, 0.021], "dp_sgd": [0.030, 0.030, 0.030]},
                 "accuracy")
    assert judge(_claim("better", "accuracy"), _table(rows)).verdict == NOT_HELD
    # noisy differences: not distinguishable, so not held
    rows = _rows({"ww_dp_sgd": [0.02, 0.04, 0.025], "dp_sgd": [0.03, 0.03, 0.03]}, "ece")
    finding = judge(_claim("better"), _table(rows))
    assert finding.verdict == NOT_HELD and "not distinguishable" in finding.reason


def test_better_everywhere_is_corrected_over_the_claims_configurations():
    # eps 8 alone would pass (p 0.0033), eps 2 fails: one configuration short of every
    rows = _rows({"ww_dp_sgd": [0.020, 0.019, 0.021], "dp_sgd": [0.03, 0.03, 0.03]}, "ece") + \
        _rows({"ww_dp_sgd": [0.03, 0.031, 0.029], "dp_sgd": [0.03, 0.03, 0.03]}, "ece", 2.0)
    finding = judge(_claim("better"), _table(rows))
    assert finding.verdict == NOT_HELD and "eps 2" in finding.reason
    # Holm over the two: the smaller p doubled
    smallest = min(r["p"] for r in finding.rows)
    assert min(r["p_holm"] for r in finding.rows) == pytest.approx(2 * smallest)


def test_not_worse_fails_only_on_a_significant_loss():
    rows = _rows({"ww_dp_sgd": [0.90, 0.93, 0.91], "dp_sgd": [0.91, 0.91, 0.92]}, "accuracy")
    assert judge(_claim("not_worse", "accuracy"), _table(rows)).verdict == HELD
    rows = _rows({"ww_dp_sgd": [0.80, 0.81, 0.79], "dp_sgd": [0.91, 0.91, 0.92]}, "accuracy")
    assert judge(_claim("not_worse", "accuracy"), _table(rows)).verdict == NOT_HELD


def test_lowest_must_beat_every_baseline():
    values = {"lm_dp_sgd": [0.60, 0.615, 0.60], "dp_sgd": [0.70, 0.71, 0.70],
              "auto_s": [0.70, 0.70, 0.71]}
    claim = _claim("lowest", "peak_ir_mia", method="lm_dp_sgd", baselines=["dp_sgd", "auto_s"])
    assert judge(claim, _table(_rows(values, "peak_ir_mia"))).verdict == HELD
    values["auto_s"] = [0.60, 0.62, 0.59]  # one baseline as low: not the lowest
    finding = judge(claim, _table(_rows(values, "peak_ir_mia")))
    assert finding.verdict == NOT_HELD and "vs auto_s" in finding.reason


def test_within_reads_the_interval_against_the_margin():
    # differences -0.01, -0.01, -0.01: no spread, interval [-0.01, -0.01] inside 0.02
    rows = _rows({"ww_dp_sgd": [0.89, 0.90, 0.91], "dp_sgd": [0.90, 0.91, 0.92]}, "accuracy")
    assert judge(_claim("within", "accuracy", margin=0.02), _table(rows)).verdict == HELD
    # differences -0.01, -0.03, -0.02: mean -0.02, its interval reaches below -0.02
    rows = _rows({"ww_dp_sgd": [0.89, 0.88, 0.90], "dp_sgd": [0.90, 0.91, 0.92]}, "accuracy")
    assert judge(_claim("within", "accuracy", margin=0.02), _table(rows)).verdict == NOT_HELD


def test_smaller_spread_pairs_each_seeds_range_over_the_variants():
    frames = []
    for variant, (ww, dp) in {"C0.25": ([0.90, 0.91, 0.90], [0.80, 0.82, 0.81]),
                              "C1": ([0.91, 0.91, 0.91], [0.90, 0.90, 0.90]),
                              "C4": ([0.90, 0.90, 0.91], [0.85, 0.84, 0.86])}.items():
        frames.append(pd.DataFrame(_rows({"ww_dp_sgd": ww, "dp_sgd": dp}, "accuracy"))
                      .assign(variant=variant))
    table = pd.concat(frames, ignore_index=True)
    finding = judge(_claim("smaller_spread", "accuracy"), table)
    # ww ranges 0.01, 0.01, 0.01; dp ranges 0.10, 0.08, 0.09: differences -0.09, -0.07, -0.08
    assert finding.rows[0]["difference"] == pytest.approx(-0.08)
    assert finding.verdict == HELD
    same = table.assign(accuracy=table["accuracy"].where(table["method"] == "dp_sgd",
                                                         table["accuracy"]))
    same.loc[same["method"] == "ww_dp_sgd", "accuracy"] = \
        same.loc[same["method"] == "dp_sgd", "accuracy"].to_numpy()
    assert judge(_claim("smaller_spread", "accuracy"), same).verdict == NOT_HELD


def test_not_testable_without_runs_seeds_or_a_reason():
    assert judge(_claim("better"), None).verdict == UNTESTABLE
    one_seed = _rows({"ww_dp_sgd": [0.02], "dp_sgd": [0.03]}, "ece")
    assert judge(_claim("better"), _table(one_seed)).verdict == UNTESTABLE
    missing = _rows({"dp_sgd": [0.03, 0.03]}, "ece")
    assert judge(_claim("better"), _table(missing)).verdict == UNTESTABLE
    finding = judge({"id": "x", "untestable": "no numbers."}, None)
    assert finding.verdict == UNTESTABLE and finding.reason == "no numbers"


def test_the_report_from_synthetic_preset_runs(tmp_path, capsys):
    claims = tmp_path / "presets" / "claims.yaml"
    claims.parent.mkdir()
    claims.write_text(yaml.safe_dump({"claims": [
        {**_claim("better"), "id": "ece-claim", "preset": "t10"},
        {"id": "later", "claim": "y", "source": "s", "paper": "p", "untestable": "why"}]}))
    _write(tmp_path / "results" / "presets", "t10",
           _rows({"ww_dp_sgd": [0.020, 0.019, 0.021], "dp_sgd": [0.03, 0.03, 0.03]}, "ece"))
    (tmp_path / "results" / "presets" / "t10" / "preset.json").write_text(json.dumps(
        {"deviations": ["a subset of MNIST"], "variants": {"main": {"wall_s": 61.4}}}))
    assert main(["--root", str(tmp_path), "evidence", "--out", "docs/evidence.md"]) == 0
    text = (tmp_path / "docs" / "evidence.md").read_text()
    assert "| ece-claim | s | **held** |" in text
    assert "| later | s | **not testable here** |" in text
    assert "dpclip evidence --out docs/evidence.md" in text
    assert "wall time on this machine: main 61 s" in text and "  - a subset of MNIST" in text
    assert "ww_dp_sgd 0.02 [" in text  # ours, with its interval
    assert "<table>" in (tmp_path / "docs" / "evidence.html").read_text()
    assert "![ece-claim](evidence/ece-claim.png)" in text  # a figure per tested claim
    assert (tmp_path / "docs" / "evidence" / "ece-claim.png").stat().st_size > 1000
    assert not (tmp_path / "docs" / "evidence" / "later.png").exists()
    assert "ece-claim: held" in capsys.readouterr().out


def test_the_committed_claims_are_valid_and_a_bad_rule_is_refused(tmp_path):
    claims = load_claims(PROJECT / "presets" / "claims.yaml")
    assert {c["preset"] for c in claims if "preset" in c} <= \
        {p.stem for p in (PROJECT / "presets").glob("*.yaml")}
    assert [f.verdict for f in evidence(PROJECT / "presets" / "claims.yaml",
                                        tmp_path)] == [UNTESTABLE] * len(claims)
    bad = tmp_path / "claims.yaml"
    bad.write_text(yaml.safe_dump({"claims": [{**_claim("best"), "id": "b"}]}))
    with pytest.raises(DpclipError, match="rule 'best'"):
        load_claims(bad)
