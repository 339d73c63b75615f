"""The evidence page's lead: the controller traced (with the norm the noise alone gives) and
post-hoc observations, from committed per-variant files."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from dpclip.errors import DpclipError
from dpclip.reporting.lead import (lead_lines, load_mechanisms, noise_alone_norm,
                                   post_hoc_line, variant_traces)


def test_the_noise_alone_norm_by_hand():
    """Probes at steps 2 and 4 with C 1 then 2, lr 0.5, sigma 1, B 10, d 100: per coordinate
    the variance after step 2 is 2 (0.5 * 1 * 1 / 10)^2, after step 4 that plus 2 (0.5 * 2 /
    10)^2; the norm is sqrt(d * variance)."""
    probes = pd.DataFrame({"step": [2, 4], "clip_threshold": [1.0, 2.0]})
    norm = noise_alone_norm(probes, lr=0.5, sigma=1.0, batch_size=10, probe_size=100)
    first = math.sqrt(100 * 2 * 0.05 ** 2)
    assert norm.tolist() == pytest.approx([first, math.sqrt(100 * (2 * 0.05 ** 2
                                                                   + 2 * 0.1 ** 2))])


def _committed(root, variant, runs):
    folder = root / "mech" / variant / "reports"
    folder.mkdir(parents=True)
    rows = [{"run": run, "step": step, "ww_zeta": 4.0, "clip_threshold": c,
             "ww_zeta_ema": zeta, "ww_probe_norm": norm}
            for run, steps in runs.items() for step, c, zeta, norm in steps]
    pd.DataFrame(rows).to_csv(folder / "controller.csv", index=False)
    pd.DataFrame({"run": list(runs), "noise_multiplier": [1.0] * len(runs)}).to_csv(
        folder / "comparison.csv", index=False)


def test_the_variants_median_over_runs_and_the_missing_left_out(tmp_path):
    _committed(tmp_path, "fast", {"a": [(50, 1.0, 4.0, 3.0), (100, 2.0, 5.0, 9.0)],
                                  "b": [(50, 1.0, 4.2, 5.0), (100, 3.0, 5.4, 11.0)]})
    spec = {"id": "m", "preset": "mech", "title": "T", "probe_size": 16, "batch_size": 4,
            "learning_rates": {"fast": 1.0, "slow": 0.25}}
    traces = variant_traces(spec, tmp_path)
    assert list(traces) == ["lr 1"]  # 'slow' has no committed rows
    fast = traces["lr 1"]
    assert fast["ww_probe_norm"].tolist() == [4.0, 10.0]
    assert fast["clip_threshold"].tolist() == [1.0, 2.5]
    # the median of the two runs' noise-alone norms: 50 steps at C 1, then 50 at C 2 or 3
    a, b = (math.sqrt(16 * (50 + 50 * c * c)) / 4 for c in (2.0, 3.0))
    assert fast["noise_alone"].iloc[-1] == pytest.approx((a + b) / 2)


def test_the_lead_draws_the_figure_and_says_when_nothing_was_traced(tmp_path):
    claims = tmp_path / "claims.yaml"
    claims.write_text("claims: []\nmechanisms:\n  - {id: m, preset: mech, title: 'T.', "
                      "probe_size: 16, batch_size: 4, learning_rates: {fast: 1.0}}\n")
    out = tmp_path / "docs" / "evidence.md"
    assert "Not traced yet" in " ".join(lead_lines(claims, tmp_path, out))
    _committed(tmp_path, "fast", {"a": [(50, 1.0, 4.0, 3.0), (750, 2.0, 5.0, 9.0)]})
    text = " ".join(lead_lines(claims, tmp_path, out))
    assert "from 3.0 at step 50 to 3.0 by step 700 and 9.0 at step 750" in text
    assert "C_t 1.00 -> 2.00" in text and "![m](evidence/m.png)" in text
    assert (tmp_path / "docs" / "evidence" / "m.png").stat().st_size > 0
    claims.write_text("mechanisms:\n  - {id: m, preset: mech}\n")
    with pytest.raises(DpclipError, match="mechanism 'm' lacks"):
        load_mechanisms(claims)


def test_a_post_hoc_line_compares_with_the_baselines_best_setting_seed_by_seed(tmp_path):
    for variant, dp, e in (("C1", [0.90, 0.91, 0.92], [0.80, 0.80, 0.80]),
                           ("C2", [0.95, 0.94, 0.96], [0.85, 0.85, 0.85]),
                           ("C0.5", [0.93, 0.93, 0.93], [0.96, 0.93, 0.97])):
        folder = tmp_path / "range" / variant / "reports"
        folder.mkdir(parents=True)
        pd.DataFrame({"method": ["dp_sgd"] * 3 + ["dc_sgd_e"] * 3, "seed": [0, 1, 2] * 2,
                      "accuracy": dp + e}).to_csv(folder / "comparison.csv", index=False)
    spec = {"id": "p", "preset": "range", "variant": "C0.5", "method": "dc_sgd_e",
            "baseline": "dp_sgd", "metric": "accuracy"}
    line = post_hoc_line(spec, tmp_path)
    # dp_sgd is best at C2 (0.95 on average): 0.96 - 0.95, 0.93 - 0.94, 0.97 - 0.96
    assert "its best setting, `C2`" in line and "+0.0033" in line
    assert "2 of 3 seeds above" in line and "one of 3 settings" in line
    assert post_hoc_line({**spec, "variant": "C9"}, tmp_path) == ""
