"""Issue 5 groundwork: the sanitization layer's mechanism and its per-record accounting."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import gaussian_records
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from dpclip.privacy import ODOMETER_ORDERS
from dpclip.methods.sanitize import (RDP_ORDERS, clip_activations, funnel_widths,
                                     noise_for_record_epsilon, record_epsilon, sanitize,
                                     sensitivity)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 32), clip=st.floats(1e-3, 1e3), drop_p=st.floats(0.0, 0.95),
       scale=st.floats(1e-3, 1e4), signed=st.booleans(), seed=st.integers(0, 2 ** 31 - 1))
def test_two_records_never_differ_by_more_than_the_sensitivity(n, clip, drop_p, scale, signed,
                                                               seed):
    gen = torch.Generator().manual_seed(seed)
    a, b = (torch.randn(1, n, generator=gen, dtype=torch.float64) * scale for _ in range(2))
    keep = (torch.rand(1, n, generator=gen) >= drop_p).double()  # the mask: drawn first
    gap = ((clip_activations(a, clip, signed) - clip_activations(b, clip, signed)) * keep).norm()
    assert gap <= sensitivity(clip, keep.sum(dim=1), signed)[0] * (1 + 1e-12)


def test_noise_std_is_sigma_clip_sqrt_kept_units():
    gen = torch.Generator().manual_seed(0)
    z = torch.zeros(4000, 16)  # clipped to 0: the output is the noise on kept units
    out, kept = sanitize(z, clip=0.5, drop_p=0.0, sigma=1.5, generator=gen)
    assert torch.all(kept == 16)
    assert out.std().item() == pytest.approx(1.5 * 0.5 * math.sqrt(16), rel=0.02)
    out, kept = sanitize(z, clip=0.5, drop_p=0.5, sigma=1.5, generator=gen)
    assert torch.all((out != 0).sum(dim=1) == kept)  # dropped units get no noise
    per_unit = out / kept.clamp_min(1).sqrt()[:, None]  # divide by each record's sqrt(k)
    assert per_unit[out != 0].std().item() == pytest.approx(1.5 * 0.5, rel=0.02)
    assert kept.float().mean().item() == pytest.approx(8.0, rel=0.02)


def test_record_epsilon_equals_the_rdp_formula_by_hand():
    # sigma 2, 3 releases, delta 1e-5: RDP(alpha) = 3 alpha / (2 * 4); Opacus's conversion
    # eps(alpha) = RDP - (log delta + log alpha) / (alpha - 1) + log((alpha - 1) / alpha)
    delta = 1e-5
    by_hand = min(3 * a / 8 - (math.log(delta) + math.log(a)) / (a - 1) + math.log((a - 1) / a)
                  for a in RDP_ORDERS)
    assert record_epsilon(2.0, 3, delta) == pytest.approx(by_hand, rel=1e-12)
    assert record_epsilon(2.0, 0, delta) == 0.0


def test_record_epsilon_bounds_the_exact_gaussian_composition():
    # E releases at sigma compose to one Gaussian with mu = sqrt(E) / sigma; its exact delta at
    # the RDP epsilon (Balle and Wang 2018) must not exceed the target delta
    sigma, uses, delta = 3.0, 10, 1e-5
    eps = record_epsilon(sigma, uses, delta)
    mu = math.sqrt(uses) / sigma
    exact = norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu)
    assert exact <= delta
    assert eps < 1.25 * _exact_epsilon(mu, delta)  # and RDP is not far above the truth


def _exact_epsilon(mu: float, delta: float) -> float:
    lo, hi = 0.0, 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        d = norm.cdf(mu / 2 - mid / mu) - math.exp(mid) * norm.cdf(-mu / 2 - mid / mu)
        lo, hi = (mid, hi) if d > delta else (lo, mid)
    return hi


def test_noise_for_a_target_epsilon_stays_within_it():
    sigma = noise_for_record_epsilon(4.0, 1e-5, uses=20)
    assert 3.96 <= record_epsilon(sigma, 20, 1e-5) <= 4.0
    assert record_epsilon(sigma, 10, 1e-5) < record_epsilon(sigma, 20, 1e-5)  # stopping early


def test_funnel_widths():
    assert funnel_widths(8) == [64, 32, 16, 8]
    with pytest.raises(ValueError, match="methods.sanitize.n: 0"):
        funnel_widths(0)
    assert np.all(np.diff(funnel_widths(3)) < 0)


# --- the sanitize method, trained end to end ----------------------------------------------------

def _sanitize_cfg(**options):
    from dpclip.train import TrainConfig

    early = options.pop("early_stopping", {"rule": "none", "window": 5, "threshold": 0.0})
    opts = {"n": 2, "drop_p": 0.2, "clip": 1.0, "adaptive": False, "t": 0.05,
            "encoder": "frozen", "public_steps": 20, "public_lr": 0.01, "epochs": 4,
            "head_lr": 0.1, **options}
    return TrainConfig.of(method="sanitize", target_epsilon=4.0, delta=1e-5, accountant="rdp",
                          epochs=4, batch_size=16, lr=0.1, optimizer="sgd", momentum=0.0,
                          clip_norm=1.0, seed=0, device="cpu", model="mlp", hidden=(8,),
                          method_options=opts, early_stopping=early)


def _sanitize_data(seed=0):
    return gaussian_records(80, seed)


def test_frozen_mode_leaves_the_public_encoder_bit_identical():
    from dpclip.train import build_run

    x, y = _sanitize_data()
    public = _sanitize_data(seed=1)
    run = build_run((6,), 3, len(x), _sanitize_cfg(), public)
    encoder = {k: v.clone() for k, v in run.model.state_dict().items()
               if not k.startswith("head.")}
    head = run.model.state_dict()["head.weight"].clone()
    run.fit(torch.as_tensor(x), torch.as_tensor(y), progress=False, desc="t")
    after = run.model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in encoder.items())
    assert not torch.equal(head, after["head.weight"])  # the head did train
    record = run.privacy_record()
    assert record["dp_guarantee"] is True and record["releases_per_record"] == 4
    assert record["epsilon"] == pytest.approx(record_epsilon(run.sigma, 4, 1e-5))
    assert record["epsilon"] <= 4.0
    assert [m for m in dict(run.model.named_children())] == [
        "flatten", "fc1", "act1", "fc2", "act2", "fc3", "act3", "fc4", "act4", "sanitizer",
        "head"]  # the funnel 8n, 4n, 2n, n with n = 2
    assert run.model.fc4.out_features == 2 and run.model.fc1.out_features == 16


def test_joint_mode_is_flagged_and_says_what_its_epsilon_covers():
    from dpclip.train import train_model

    x, y = _sanitize_data()
    result = train_model(x, y, (6,), 3, _sanitize_cfg(encoder="joint"), progress=False)
    assert result.privacy["dp_guarantee"] is False
    assert "sanitized activations only" in result.privacy["epsilon_covers"]


def test_paper_accounting_reproduces_the_papers_own_epsilons():
    """The paper's CIFAR-10 numbers (sigma 1, B 250 of 50,000, delta 1e-5): epsilon 4.00 after
    82 epochs, 4.46 after 100, 2.34 after 30, from the DP-SGD accountant at q = B / N; on MNIST
    (60,000) B = 20 gives the paper's epsilon 1 after 100 epochs."""
    cifar = 250 / 50_000
    for epochs, paper in ((82, 4.00), (100, 4.46), (30, 2.34)):
        assert record_epsilon(1.0, epochs * 200, 1e-5, cifar) == pytest.approx(paper, abs=0.01)
    assert record_epsilon(1.0, 100 * 3000, 1e-5, 20 / 60_000) == pytest.approx(1.0, abs=0.01)


def test_paper_accounting_runs_at_the_methods_batch_and_is_flagged():
    from dpclip.train import train_model

    x, y = _sanitize_data()  # 80 records, batch 8: q = 0.1, 10 uses per epoch
    result = train_model(x, y, (6,), 3, _sanitize_cfg(encoder="joint", accounting="paper",
                                                      batch_size=8), progress=False)
    record = result.privacy
    assert record["dp_guarantee"] is False and record["sample_rate"] == pytest.approx(0.1)
    assert record["adjacency"] == "add_remove"  # the notion the paper's accounting claims
    assert "nothing the run gives" in record["epsilon_covers"]
    assert record["steps"] == 4 * 10
    assert record["epsilon"] == pytest.approx(
        record_epsilon(record["noise_multiplier"], 40, 1e-5, 0.1)) and record["epsilon"] <= 4.0
    # the sound accounting of the same run needs far more noise
    sound = train_model(x, y, (6,), 3, _sanitize_cfg(encoder="joint", batch_size=8),
                        progress=False).privacy
    assert sound["noise_multiplier"] > 1.5 * record["noise_multiplier"]


def test_frozen_mode_without_public_data_names_the_split():
    from dpclip.errors import DpclipError
    from dpclip.train import build_run

    x, _ = _sanitize_data()
    with pytest.raises(DpclipError, match="data.split.shadow_train"):
        build_run((6,), 3, len(x), _sanitize_cfg(), None)


def test_early_stopping_reports_the_epoch_and_the_budget_saved():
    from dpclip.train import train_model

    x, y = _sanitize_data()
    # a slope threshold no series can miss: stops at the first full window (epoch 2)
    cfg = _sanitize_cfg(early_stopping={"rule": "slope", "window": 2, "threshold": 1e9})
    result = train_model(x, y, (6,), 3, cfg, progress=False, public=_sanitize_data(seed=1))
    assert result.training["stopped_epoch"] == 2
    sigma = result.privacy["noise_multiplier"]
    full = record_epsilon(sigma, 4, 1e-5)
    # the stopping epoch depends on released (private-data-dependent) values: the odometer
    # bound of 2 releases, by hand with the Gaussian RDP a / (2 sigma^2) per release
    orders = np.asarray(ODOMETER_ORDERS)
    odometer = np.min(2 * orders / (2 * sigma ** 2) + np.log(len(orders) / 1e-5) / (orders - 1))
    assert result.privacy["epsilon"] == pytest.approx(min(full, odometer), rel=1e-9)
    assert result.privacy["epsilon_planned"] == pytest.approx(full)
    assert result.privacy["epsilon_saved"] == pytest.approx(full - result.privacy["epsilon"])
    assert result.privacy["epsilon_saved"] > 0
    # replace-one-features adjacency, and the trace ends on the reported bound (not the
    # fixed-horizon epsilon of the epochs run)
    assert result.privacy["adjacency"] == "replace_one_features"
    assert result.trace[-1]["epsilon_spent"] == result.privacy["epsilon"]
    assert result.trace[-1]["epsilon_spent"] > record_epsilon(sigma, 2, 1e-5)
    flags = [row["early_stop_flag"] for row in result.trace if "early_stop_flag" in row]
    assert flags == [False, True] and "monitored_std" in result.trace[-1]


def test_adaptive_clip_follows_the_sanitization_layer_weights():
    from dpclip.train import build_run

    x, y = _sanitize_data()
    run = build_run((6,), 3, len(x), _sanitize_cfg(adaptive=True, t=0.5, encoder="joint"))
    run.fit(torch.as_tensor(x), torch.as_tensor(y), progress=False, desc="t")
    expected = 0.5 * float(run.model.fc4.weight.detach().norm())
    assert run.method.clip_threshold == pytest.approx(expected)
    assert run.sanitizer.clip == pytest.approx(expected)


def test_sanitize_options_and_window_are_validated(tiny_raw):
    from dpclip.pipeline.params import parse_params
    from dpclip.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        parse_params(tiny_raw(methods={"sanitize": {"n": 0, "drop_p": 1.0, "t": 0,
                                                    "encoder": "shared", "epochs": 0,
                                                    "head_lr": -1}}))
    for key in ("methods.sanitize.n: 0", "methods.sanitize.drop_p: 1.0", "methods.sanitize.t: 0",
                "methods.sanitize.encoder: 'shared'", "methods.sanitize.epochs: 0",
                "methods.sanitize.head_lr: -1"):
        assert key in str(err.value)
    with pytest.raises(ConfigError, match="train.early_stopping.window: 1"):
        parse_params(tiny_raw(train={"early_stopping": {"rule": "slope", "window": 1}}))


def test_sanitize_through_the_cli_with_early_stopping(tmp_path, tiny_raw, write_params):
    import json

    from conftest import prepared_project
    from dpclip.cli import main

    raw = tiny_raw(train={"methods": ["sanitize"], "epochs": 4,
                          "early_stopping": {"rule": "slope", "window": 2, "threshold": 1e9}},
                   methods={"sanitize": {"n": 2, "public_steps": 10, "epochs": 4}})
    base = prepared_project(tmp_path, raw, write_params)
    run = ["--method", "sanitize", "--epsilon", "8", "--alpha", "iid", "--seed", "0"]
    assert main([*base, "train", *run]) == 0
    assert main([*base, "evaluate", *run]) == 0
    metrics = json.loads((tmp_path / "metrics" / "sanitize-eps8-iid-seed0.json").read_text())
    assert metrics["training"]["stopped_epoch"] == 2
    assert metrics["privacy"]["epsilon_saved"] > 0 and metrics["privacy"]["epsilon"] < 8
    assert (tmp_path / "figures" / "sanitize-eps8-iid-seed0" / "early_stopping.png").exists()
    assert list(metrics["mia"]["ir"]["layers"]) == ["fc1", "fc2", "fc3", "fc4", "head"]


def test_the_funnel_sits_on_the_cnn_trunk_for_images():
    from dpclip.train import train_model

    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 3, size=48)
    public = (rng.normal(size=(32, 1, 8, 8)).astype(np.float32), rng.integers(0, 3, size=32))
    cfg = _sanitize_cfg(epochs=1).with_train(model="cnn")
    result = train_model(x, y, (1, 8, 8), 3, cfg, progress=False, public=public)
    names = [name for name, _ in result.model.named_children()]
    assert names[:2] == ["conv1", "cact1"]
    assert names[names.index("act4") + 1] == "sanitizer"
    assert [result.model.get_submodule(f"fc{i}").out_features for i in (1, 2, 3, 4)] == \
        [16, 8, 4, 2]
    assert result.privacy["releases_per_record"] == 1


# --- real-data behaviour: the private phase must learn (issue 12) -------------------------------

def _separable_records(n: int, seed: int, label_map=(0, 1, 2)):
    """n records of 6 features whose class (0, 1, 2) moves the mean by 3 along one axis each;
    ``label_map`` renames the classes (a public dataset whose labels name other classes)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, size=n)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    x[np.arange(n), y] += 3.0
    return x, np.asarray(label_map)[y]


def _accuracy(model, x, y) -> float:
    with torch.no_grad():
        return float((model(torch.as_tensor(x)).argmax(1).numpy() == y).mean())


@pytest.mark.parametrize("head_fit", ["class_means", "sgd"])
def test_private_phase_beats_chance_and_the_public_only_model(head_fit):
    """The collapse seen on Fashion-MNIST: the public data's labels name other classes, so the
    pre-trained head is wrong for the private task, and at a small epsilon each release is
    mostly noise (noise std about 6 per unit against activations in [0, 1]). The class-means
    head must then beat chance and the public-only model by a clear margin; the paper's SGD
    head, started from the public head, does not (it stays near the public model)."""
    from dpclip.train import PublicData, build_run

    x, y = _separable_records(1500, seed=0)
    held_x, held_y = _separable_records(600, seed=1)
    relabel = (2, 0, 1)  # the public task's class c is the private task's class relabel[c]
    public = PublicData(*_separable_records(600, 2, relabel),
                        held_out=_separable_records(300, 3, relabel))
    # another task's public data: its holdout cannot choose the head (keep_public_head off)
    cfg = _sanitize_cfg(head_fit=head_fit, public_steps=300, epochs=4, drop_p=0.1, n=4,
                        keep_public_head=False)
    cfg = _with(cfg, target_epsilon=2.0, batch_size=64)
    run = build_run((6,), 3, len(x), cfg, public)
    assert run.public_fit["public_held_out_accuracy"] > 0.9  # the encoder did learn (publicly)
    public_only = _accuracy(run.model, held_x, held_y)
    assert public_only < 0.2  # relabelled: the public head is wrong for the private task
    run.fit(torch.as_tensor(x), torch.as_tensor(y), progress=False, desc="t")
    private = _accuracy(run.model, held_x, held_y)
    assert run.sigma * math.sqrt(3.6) > 3  # the noise dwarfs the activations in [0, 1]
    if head_fit == "class_means":
        assert private > max(1 / 3, public_only) + 0.3
    else:
        assert private < 1 / 3 + 0.1  # the literal rule's collapse, kept visible


def _with(cfg, *, target_epsilon, batch_size):
    import dataclasses

    return dataclasses.replace(cfg, target_epsilon=target_epsilon).with_train(
        batch_size=batch_size)


def test_the_sound_variant_never_falls_below_its_public_only_model():
    """Public data of the private task, an epsilon so small that the class means are mostly
    noise: the private head scores below the public pre-training's head on the public holdout,
    so the released model keeps the public head and matches the public-only model; at a
    larger epsilon the private head wins and is kept."""
    from dpclip.train import PublicData, build_run

    x, y = _separable_records(300, seed=0)
    held_x, held_y = _separable_records(600, seed=1)
    public = PublicData(*_separable_records(600, 2), held_out=_separable_records(300, 3))
    results = {}
    for epsilon in (0.3, 50.0):
        cfg = _with(_sanitize_cfg(public_steps=300, epochs=4, drop_p=0.1, n=4),
                    target_epsilon=epsilon, batch_size=64)
        run = build_run((6,), 3, len(x), cfg, public)
        public_only = _accuracy(run.model, held_x, held_y)
        run.fit(torch.as_tensor(x), torch.as_tensor(y), progress=False, desc="t")
        fit = run.public_fit
        assert fit["head_kept"] == ("public" if fit["public_head_public_accuracy"]
                                    > fit["private_head_public_accuracy"] else "private")
        results[epsilon] = (fit["head_kept"], public_only, _accuracy(run.model, held_x, held_y))
    kept, public_only, released = results[0.3]
    assert kept == "public" and released == public_only  # the public model, unchanged
    assert results[50.0][0] == "private"


def test_keep_public_head_is_refused_with_another_datasets_public_split(tiny_raw):
    from dpclip.pipeline.params import parse_params
    from dpclip.errors import ConfigError

    other = {"data": {"shadow_dataset": "digits"}, "train": {"methods": ["sanitize"]}}
    with pytest.raises(ConfigError, match="methods.sanitize.keep_public_head: True would "
                                          "choose the head on another dataset's task"):
        parse_params(tiny_raw(**other, methods={"sanitize": {"keep_public_head": True}}))
    assert parse_params(tiny_raw(**other))  # the default, auto, turns it off there
    assert parse_params(tiny_raw(**other, methods={"sanitize": {"keep_public_head": False}}))
    assert parse_params(tiny_raw(train={"methods": ["sanitize"]}))  # its own public split


def test_public_pretraining_stops_on_the_held_out_split_and_keeps_the_best_weights():
    from dpclip.train import PublicData, build_run

    x, y = _separable_records(200, seed=0)
    # a public train split whose labels are noise: held-out loss stops improving early
    noise_x, _ = _separable_records(400, seed=2)
    noise_y = np.random.default_rng(5).integers(0, 3, size=400)
    public = PublicData(noise_x, noise_y, held_out=_separable_records(300, 3))
    cfg = _sanitize_cfg(public_steps=5000, public_check_every=10, public_patience=3)
    run = build_run((6,), 3, len(x), cfg, public)
    steps = run.public_fit["public_steps_run"]
    assert steps < 5000 and steps % 10 == 0  # stopped at a check, long before the budget
    # the kept weights are the best checked ones: their held-out loss is the record's, and it
    # is no worse than where training stopped
    assert run.public_fit["public_held_out_loss"] <= math.log(3) + 0.2
    # without a held-out split the budget alone bounds the pre-training
    run = build_run((6,), 3, len(x), _sanitize_cfg(public_steps=37), (noise_x, noise_y))
    assert run.public_fit == {"public_steps_run": 37}


def test_the_methods_own_optimizer_trains_the_private_layers():
    from dpclip.train import build_run

    x, _ = _sanitize_data()
    joint = build_run((6,), 3, len(x), _sanitize_cfg(encoder="joint", optimizer="adam"))
    assert isinstance(joint.optimizer, torch.optim.Adam)
    assert joint.optimizer.param_groups[0]["lr"] == 0.1  # head_lr
    plain = build_run((6,), 3, len(x), _sanitize_cfg(encoder="joint"))  # train.optimizer: sgd
    assert isinstance(plain.optimizer, torch.optim.SGD)


def test_a_record_that_overflows_the_encoder_releases_nothing_out_of_range():
    """A re-audit: one record with every feature at 3e38 (finite, accepted) made the released
    head partly NaN, since clamp passes NaN through: whether the head is finite told whether
    the record was a member."""
    from dpclip.train import train_model

    z = torch.tensor([[float("nan"), float("inf"), -float("inf"), 0.5]])
    assert torch.equal(clip_activations(z, 1.0), torch.tensor([[0.0, 1.0, 0.0, 0.5]]))
    assert torch.equal(clip_activations(z, 1.0, signed=True),
                       torch.tensor([[0.0, 1.0, -1.0, 0.5]]))
    x, y = _sanitize_data()
    x[3] = 3e38
    result = train_model(x, y, (6,), 3, _sanitize_cfg(), progress=False,
                         public=_sanitize_data(seed=1))
    assert all(torch.isfinite(p).all() for p in result.model.parameters())
