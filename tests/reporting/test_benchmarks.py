"""Claims about cost, read from a committed ``dpclip bench`` output: the share and the ratio
worked out by hand, the verdicts at and either side of the bound, and a missing, incomplete or
malformed bench refused with the field named."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from dpclip.errors import DpclipError
from dpclip.files import write_json
from dpclip.reporting.benchmarks import probe_share, run_check, step_ratio
from dpclip.reporting.evidence import (CONTRADICTED_BY_BENCHMARK, HELD_BY_BENCHMARK,
                                       UNTESTABLE, evidence, evidence_markdown, judge,
                                       load_claims)

SPEC = {"check": "probe_share", "file": "results/benchmarks/t14/bench.json", "method": "ww_dp_sgd",
        "model": "paper_cnn", "bound": 0.0179}


def _bench(root: Path, probe_s: float, train_s: float) -> None:
    """A bench output as ``dpclip bench`` writes it: the interleaved table and the probe."""
    write_json(root / "results" / "benchmarks" / "t14" / "bench.json", {
        "setting": {"device": "cpu", "threads": 2, "batch_size": 256, "dataset": "mnist"},
        "table": [{"model": "paper_cnn", "method": "dp_sgd", "step_ms_median": 25.0},
                  {"model": "paper_cnn", "method": "ww_dp_sgd", "step_ms_median": 24.5}],
        "probes": {"paper_cnn/ww_dp_sgd": {"probe_every": 50, "probe_s": probe_s,
                                           "train_s": train_s,
                                           "share": probe_s / train_s}}})


def _claim() -> dict:
    return {"id": "overhead", "claim": "WW costs little more.", "source": "s", "paper": "1.79%",
            "rule": "benchmark", "benchmark": dict(SPEC)}


def test_the_probe_share_is_the_probe_over_the_training_time_against_the_bound(tmp_path):
    _bench(tmp_path, probe_s=0.05, train_s=4.0)  # 1.25% <= 1.79%
    check = probe_share(SPEC, tmp_path)
    assert check.computed == pytest.approx(0.0125) and check.claimed == 0.0179 and check.holds
    assert "1.25% of the training time" in check.lines[0]
    assert "ratio 0.98" in check.lines[2]  # 24.5 / 25: shown beside the share
    _bench(tmp_path, probe_s=0.0716, train_s=4.0)  # exactly 1.79%: within
    assert probe_share(SPEC, tmp_path).holds
    _bench(tmp_path, probe_s=0.08, train_s=4.0)  # 2%: above
    assert not probe_share(SPEC, tmp_path).holds


def test_the_evidence_report_gives_the_benchmark_verdicts_and_untested_without_a_bench(tmp_path):
    results = tmp_path / "results" / "presets"
    results.mkdir(parents=True)
    finding = judge(_claim(), None, tmp_path)
    assert finding.verdict == UNTESTABLE and "does not exist" in finding.reason
    _bench(tmp_path, probe_s=0.05, train_s=4.0)
    finding = judge(_claim(), None, tmp_path)
    assert finding.verdict == HELD_BY_BENCHMARK
    assert "1.25% of the training time on this machine, within the paper's 1.79%" in \
        finding.reason
    text = evidence_markdown([finding], results, "dpclip evidence")
    assert "**What does it cost?**" in text and "*The measurement*" in text
    _bench(tmp_path, probe_s=0.08, train_s=4.0)
    assert judge(_claim(), None, tmp_path).verdict == CONTRADICTED_BY_BENCHMARK
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"claims": [_claim()]}))
    assert [f.verdict for f in evidence(path, results, tmp_path)] == [CONTRADICTED_BY_BENCHMARK]


def test_a_bad_benchmark_claim_is_refused_naming_what_is_wrong(tmp_path):
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"claims": [{**_claim(), "benchmark": {"check": "speed"}}]}))
    with pytest.raises(DpclipError, match="rule 'benchmark' needs"):
        load_claims(path)
    _bench(tmp_path, probe_s=0.05, train_s=4.0)
    with pytest.raises(DpclipError, match="no probe share for 'cnn/ww_dp_sgd'"):
        probe_share({**SPEC, "model": "cnn"}, tmp_path)
    with pytest.raises(DpclipError, match="bound must be a finite number above 0, not -1"):
        probe_share({**SPEC, "bound": -1}, tmp_path)
    with pytest.raises(DpclipError, match=r"below 1 \(1.79% is 0.0179\), not 1.79"):
        probe_share({**SPEC, "bound": 1.79}, tmp_path)  # a percentage typed as a fraction
    with pytest.raises(DpclipError, match="file must name the bench.json"):
        probe_share({**SPEC, "file": None}, tmp_path)


RATIO = {"check": "step_ratio", "file": "results/benchmarks/t14/bench.json", "method": "ww_dp_sgd",
         "baseline": "dp_sgd", "model": "paper_cnn", "bound": 0.98}


def test_the_step_ratio_is_the_methods_median_over_the_baselines_against_the_papers(tmp_path):
    _bench(tmp_path, probe_s=0.05, train_s=4.0)  # medians 24.5 and 25.0 ms: 0.98
    check = step_ratio(RATIO, tmp_path)
    assert check.computed == pytest.approx(0.98) and check.holds  # at the bound: within
    assert "ww_dp_sgd / dp_sgd = 0.98, against the paper's 0.98" in check.lines[1]
    assert not step_ratio({**RATIO, "bound": 0.97}, tmp_path).holds
    with pytest.raises(DpclipError, match=r"timed no \['auto_s'\] on 'paper_cnn'"):
        step_ratio({**RATIO, "baseline": "auto_s"}, tmp_path)



def test_a_malformed_bench_is_refused_with_the_field_named(tmp_path):
    path = tmp_path / "results" / "benchmarks" / "t14" / "bench.json"
    _bench(tmp_path, probe_s=0.05, train_s=4.0)
    bench = json.loads(path.read_text())
    for broken, message in [
            ({**bench, "probes": {"paper_cnn/ww_dp_sgd": {"probe_every": 50, "train_s": 4.0}}},
             "probe_s must be a finite number above 0, not None"),
            ({**bench, "probes": {"paper_cnn/ww_dp_sgd": {"probe_s": 0.05, "train_s": "nan"}}},
             "train_s must be a finite number above 0"),
            ({**bench, "table": [{"model": "paper_cnn", "method": "dp_sgd",
                                  "step_ms_median": 0.0}]},
             "paper_cnn/dp_sgd: step_ms_median must be a finite number above 0, not 0.0"),
            ([1, 2], "not a `dpclip bench` output")]:
        path.write_text(json.dumps(broken))
        with pytest.raises(DpclipError, match=re.escape(message)):
            probe_share(SPEC, tmp_path)
    path.write_text(json.dumps({**bench, "table": [{"model": "paper_cnn", "method": "dp_sgd",
                                                    "step_ms_median": None}]}))
    with pytest.raises(DpclipError, match="step_ms_median must be a finite number above 0"):
        step_ratio(RATIO, tmp_path)
    with pytest.raises(DpclipError, match="benchmark check 'speed' is not one of"):
        run_check({"check": "speed"}, tmp_path)
