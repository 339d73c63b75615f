"""Issue 4: shadow-model layer-wise risk, LM-DP-SGD and layer-wise IR membership inference."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import prepared_project, shadow_risk_for
from dpclip.attacks.common.layerwise import membership_attack
from dpclip.attacks.common.representations import layer_representations, reduce_map
from dpclip.cli import main
from dpclip.pipeline.params import parse_params
from dpclip.errors import ConfigError, DpclipError
from dpclip.methods import get_method
from dpclip.methods.base import MethodContext, StepRelease
from dpclip.methods.lm_dp_sgd import layer_weights
from dpclip.models import build_model
from dpclip.randomness import NoiseSources

MODES = ("private", "public", "batch")


def _lm(mode, names, clip=1.0, r=2.0, error_rates=None, shares=None, batch=8.0):
    options = {"weights": mode, "r": r, "sigma_w_ratio": 5.0, "w_floor": 0.01}
    method = get_method("lm_dp_sgd")(MethodContext(
        clip, names, expected_batch=batch,
        options=get_method("lm_dp_sgd").parse_options(options),
        shadow_risk=shadow_risk_for(names, error_rates, shares)))
    method.bind_noise(1.0, 1.05)
    return method


# --- LM-DP-SGD ----------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_reweighted_gradient_has_norm_min_of_clip_and_its_norm(mode, data):
    n_layers = data.draw(st.integers(1, 5))
    batch = data.draw(st.integers(1, 12))
    clip = data.draw(st.floats(1e-3, 1e3))
    rates = data.draw(st.lists(st.floats(0.0, 1.0), min_size=n_layers, max_size=n_layers))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 31 - 1)))
    layer_norms = (10 ** (torch.rand(batch, n_layers, generator=gen) * 12 - 6)).double()
    method = _lm(mode, [f"l{i}" for i in range(n_layers)], clip=clip, error_rates=rates)
    factors = method.scale(layer_norms)
    scaled = (factors * layer_norms).pow(2).sum(dim=1).sqrt()       # ||ghat_i||
    expected = layer_norms.pow(2).sum(dim=1).sqrt().clamp(max=clip)  # C_i = min(C, n_i)
    torch.testing.assert_close(scaled, expected, rtol=1e-9, atol=0.0)
    assert torch.all(scaled <= clip * (1 + 1e-12))


@pytest.mark.parametrize("mode", MODES)
def test_a_layer_with_zero_gradient_stays_zero_and_the_bound_holds(mode):
    method = _lm(mode, ["a", "b"], clip=1.0)
    norms = torch.tensor([[0.0, 3.0], [2.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    scaled = method.scale(norms) * norms  # ||ghat_i^(l)||
    assert scaled[0, 0] == 0 and scaled[1, 1] == 0 and torch.all(scaled[2] == 0)
    assert torch.all(scaled.pow(2).sum(dim=1).sqrt() <= 1.0 + 1e-12)
    assert torch.all(torch.isfinite(method.scale(norms)))


def test_weights_are_unit_norm_and_follow_error_rate_to_the_power_r():
    # hand case: w_base = 1, ER = (0.5, 0.25, 0.1), r = 2 -> w ∝ (0.25, 0.0625, 0.01)
    w = layer_weights(np.ones(3), np.array([0.5, 0.25, 0.1]), r=2.0)
    norm = math.sqrt(0.25 ** 2 + 0.0625 ** 2 + 0.01 ** 2)
    np.testing.assert_allclose(w, [0.25 / norm, 0.0625 / norm, 0.01 / norm], rtol=1e-12)
    assert np.linalg.norm(w) == pytest.approx(1.0, abs=1e-12)
    # with a base, the risk multiplies it: base (2, 1), ER (0.5, 0.5), r = 3 -> (2, 1) / sqrt 5
    np.testing.assert_allclose(layer_weights(np.array([2.0, 1.0]), np.array([0.5, 0.5]), 3.0),
                               [2 / math.sqrt(5), 1 / math.sqrt(5)], rtol=1e-12)


def test_public_mode_uses_the_shadow_shares_and_batch_mode_the_batch_ratios():
    public = _lm("public", ["a", "b"], error_rates=[0.5, 0.5], shares=[3.0, 4.0])
    np.testing.assert_allclose(public.weights, [0.6, 0.8])
    batch = _lm("batch", ["a", "b"], clip=1.0, error_rates=[0.5, 0.5])
    # n_i = 5 for both rows, C_i = 1: w_base = mean of n^(l) / C_i = ((3 + 0)/2, (4 + 5)/2)
    batch.scale(torch.tensor([[3.0, 4.0], [0.0, 5.0]], dtype=torch.float64))
    np.testing.assert_allclose(batch.weights, np.array([1.5, 4.5]) / math.hypot(1.5, 4.5))


def test_private_mode_declares_its_query_and_reads_only_the_noisy_release():
    method = _lm("private", ["a", "b"], error_rates=[0.5, 0.5], shares=[1.0, 1.0], batch=10.0)
    (query,) = method.extra_queries(1.0)
    assert query.sensitivity == 1.0 and query.noise_std == 5.0
    assert query.option == "methods.lm_dp_sgd.sigma_w_ratio"
    # noisy sum of unit vectors (6, -2) over B = 10: (0.6, floor 0.01) -> weights ∝ (0.6, 0.01)
    method.update(StepRelease(step=1, noisy_grad=[], extras={"layer_shares": [6.0, -2.0]}))
    np.testing.assert_allclose(method.weights, np.array([0.6, 0.01]) / math.hypot(0.6, 0.01))
    released = method.release_extras(torch.tensor([[3.0, 4.0], [0.0, 2.0]]),
                                      NoiseSources.seeded(0))["layer_shares"]
    noise = released - np.array([0.6, 0.8 + 1.0])  # units (0.6, 0.8) and (0, 1)
    assert np.all(np.abs(noise) < 5.0 * 6)  # N(0, 5^2) per layer


def test_only_the_literal_batch_mode_is_flagged(tmp_path):
    for mode in MODES:
        method = _lm(mode, ["a"])
        assert method.claim.dp_guarantee is (mode != "batch")
        assert type(method).privacy_claim(method.options) == method.claim
        extras = method.extra_queries(1.0)
        assert (len(extras) == 1) is (mode == "private")


def test_emphasis_below_one_and_unknown_weight_source_name_their_keys(tiny_raw):
    with pytest.raises(ConfigError) as err:
        parse_params(tiny_raw(methods={"lm_dp_sgd": {"r": 0.5, "weights": "magic"}}))
    assert "methods.lm_dp_sgd.r: 0.5" in str(err.value)
    assert "methods.lm_dp_sgd.weights: 'magic'" in str(err.value)


def test_risk_eval_and_classifier_are_validated(tiny_raw):
    with pytest.raises(ConfigError) as err:
        parse_params(tiny_raw(shadow={"risk_eval": "test", "alpha": -1},
                              attack={"classifier": "svm", "folds": 1}))
    for key in ("shadow.risk_eval: 'test'", "shadow.alpha: -1", "attack.classifier: 'svm'",
                "attack.folds: 1"):
        assert key in str(err.value)


# --- the attack ----------------------------------------------------------------------------------

def test_error_rate_is_zero_on_a_separating_layer_and_a_half_on_a_signal_free_one():
    rng = np.random.default_rng(0)
    members = rng.normal(size=(300, 4))
    nonmembers = rng.normal(size=(300, 4))
    members[:, 0] += 10.0  # one coordinate separates perfectly
    separated = membership_attack(members, nonmembers, folds=5, seed=0)
    assert separated["error_rate"] <= 0.01 and separated["auc"] >= 0.99
    same = membership_attack(rng.normal(size=(300, 4)), rng.normal(size=(300, 4)), seed=0)
    assert abs(same["error_rate"] - 0.5) < 0.07 and abs(same["auc"] - 0.5) < 0.08


def test_attack_balances_members_and_refuses_too_few_records():
    rng = np.random.default_rng(1)
    result = membership_attack(rng.normal(size=(50, 3)), rng.normal(size=(20, 3)), folds=4)
    assert result["n_each"] == 20
    with pytest.raises(DpclipError, match="attack.folds = 5"):
        membership_attack(rng.normal(size=(3, 3)), rng.normal(size=(9, 3)), folds=5)


def test_train_evaluation_scores_the_classifiers_own_training_set():
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(40, 60)), rng.normal(size=(40, 60))  # no signal, many features
    cv = membership_attack(a, b, evaluation="cv", seed=0)
    literal = membership_attack(a, b, evaluation="train", seed=0)
    assert literal["accuracy"] == 1.0  # memorised: the literal protocol's blind spot
    assert cv["accuracy"] < 0.75


# --- intermediate representations --------------------------------------------------------------

def test_mlp_representations_have_one_matrix_per_named_layer():
    model = build_model("mlp", (1, 8, 8), 10, [32, 16])
    reps = layer_representations(model, np.zeros((7, 1, 8, 8), np.float32))
    assert {k: v.shape for k, v in reps.items()} == {"fc1": (7, 32), "fc2": (7, 16),
                                                    "head": (7, 10)}
    assert all(v.dtype == np.float32 for v in reps.values())


def test_cnn_maps_are_pooled_to_the_documented_shapes():
    model = build_model("cnn", (1, 8, 8), 10, [16])
    x = np.random.default_rng(0).normal(size=(5, 1, 8, 8)).astype(np.float32)
    reps = layer_representations(model, x, max_features=512, batch=2)
    # conv1: 16 x 8 x 8 = 1024 > 512 -> 5 x 5 cells (16 * 25 <= 512): 400; conv2: 32 x 4 x 4 =
    # 512 kept whole; fc1: 16; head: 10
    assert {k: v.shape for k, v in reps.items()} == {"conv1": (5, 400), "conv2": (5, 512),
                                                    "fc1": (5, 16), "head": (5, 10)}
    # the pooling is adaptive average pooling: the mean of the whole map with one cell
    full = torch.randn(3, 4, 6, 6)
    torch.testing.assert_close(reduce_map(full, 4), full.mean(dim=(2, 3)))


# --- the shadow stage, lm_dp_sgd and evaluate through the CLI ------------------------------------

def _project(tmp_path, tiny_raw, write_params, **override):
    """A prepared project whose methods read the shadow risk (lm_dp_sgd), unless ``train``
    is overridden: without one the shadow stage trains nothing."""
    override.setdefault("train", {"methods": ["dp_sgd", "lm_dp_sgd"]})
    return prepared_project(tmp_path, tiny_raw(**override), write_params)


def test_the_shadow_model_trains_only_when_needed_and_is_kept_while_current(
        tmp_path, tiny_raw, write_params, capsys):
    """Without a method that reads the risk nothing is trained and risk.json says why; with
    one, the model trains once and a second call with the same inputs keeps it (a change of
    train.methods that still needs it costs nothing); a changed input trains it again."""
    base = _project(tmp_path, tiny_raw, write_params, train={"methods": ["dp_sgd"]},
                    shadow={"epochs": 1})
    assert main([*base, "shadow"]) == 0
    assert "no shadow model: no configured method reads" in capsys.readouterr().out
    risk = json.loads((tmp_path / "shadow" / "risk.json").read_text())
    assert risk["needed"] is False and "lm_dp_sgd" in risk["reason"]
    assert sorted(p.name for p in (tmp_path / "shadow").iterdir()) == ["risk.json"]
    # the record names no configured method: adding one that does not read it changes nothing
    # that the tune stage hashes
    first_record = (tmp_path / "shadow" / "risk.json").read_bytes()
    write_params(tiny_raw(train={"methods": ["dp_sgd", "auto_s"]}, shadow={"epochs": 1}))
    assert main([*base, "shadow"]) == 0
    assert (tmp_path / "shadow" / "risk.json").read_bytes() == first_record
    raw = tiny_raw(train={"methods": ["dp_sgd", "lm_dp_sgd"]}, shadow={"epochs": 1})
    write_params(raw)
    assert main([*base, "shadow"]) == 0
    model = tmp_path / "shadow" / "model.pt"
    first = model.stat().st_mtime_ns
    assert json.loads((tmp_path / "shadow" / "risk.json").read_text())["needed"] is True
    raw["train"]["methods"] = ["lm_dp_sgd"]
    write_params(raw)
    assert main([*base, "shadow"]) == 0
    assert model.stat().st_mtime_ns == first  # kept
    assert "shadow model (up to date, kept: " in capsys.readouterr().out
    raw["shadow"]["seed"] = 1
    write_params(raw)
    assert main([*base, "shadow"]) == 0
    assert model.stat().st_mtime_ns != first  # trained again
    raw["train"]["methods"] = ["dp_sgd"]
    write_params(raw)
    assert main([*base, "shadow"]) == 0
    assert not model.exists()  # nothing left that could pass for current


def test_shadow_lm_dp_sgd_and_layerwise_evaluation_end_to_end(tmp_path, tiny_raw, write_params,
                                                              capsys):
    base = _project(tmp_path, tiny_raw, write_params,
                    train={"methods": ["dp_sgd", "lm_dp_sgd"], "epochs": 1},
                    shadow={"epochs": 3})
    assert main([*base, "shadow"]) == 0
    risk = json.loads((tmp_path / "shadow" / "risk.json").read_text())
    assert risk["layer_names"] == ["fc1", "head"] and (tmp_path / "shadow" / "risk.png").exists()
    for layer in risk["layers"].values():
        assert 0.0 <= layer["error_rate"] <= 1.0 and 0.0 <= layer["norm_share"] <= 1.0
    run = ["--epsilon", "8", "--alpha", "iid", "--seed", "0"]
    assert main([*base, "train", "--method", "lm_dp_sgd", *run]) == 0
    assert main([*base, "evaluate", "--method", "lm_dp_sgd", *run]) == 0
    metrics = json.loads((tmp_path / "metrics" / "lm_dp_sgd-eps8-iid-seed0.json").read_text())
    assert metrics["privacy"]["dp_guarantee"] is True and metrics["privacy"]["epsilon"] <= 8
    assert "sigma_layer_shares" in metrics["privacy"]
    ir = metrics["mia"]["ir"]
    assert list(ir["layers"]) == ["fc1", "head"]
    assert ir["peak_accuracy"] == max(v["accuracy"] for v in ir["layers"].values())
    assert ir["layers"][ir["peak_layer"]]["accuracy"] == ir["peak_accuracy"]
    trace = (tmp_path / "traces" / "lm_dp_sgd-eps8-iid-seed0.csv").read_text().splitlines()
    assert "lm_w_fc1" in trace[0] and "lm_w_head" in trace[0]
    assert (tmp_path / "plots" / "ir_mia" / "lm_dp_sgd-eps8-iid-seed0.csv").exists()
    assert (tmp_path / "figures" / "lm_dp_sgd-eps8-iid-seed0" / "ir_mia.png").exists()


def test_lm_dp_sgd_refuses_a_risk_file_of_another_model_before_training(tmp_path, tiny_raw,
                                                                       write_params, capsys):
    base = _project(tmp_path, tiny_raw, write_params,
                    train={"methods": ["lm_dp_sgd"], "epochs": 1}, shadow={"epochs": 1})
    run = ["train", "--method", "lm_dp_sgd", "--epsilon", "8", "--alpha", "iid", "--seed", "0"]
    assert main([*base, *run]) == 2
    assert "run `dpclip shadow` first" in capsys.readouterr().err
    assert main([*base, "shadow"]) == 0
    path = tmp_path / "shadow" / "risk.json"
    risk = json.loads(path.read_text())
    wrong_arch = {**risk, "architecture": {**risk["architecture"], "hidden": [64]}}
    path.write_text(json.dumps(wrong_arch))
    assert main([*base, *run]) == 2
    assert "was computed for the architecture" in capsys.readouterr().err
    path.write_text(json.dumps({**risk, "layer_names": ["fc1", "fc2", "head"]}))
    assert main([*base, *run]) == 2
    assert "names the layers" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "traces").exists()


def test_empty_shadow_split_is_named(tmp_path, tiny_raw, write_params, capsys):
    split = {"target_train": 0.5, "target_holdout": 0.3, "shadow_train": 0.0,
             "shadow_holdout": 0.2}
    base = _project(tmp_path, tiny_raw, write_params, data={"split": split})
    assert main([*base, "shadow"]) == 2
    err = capsys.readouterr().err
    assert "data.split.shadow_train = 0.0" in err
    assert not (tmp_path / "shadow").exists()


def test_label_skewed_shadow_data_trains_on_a_subset(tmp_path, tiny_raw, write_params):
    base = _project(tmp_path, tiny_raw, write_params, shadow={"epochs": 1, "alpha": 0.3})
    assert main([*base, "shadow"]) == 0
    risk = json.loads((tmp_path / "shadow" / "risk.json").read_text())
    shadow_train = np.load(tmp_path / "data" / "prepared" / "shadow_train.npz")["y"]
    assert risk["alpha"] == 0.3 and 0 < risk["n_members"] < len(shadow_train)


def test_shadow_max_records_caps_both_public_splits(tmp_path, tiny_raw, write_params):
    base = _project(tmp_path, tiny_raw, write_params,
                    shadow={"epochs": 1, "max_records": 50, "batch_size": 16})
    assert main([*base, "shadow"]) == 0
    risk = json.loads((tmp_path / "shadow" / "risk.json").read_text())
    shadow_train = np.load(tmp_path / "data" / "prepared" / "shadow_train.npz")["y"]
    assert len(shadow_train) > 50
    assert risk["n_members"] == 50 and risk["n_nonmembers"] == 50


def test_at_most_is_a_seeded_ordered_subset_without_repeats():
    from dpclip.stages.shadow import _at_most

    positions = np.arange(100, 300)
    a, b = _at_most(positions, 40, seed=3), _at_most(positions, 40, seed=3)
    assert np.array_equal(a, b) and len(np.unique(a)) == 40 and np.all(np.diff(a) > 0)
    assert set(a) <= set(positions)
    assert not np.array_equal(a, _at_most(positions, 40, seed=4))
    assert np.array_equal(_at_most(positions, 500, seed=3), positions)
    assert np.array_equal(_at_most(positions, None, seed=3), positions)


def test_a_shadow_batch_larger_than_its_records_becomes_a_quarter_with_a_notice(
        tmp_path, tiny_raw, write_params, caplog):
    """Small public data: the shadow model still trains, on a quarter of its records a step,
    and says so (naming the key); risk.json records the batch it used."""
    import json

    base = _project(tmp_path, tiny_raw, write_params, shadow={"epochs": 1, "max_records": 50})
    assert main([*base, "shadow"]) == 0
    assert "shadow.batch_size: 64 is larger than the shadow model's training set (50 public " \
           "records): using 12" in caplog.text
    assert json.loads((tmp_path / "shadow" / "risk.json").read_text())["batch_size"] == 12


def test_the_logistic_attack_fits_the_same_model_as_lbfgs():
    """The fast solver changes the time, not the attack: the same regularised logistic fit
    as scikit-learn's default lbfgs, to solver tolerance."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from dpclip.attacks.common.layerwise import make_classifier

    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 40)) @ rng.normal(size=(40, 40))
    z = (x[:, 0] + rng.normal(scale=3.0, size=600) > 0).astype(int)
    ours = make_classifier("logistic", 0).fit(x, z)
    reference = make_pipeline(StandardScaler(),
                              LogisticRegression(max_iter=10_000, tol=1e-10)).fit(x, z)
    assert np.allclose(ours.predict_proba(x), reference.predict_proba(x), atol=1e-4)
