"""Claims about the privacy accounting itself, computed: each check's numbers against bounds
worked out independently of Opacus, and the verdicts the evidence report gives them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from scipy.optimize import brentq
from scipy.stats import norm

from dpclip.errors import DpclipError
from dpclip.methods.common.dc_sgd import noise_split
from dpclip.methods.sanitize import poisson_amplification
from dpclip.reporting.accounting import run_check
from dpclip.reporting.evidence import (CONTRADICTED_BY_ACCOUNTING, HELD_BY_ACCOUNTING,
                                       evidence_markdown, judge, load_claims)

PAPER_SANITIZE = {"check": "poisson_amplification", "records": 60000, "batch_size": 20,
                  "epochs": 100, "epsilon": 1.0, "delta": 1e-5}
DC_SGD_SPLIT = {"check": "noise_split", "epsilon": 8.0, "delta": 1e-5,
                "sample_rate": 256 / 60000, "steps": 3510, "sigma_h_ratio": 5.0}


def _gaussian_dp_epsilon(mu: float, delta: float) -> float:
    """The exact epsilon of a mu-GDP mechanism at delta (Balle and Wang 2018, Theorem 8):
    delta(eps) = Phi(-eps / mu + mu / 2) - e^eps Phi(-eps / mu - mu / 2), solved for eps."""
    def gap(eps):  # e^eps Phi(x) as exp(eps + log Phi(x)), which does not overflow
        return (norm.cdf(-eps / mu + mu / 2)
                - math.exp(eps + norm.logcdf(-eps / mu - mu / 2)) - delta)
    return brentq(gap, 0.0, mu * mu / 2 + 10 * mu + 50)


def test_the_sanitize_claim_holds_only_under_the_amplification_its_batches_do_not_give():
    check = poisson_amplification(PAPER_SANITIZE)
    # the paper's own accounting reproduces its number: 300,000 steps at q = 1/3000
    assert "300,000 Poisson-subsampled steps" in check.lines[0]
    sigma = float(check.lines[0].split("with sigma ")[1].split(" ")[0])
    assert 0.95 < sigma < 1.1
    # 100 unsubsampled Gaussian releases at sigma: mu-GDP with mu = sqrt(100) / sigma. RDP's
    # conversion is no tighter than the exact GDP curve and no looser than zCDP's
    # rho + 2 sqrt(rho log(1 / delta)) with rho = 100 / (2 sigma^2)
    exact = _gaussian_dp_epsilon(math.sqrt(100) / sigma, 1e-5)
    rho = 100 / (2 * sigma ** 2)
    zcdp = rho + 2 * math.sqrt(rho * math.log(1e5))
    assert exact <= check.computed <= zcdp * 1.001
    assert check.computed > 80 and not check.holds  # about 96 times the claimed epsilon
    assert check.claimed == 1.0


def test_dc_sgds_split_recombines_to_dp_sgds_sigma_and_epsilon():
    check = noise_split(DC_SGD_SPLIT)
    # by hand: sigma_H = 5 sigma gives sigma_T = sigma (1 - 1/25)^(-1/2) = 1.0206207 sigma
    sigma = float(check.lines[0].split("sigma ")[1].split(" ")[0])
    sigma_t = float(check.lines[1].split("sigma_T = (sigma^-2 - sigma_H^-2)^-1/2 = ")[1]
                    .split(";")[0])
    assert sigma_t / sigma == pytest.approx(1 / math.sqrt(1 - 1 / 25), rel=1e-3)
    assert check.holds and check.computed <= 8.0 and check.computed == pytest.approx(8.0, abs=0.05)
    # a histogram noisier than the whole step leaves nothing for the gradient: refused
    with pytest.raises(DpclipError, match="too small"):
        noise_split({**DC_SGD_SPLIT, "sigma_h_ratio": 0.5})


def test_a_bad_check_is_refused_by_name():
    with pytest.raises(DpclipError, match="'nope' is not one of"):
        run_check({"check": "nope"})
    with pytest.raises(DpclipError, match="epochs must be a finite number above 0, not -3"):
        run_check({**PAPER_SANITIZE, "epochs": -3})


def test_accounting_claims_get_their_own_verdicts_and_the_computation(tmp_path):
    claims = [{"id": "san", "claim": "It is (1, 1e-5)-DP.", "source": "s", "paper": "p",
               "rule": "accounting", "accounting": PAPER_SANITIZE},
              {"id": "split", "claim": "Unchanged cost.", "source": "s", "paper": "p",
               "rule": "accounting", "accounting": DC_SGD_SPLIT}]
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"claims": claims}))
    loaded = load_claims(path)
    findings = [judge(c, None) for c in loaded]
    assert [f.verdict for f in findings] == [CONTRADICTED_BY_ACCOUNTING, HELD_BY_ACCOUNTING]
    text = evidence_markdown(findings, Path("results/presets"), "dpclip evidence")
    assert "**Is the epsilon right?** Computed, no runs: **san** contradicted by the " \
           "accounting" in text
    # named where it lives: with its method
    assert "*The computation* (`dpclip.methods.sanitize`, check " \
           "`poisson_amplification`)." in text
    path.write_text(yaml.safe_dump({"claims": [{**claims[0], "accounting": {"check": "x"}}]}))
    with pytest.raises(DpclipError, match="rule 'accounting' needs accounting"):
        load_claims(path)


LM_LITERAL = {"check": "batch_weights_sensitivity", "epsilon": 5.0, "delta": 1e-5,
              "batch_size": 36, "sample_rate": 0.02, "steps": 250}


def test_lm_dp_sgds_literal_weights_let_one_record_move_the_sum_by_about_b_times_c():
    from dpclip.methods.lm_dp_sgd import _lm_sum, batch_weights_sensitivity

    # by hand, C = 1: 36 records with norms (1, 0) give w = (1, 0) and the sum (36, 0); one
    # record (0, M) more gives w = (36, M) / ||(36, M)||, the sum (36 w_1, w_2), and the move
    # sqrt(36^2 (1 - w_1)^2 + w_2^2)
    members, outlier = [[1.0, 0.0]] * 36, [[0.0, 1e6]]
    w1, w2 = 36 / math.hypot(36, 1e6), 1e6 / math.hypot(36, 1e6)
    assert _lm_sum(members, "batch", 36).tolist() == pytest.approx([36.0, 0.0], rel=1e-12)
    assert _lm_sum(members + outlier, "batch", 36).tolist() == pytest.approx(
        [36 * w1, w2], rel=1e-9)
    moved = math.sqrt(36 ** 2 * (1 - w1) ** 2 + w2 ** 2)
    assert moved == pytest.approx(36.0126, abs=1e-4)  # sqrt(1296 (1 - 3.6e-5)^2 + 1)
    # the sound rule's weights are fixed before the step: the record adds its own C_i w alone
    private = (_lm_sum(members + outlier, "private", 36) - _lm_sum(members, "private", 36))
    assert float(private.norm()) <= 1.0 + 1e-12
    check = batch_weights_sensitivity(LM_LITERAL)
    assert not check.holds and check.computed == math.inf and check.claimed == 5.0
    assert f"moves the sum by {moved:.4g} C" in check.lines[2]
    assert check.summary.startswith(f"one record moves the noised sum by {moved:.4g} C")
    # two records already break the premise: the bound does not need a large batch
    two = batch_weights_sensitivity({**LM_LITERAL, "batch_size": 2})
    assert not two.holds and "by 2.236 C" in two.summary  # sqrt(2^2 + 1)


def test_the_lm_claim_is_contradicted_by_the_accounting_in_the_report():
    claims = {c["id"]: c for c in load_claims(
        Path(__file__).resolve().parents[2] / "presets" / "claims.yaml")}
    finding = judge(claims["lm-batch-weights-privacy"], None)
    assert finding.verdict == CONTRADICTED_BY_ACCOUNTING
    assert "no epsilon" in finding.reason and "the paper claims 5" in finding.reason


def test_the_one_run_audit_cannot_refute_the_lm_claim_in_the_table3_model():
    """Issue: whether the audit could measure the literal rule's leakage, with its power. With
    every guess right and delta 0, r guesses at level a refute every epsilon with
    q^r < a, q = e^eps / (1 + e^eps): eps = log(q / (1 - q)) at q = a^(1 / r). The table3 CNN's
    conv1 has 16 x 1 x 3 x 3 + 16 = 160 coordinates, so 160 spanning canaries fit."""
    from dpclip.methods.lm_dp_sgd import (audit_ceiling, batch_weights_sensitivity,
                                          spanning_canaries)

    q = (0.05 / 4) ** (1 / 160)  # the largest guess size, at its Bonferroni share of 5%
    assert audit_ceiling(160, 0.0, 0.95) == pytest.approx(math.log(q / (1 - q)), abs=1e-5)
    assert audit_ceiling(160, 1e-5, 0.95) < audit_ceiling(160, 0.0, 0.95) < 5.0
    # docs/attacks.md: "with 1000 canaries, even all guesses right refute at most about 5.4"
    assert audit_ceiling(1000, 1e-5, 0.95) == pytest.approx(5.4, abs=0.05)
    audit = {"model": "cnn", "hidden": [64], "features": [1, 28, 28], "classes": 10,
             "canaries": 1000, "confidence": 0.95}
    assert spanning_canaries(audit) == 160
    assert spanning_canaries({**audit, "canaries": 100}) == 100
    lines = batch_weights_sensitivity({**LM_LITERAL, "audit": audit}).lines
    assert "fit 160 (the smallest layer's coordinates)" in lines[-1]
    assert "refute at most epsilon 3.58 at 95.0%" in lines[-1]
    assert "no outcome of that audit could show the leakage" in lines[-1]
    assert len(batch_weights_sensitivity(LM_LITERAL).lines) == len(lines) - 1
    # both audit kinds: the white-box one at 97.5% (docs/attacks.md), a lower ceiling
    assert audit_ceiling(160, 1e-5, 0.975) < audit_ceiling(160, 1e-5, 0.95)
    # a claim below the ceiling: the audit has power against it; fewer canaries than fit
    lower = batch_weights_sensitivity({**LM_LITERAL, "epsilon": 2.0,
                                       "audit": {**audit, "canaries": 100}}).lines[-1]
    assert "fit 100 (audit.canaries; the smallest layer has 160 coordinates)" in lower
    assert "so the audit can refute the claimed epsilon" in lower
