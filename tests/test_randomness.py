"""Every random draw comes from generators the run owns and checkpoints (docs/privacy.md,
"Randomness"); ``privacy.secure_noise`` seeds them from OS entropy and stores nothing."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from conftest import gaussian_records, tiny_train_config
from dpclip.pipeline.params import parse_params
from dpclip.errors import ConfigError
from dpclip.randomness import NoiseSources
from dpclip.train import train_model
from dpclip.train.runs.private import PrivateRun

EXTRA_QUERY_OPTIONS = {"dc_sgd_p": {}, "adaclip": {"count_noise_fraction": 0.2},
                       "lm_dp_sgd": {}}
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _cfg(method="dp_sgd", **kw):
    return tiny_train_config(method, **{"epochs": 4, **kw})


def _record_normal_draws(monkeypatch) -> list[bytes]:
    """Every torch.normal draw of the test, as bytes (gradient noise and extra answers)."""
    draws, original = [], torch.normal

    def recording(*args, **kwargs):
        out = original(*args, **kwargs)
        draws.append(out.detach().cpu().numpy().tobytes())
        return out

    monkeypatch.setattr(torch, "normal", recording)
    return draws


def _crash_in_epoch(monkeypatch, epoch_to_crash: int):
    original = PrivateRun.run_epoch

    def crashing(self, x, y, epoch, bar):
        if epoch == epoch_to_crash:
            raise KeyboardInterrupt
        return original(self, x, y, epoch, bar)

    monkeypatch.setattr(PrivateRun, "run_epoch", crashing)
    return lambda: monkeypatch.setattr(PrivateRun, "run_epoch", original)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", sorted(EXTRA_QUERY_OPTIONS))
def test_a_resumed_run_never_repeats_a_draw_on_the_gpu_code_path(tmp_path, monkeypatch,
                                                                   method, device):
    # A GPU run used to draw extra answers from torch's global CPU generator (the hook
    # Method.cpu_generator returned None off the CPU), re-seeded from train.seed on resume:
    # step k*S + j then repeated step j's noisy histogram or count. The patch forces that path
    # on code that still has the hook (it fails there); today the hook is gone and every draw
    # comes from the run's own streams on every device, so the patch changes nothing.
    from dpclip.methods import base

    monkeypatch.setattr(base.Method, "cpu_generator", lambda self, g: None, raising=False)
    x, y = gaussian_records(100)
    cfg = _cfg(method, method_options=EXTRA_QUERY_OPTIONS[method], device=device)
    reference = train_model(x, y, (6,), 3, cfg, progress=False)
    draws = _record_normal_draws(monkeypatch)
    restore = _crash_in_epoch(monkeypatch, 3)
    path = tmp_path / "ckpt.pt"
    with pytest.raises(KeyboardInterrupt):
        train_model(x, y, (6,), 3, cfg, progress=False, checkpoint_path=path,
                    checkpoint_every=1)
    before_resume = len(draws)
    restore()
    resumed = train_model(x, y, (6,), 3, cfg, progress=False, checkpoint_path=path,
                          checkpoint_every=1)
    # epochs 1-2 then 3-4: 40 steps, each with noise on 4 parameters and one extra answer
    assert before_resume == 20 * 5 and len(draws) == 40 * 5
    assert len(set(draws)) == len(draws), "a draw after the resume repeats an earlier one"
    for a, b in zip(reference.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)
    assert [r["clip_threshold"] for r in resumed.trace] == \
        [r["clip_threshold"] for r in reference.trace]
    assert reference.time["device"].startswith(device)


def test_streams_are_separate_and_checkpointed():
    rng = NoiseSources.for_run(3)
    state = rng.state_dict()
    first = [torch.rand(4, generator=getattr(rng, s)) for s in ("sampling", "noise", "extras")]
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[1], first[2])
    again = NoiseSources.for_run(99)
    again.load_state_dict(state)
    for name, drawn in zip(("sampling", "noise", "extras"), first):
        assert torch.equal(torch.rand(4, generator=getattr(again, name)), drawn)


def test_secure_noise_is_not_replayable_and_stores_no_state(tmp_path, monkeypatch):
    # The audit replayed a run from train.seed and matched its weights bit for bit; with
    # secure noise the same seed and data give other weights, and no checkpoint holds a state.
    x, y = gaussian_records(100)
    cfg = _cfg(secure_noise=True)
    first = train_model(x, y, (6,), 3, cfg, progress=False)
    second = train_model(x, y, (6,), 3, cfg, progress=False)
    assert any(not torch.equal(a, b) for a, b in
               zip(first.model.parameters(), second.model.parameters()))
    assert first.privacy["secure_noise"] is True and first.privacy["reproducible"] is False
    plain = train_model(x, y, (6,), 3, _cfg(), progress=False)
    assert plain.privacy["secure_noise"] is False and plain.privacy["reproducible"] is True
    restore = _crash_in_epoch(monkeypatch, 3)
    path = tmp_path / "ckpt.pt"
    with pytest.raises(KeyboardInterrupt):
        train_model(x, y, (6,), 3, cfg, progress=False, checkpoint_path=path,
                    checkpoint_every=1)
    saved = torch.load(path, weights_only=True)
    assert saved["run"]["rng"] == {"secure": True}
    restore()
    resumed = train_model(x, y, (6,), 3, cfg, progress=False, checkpoint_path=path,
                          checkpoint_every=1)
    assert len(resumed.trace) == len(first.trace)
    assert resumed.privacy["epsilon"] == pytest.approx(first.privacy["epsilon"])


def test_secure_noise_parameter_is_validated(tiny_raw):
    assert parse_params(tiny_raw(privacy={"secure_noise": True})).privacy.secure_noise is True
    assert parse_params(tiny_raw()).privacy.secure_noise is False
    with pytest.raises(ConfigError, match="privacy.secure_noise: 'yes'"):
        parse_params(tiny_raw(privacy={"secure_noise": "yes"}))


def test_every_record_states_adjacency_noise_and_data_use():
    x, y = gaussian_records(100)
    for method, adjacency in (("dp_sgd", "add_remove"), ("non_private", None)):
        privacy = train_model(x, y, (6,), 3, _cfg(method, epochs=1), progress=False).privacy
        assert privacy["adjacency"] == adjacency
        assert "weights" in privacy["data_use"]
    assert np.isfinite(privacy["steps"])


def test_growing_the_matrix_keeps_a_run_s_checkpoint(tmp_path):
    """Adding a seed, a method or a target epsilon to params.yaml (the documented way to grow
    a sweep) does not change an existing run's fingerprint; changing what the run trains does."""
    from dataclasses import replace

    from dpclip.train.checkpoint import Checkpoint

    x, y = gaussian_records(50)
    cfg = _cfg()
    grown = replace(cfg, train=cfg.train.model_copy(update={"seeds": [0, 1, 2],
                                                             "methods": ["dp_sgd", "auto_s"],
                                                             "checkpoint_every": 2}),
                    privacy=cfg.privacy.model_copy(update={"target_epsilons": [1, 4, 8]}))
    fingerprint = Checkpoint.for_run(tmp_path, 1, cfg, x, y).fingerprint
    assert Checkpoint.for_run(tmp_path, 1, grown, x, y).fingerprint == fingerprint
    assert Checkpoint.for_run(tmp_path, 1, cfg.with_train(lr=0.2), x, y).fingerprint != \
        fingerprint
    assert Checkpoint.for_run(tmp_path, 1, replace(cfg, seed=1), x, y).fingerprint != \
        fingerprint


def _weight_gap(cfg_a, cfg_b) -> float:
    """RMS per coordinate of W_a - W_b for two runs on the same records."""
    x, y = gaussian_records(100)
    a = train_model(x, y, (6,), 3, cfg_a, progress=False).model
    b = train_model(x, y, (6,), 3, cfg_b, progress=False).model
    gap = torch.cat([(p - q).detach().flatten() for p, q in zip(a.parameters(), b.parameters())])
    return float(gap.square().mean().sqrt())


def test_released_models_of_different_methods_carry_independent_noise():
    # The audit found dp_sgd and dp_psac of one seed adding the very same noise at every step:
    # their difference held no noise (RMS 0.0019 against 0.26 for independent runs). By
    # default each run's streams come from its whole identity; sharing them is an option.
    independent = _weight_gap(_cfg("dp_sgd"), _cfg("dp_psac"))
    shared = _weight_gap(_cfg("dp_sgd", common_random_numbers=True),
                         _cfg("dp_psac", common_random_numbers=True))
    # one run and the same run on other streams: the level of independent noise
    reference = _weight_gap(_cfg("dp_sgd"), replace(_cfg("dp_sgd"), data_label="other"))
    assert shared < 0.2 * reference
    assert 0.5 * reference < independent < 2 * reference


def test_the_record_says_when_noise_is_shared():
    x, y = gaussian_records(60)
    shared = train_model(x, y, (6,), 3, _cfg(epochs=1, common_random_numbers=True),
                         progress=False).privacy
    own = train_model(x, y, (6,), 3, _cfg(epochs=1), progress=False).privacy
    assert shared["noise_shared_across_runs"] is True
    assert own["noise_shared_across_runs"] is False


def test_streams_depend_on_the_run_s_identity_and_data_label():
    draw = lambda cfg: torch.rand(3, generator=NoiseSources.for_run(  # noqa: E731
        cfg.seed, key=cfg.stream_key()).noise)
    base = _cfg()
    assert torch.equal(draw(base), draw(_cfg()))  # the same run: reproducible
    for other in (_cfg(lr=0.2), _cfg(target_epsilon=2.0), _cfg("auto_s"),
                  replace(base, data_label="csv alpha=0.1")):
        assert not torch.equal(draw(base), draw(other))
    assert _cfg(common_random_numbers=True).stream_key() is None


def test_common_random_numbers_and_secure_noise_exclude_each_other(tiny_raw):
    with pytest.raises(ConfigError, match="common_random_numbers"):
        parse_params(tiny_raw(privacy={"secure_noise": True, "common_random_numbers": True}))


def test_retraining_after_a_deletion_draws_fresh_noise():
    # a re-audit: the same configuration on D and on D minus one record drew the same noise,
    # so the two models' difference (RMS 0.08) was nearly noise-free: a deletion and retrain
    # would expose the deleted record
    x, y = gaussian_records(100)

    def weights(x, y, cfg):
        return torch.cat([p.detach().flatten() for p in
                          train_model(x, y, (6,), 3, cfg, progress=False).model.parameters()])

    # the last record deleted: with shared streams every other record's draws stay the same
    full, deleted = weights(x, y, _cfg()), weights(x[:-1], y[:-1], _cfg())
    gap = float((full - deleted).square().mean().sqrt())
    reference = _weight_gap(_cfg("dp_sgd"), replace(_cfg("dp_sgd"), data_label="other"))
    assert gap > 0.5 * reference  # with the key of the configuration alone: 0.04 < 0.049
