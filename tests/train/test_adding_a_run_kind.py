"""Adding a run kind is one new file in ``dpclip.train.runs`` and the method that names it: the
two examples of docs/adding-a-run-kind.md (DP full-batch gradient descent), copied into plugin
folders of the run kinds' and the methods' packages, are found, step on every record with the
clipped gradients and the noise the record claims, report the epsilon Opacus's accountant gives
at sample rate 1 (never below the exact epsilon of the Gaussian mechanisms), resume, keep the
method contract and go through the stages; what the guide says a new kind does not get holds."""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import docs_example, gaussian_records, tiny_train_config
from scipy.optimize import brentq
from scipy.stats import norm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "methods"))  # the contract
from contract import (check_adversarial_records, check_clip_bound,  # noqa: E402
                      check_declaration, check_determinism, check_empty_batch,
                      check_matched_budget, check_resume)

from dpclip.errors import ConfigError, DpclipError  # noqa: E402
from dpclip.pipeline.params import parse_params  # noqa: E402
from dpclip.train import build_run, train_model  # noqa: E402
from dpclip.train.runs import RUN_KINDS, run_class  # noqa: E402

PAGE = "adding-a-run-kind.md"
ROWS = 100  # gaussian_records: 6 features, 3 classes


@pytest.fixture
def dp_gd(plugin):
    """The documented run kind and method, each dropped into a folder its package searches."""
    plugin("dpclip.train.runs", "full_batch", docs_example(PAGE))
    return plugin("dpclip.methods", "dp_gd", docs_example(PAGE, 1))


def exact_gaussian_epsilon(mu: float, delta: float) -> float:
    """The exact epsilon at ``delta`` of a Gaussian mechanism of sensitivity 1 and std 1 / mu
    (T of them with multiplier sigma: mu = sqrt(T) / sigma): Balle and Wang 2018, Theorem 8."""
    def excess(eps):
        return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2) - delta
    return brentq(excess, 1e-9, 100.0)


def clipped_sum(model, x, y, clip: float) -> list[torch.Tensor]:
    """Sum over the records of each one's gradient clipped to norm ``clip``, computed apart
    (float64 autograd, one record at a time, the whole-model norm)."""
    twin = copy.deepcopy(model).to(torch.float64)
    params = [p for p in twin.parameters() if p.requires_grad]
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")
    total = [torch.zeros_like(p) for p in params]
    for i in range(len(x)):
        record = torch.as_tensor(x[i:i + 1], dtype=torch.float64)
        grads = torch.autograd.grad(loss_fn(twin(record), torch.as_tensor(y[i:i + 1])), params)
        norm_i = float(torch.sqrt(sum(g.pow(2).sum() for g in grads)))
        factor = min(1.0, clip / norm_i)
        for t, g in zip(total, grads):
            t.add_(g, alpha=factor)
    return total


def test_the_documented_kind_and_method_are_found_and_validated(dp_gd, tiny_raw):
    assert "full_batch" in RUN_KINDS and run_class("full_batch").kind == "full_batch"
    parse_params(tiny_raw(train={"methods": ["dp_sgd", dp_gd]}))  # validate passes it


def test_a_misspelt_run_kind_is_refused_with_the_registry_message(dp_gd, plugin, tiny_raw):
    with pytest.raises(DpclipError, match=r"run kind 'full_bach' is not one of \[.*'full_batch'"):
        run_class("full_bach")
    source = docs_example(PAGE, 1).replace('"dp_gd"', '"dp_gd_typo"') \
        .replace('run_kind = "full_batch"', 'run_kind = "full_bach"')
    name = plugin("dpclip.methods", "dp_gd_typo", source)
    with pytest.raises(ConfigError, match=r"train.methods: 'dp_gd_typo' .*run_kind 'full_bach' "
                                          r"is not one of \[.*'full_batch'.*\]"):
        parse_params(tiny_raw(train={"methods": [name]}))


def test_the_record_is_opacus_epsilon_for_every_record_in_every_step(dp_gd):
    """T = epochs steps of all N records, accounted at q = 1: the record's epsilon is what
    Opacus's RDP accountant gives for (sigma, 1, T), sigma is Opacus's search for the target at
    q = 1, and the epsilon is no smaller than the exact one of T Gaussian mechanisms."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.utils import get_noise_multiplier

    x, y = gaussian_records(ROWS)
    result = train_model(x, y, (6,), 3, tiny_train_config(dp_gd, epochs=3), progress=False)
    privacy = result.privacy
    assert privacy["sample_rate"] == 1.0 and privacy["steps"] == 3
    assert [row["batch_size"] for row in result.trace] == [ROWS] * 3
    assert [row["epoch"] for row in result.trace] == [1, 2, 3]
    assert result.training["steps_per_epoch"] == 1 and result.training["steps_planned"] == 3
    assert not result.training["stopped_by_budget"]
    sigma = privacy["noise_multiplier"]
    assert sigma == pytest.approx(get_noise_multiplier(
        target_epsilon=4.0, target_delta=1e-5, sample_rate=1.0, steps=3, accountant="rdp",
        epsilon_tolerance=0.01), rel=1e-12)
    accountant = RDPAccountant()
    accountant.history = [(sigma, 1.0, 3)]
    assert privacy["epsilon"] == pytest.approx(accountant.get_epsilon(delta=1e-5), rel=1e-9)
    assert 4.0 - 0.05 <= privacy["epsilon"] <= 4.0
    assert privacy["epsilon"] >= exact_gaussian_epsilon(math.sqrt(3) / sigma, 1e-5)
    assert (privacy["dp_guarantee"], privacy["adjacency"]) == (True, "add_remove")
    assert result.trace[-1]["epsilon_spent"] == privacy["epsilon"]


def test_the_method_is_told_the_batch_the_kind_plans(dp_gd):
    """The kind plans before the method is built: the method's context holds the kind's plan
    (N records a step), and a batch size above N is no error for a kind that samples no
    batch (before, the Poisson plan refused it and told the method B)."""
    from dpclip.train import build_run

    run = build_run((6,), 3, ROWS, tiny_train_config(dp_gd, batch_size=ROWS + 50))
    assert run.method.context.expected_batch == ROWS
    assert (run.q, run.steps_per_epoch, run.total_steps) == (1.0, 1, run.cfg.train.epochs)


def test_a_step_is_every_record_clipped_and_summed_with_noise_of_std_sigma_c(dp_gd):
    """The update of one epoch (one step, lr 1, no momentum) times B (train.batch_size, public)
    is the sum of the N clipped per-record gradients (computed apart here) plus noise of std
    sigma C: exactly the sum without noise, and with it a residual of the noise's size, at a C
    small enough that every record is clipped. Dividing by N, which one added record changes,
    had twice the sensitivity the noise was calibrated for (a privacy auditor's finding)."""
    x, y = gaussian_records(ROWS)
    clip = 0.05
    divisor = 80  # train.batch_size: not N (100)
    cfg = tiny_train_config(dp_gd, epochs=1, lr=1.0, clip_norm=clip, hidden=(64,),
                            batch_size=divisor)
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)

    quiet = build_run((6,), 3, ROWS, cfg)  # the step without its noise
    start = copy.deepcopy(quiet.plain_model())
    truth = clipped_sum(start, x, y, clip)
    assert float(torch.sqrt(sum(t.pow(2).sum() for t in truth))) <= ROWS * clip
    quiet.sigma_train = 0.0
    quiet.fit(xt, yt, progress=False, desc="")
    for before, after, t in zip(start.parameters(), quiet.plain_model().parameters(), truth):
        torch.testing.assert_close((before - after).double() * divisor, t, rtol=1e-4, atol=1e-5)

    noisy = train_model(x, y, (6,), 3, cfg, progress=False)
    residual = torch.cat([((before - after).detach().double() * divisor - t).flatten() for
                          before, after, t in zip(start.parameters(), noisy.model.parameters(),
                                                  truth)])
    assert residual.numel() > 600
    sigma = noisy.privacy["noise_multiplier"]  # the one the epsilon is of (no extra query)
    assert float(residual.std()) == pytest.approx(sigma * clip, rel=0.1)
    assert abs(float(residual.mean())) < 4 * sigma * clip / math.sqrt(residual.numel())


def test_the_documented_method_keeps_the_contract(dp_gd, monkeypatch, tmp_path):
    """Declared as a private method, every record held to C, an empty step accounted, no
    record able to stop the run, at its matched budget, deterministic, and a run that crashed
    in epoch 3 resumes from its checkpoint to the uninterrupted run's model, trace and record
    (the guard's history is in the checkpoint). The kind is read from its class: no list in
    the contract names it."""
    for check in (check_declaration, check_clip_bound, check_empty_batch,
                  check_adversarial_records, check_matched_budget, check_determinism):
        check(dp_gd)
    check_resume(dp_gd, monkeypatch, tmp_path)


def test_what_the_guide_says_a_new_kind_gets_and_does_not_get(dp_gd, tmp_path):
    """Both audits (the kind runs the shared DP step, and says so by inheriting
    takes_gradient_canaries), tuning trials at the run's own steps and noise, each planned by
    the kind (noise_for_target, inherited), no model of the user's own;
    docs/adding-a-run-kind.md says so. The kinds' answers were once name lists in three
    modules: the white-box audit refused this kind although it runs the shared step, and a
    trial took Poisson steps and kept the target epsilon."""
    from dpclip import api
    from dpclip.audit.run import audit_blackbox, audit_whitebox
    from dpclip.audit.status import why_not_audited
    from dpclip.privacy import noise_for_epsilon
    from dpclip.stages.tune import with_the_runs_steps
    from dpclip.train import build_run

    assert why_not_audited(dp_gd, kind="whitebox") is None
    assert why_not_audited(dp_gd, kind="blackbox") is None
    x, y = gaussian_records(ROWS)
    px, py = gaussian_records(40, seed=2)
    cfg = tiny_train_config(dp_gd)
    verdict = audit_whitebox(build_run((6,), 3, ROWS, cfg), x, y, m=50, seed=0)
    assert verdict["applicable"] and not verdict["violated"] and verdict["canaries"] == 50
    verdict = audit_blackbox(x, y, px, py, (6,), 3, cfg, m=20, seed=0)
    assert verdict["applicable"] and not verdict["violated"]
    assert verdict["claimed_epsilon"] <= 4.0

    # a trial on 50 public records takes the run's T = 2 full-batch steps and its sigma: the
    # noise search at the trial's own plan (q = 1, 2 steps) finds that sigma again
    trial = with_the_runs_steps(cfg, 50, ROWS)
    assert trial.train.epochs == 2
    sigma = build_run((6,), 3, ROWS, cfg).sigma_eff
    found = noise_for_epsilon(trial.target_epsilon, 1e-5, 1.0, 2, "rdp", 0.01)
    assert sigma <= found <= 1.01 * sigma
    with pytest.raises(DpclipError, match=r"'dp_gd' cannot take a model of yours"):
        api.train_private(torch.nn.Linear(6, 3), None, None, method=dp_gd)


def test_the_documented_method_runs_through_the_stages(dp_gd, tiny_raw, tmp_path):
    from dpclip.layout import Layout
    from dpclip.stages.evaluate import evaluate
    from dpclip.stages.partition import partition
    from dpclip.stages.prepare import prepare
    from dpclip.stages.reference import reference
    from dpclip.stages.train import train

    params = parse_params(tiny_raw(train={"methods": [dp_gd], "epochs": 2},
                                   evaluate={"ir_attack": False}))
    layout = Layout(tmp_path)
    prepare(params, layout)
    partition(params, "iid", layout)
    record = train(params, dp_gd, 8, "iid", 0, layout, progress=False)
    privacy = record["privacy"]
    assert privacy["sample_rate"] == 1.0 and privacy["steps"] == 2
    assert 8.0 - 0.1 <= privacy["epsilon"] <= 8.0
    # the reference models are planned by the kind, and the stage records that plan (it
    # once printed and recorded the Poisson plan of train.batch_size: a newcomer's finding)
    facts = reference(params, dp_gd, 8, "iid", 0, layout)
    assert (facts["target_plan"]["sample_rate"], facts["target_plan"]["steps"]) == (1.0, 2)
    assert {m["sample_rate"] for m in facts["models"]} == {1.0}
    evaluate(params, dp_gd, 8, "iid", 0, layout)
    assert np.isfinite(privacy["noise_multiplier"])


def test_a_run_kind_installed_as_a_plugin_is_found(tmp_path):
    """A package of the user's own that declares the ``dpclip.run_kinds`` entry point, as the
    methods', attacks' and sources' plugins do: once, nothing loaded that group, and only a
    module saved in src/dpclip/train/runs/ was a run kind."""
    import os
    import subprocess
    import sys

    (tmp_path / "my_kinds.py").write_text(docs_example(PAGE).replace(
        '"full_batch"', '"my_full_batch"'))
    info = tmp_path / "my_kinds-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-kinds\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[dpclip.run_kinds]\nmy_full_batch = my_kinds\n")
    done = subprocess.run(
        [sys.executable, "-c", "from dpclip.train.runs import run_class; "
                               "print(run_class('my_full_batch').__module__)"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "my_kinds"
