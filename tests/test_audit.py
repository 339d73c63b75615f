"""The audit has power: a mechanism whose noise is secretly a tenth of what its record claims is
refuted by the white-box audit, the sound mechanism is not, for a whole-record rule (one-layer
canaries) and a per-layer one (LM-DP-SGD, canaries spanning every layer); and the black-box
audit refutes a small epsilon for a non-private model that memorises its canaries."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import tiny_train_config

from dpclip.audit.canaries import GradientCanaries, RAW_NORM
from dpclip.audit.run import audit_blackbox, audit_whitebox
from dpclip.train import build_run
from dpclip.train.step import LayerGroups

CLAIMED = 1.0


def sparse_records(n: int = 200, informative: int = 6, zeros: int = 94, seed: int = 0):
    """Gaussian records padded with always-zero features (like the blank border pixels of
    digits): the weights on those inputs get no gradient from the data, only noise and
    canaries."""
    rng = np.random.default_rng(seed)
    x = np.zeros((n, informative + zeros), dtype=np.float32)
    x[:, :informative] = rng.normal(size=(n, informative))
    return x, rng.integers(0, 3, size=n)


def whitebox(weaken: float, method: str = "dp_sgd", span: str = "auto", hidden=(8,),
             **options) -> dict:
    x, y = sparse_records()
    cfg = tiny_train_config(method, target_epsilon=CLAIMED, batch_size=20, epochs=20,
                            hidden=hidden, method_options=options)
    run = build_run((x.shape[1],), 3, len(x), cfg)
    run.sigma_train /= weaken  # the test-only weakened mechanism; the record still claims 1
    return audit_whitebox(run, x, y, m=300, seed=1, name=f"{method} / {weaken}", span=span)


def test_the_weakened_mechanism_is_refuted_and_the_sound_one_is_not(caplog):
    weakened = whitebox(weaken=10.0)
    assert weakened["claimed_epsilon"] == pytest.approx(CLAIMED, abs=0.02)
    assert weakened["violated"] and weakened["epsilon_lower_bound"] > 2 * CLAIMED
    assert "PRIVACY BUG" in caplog.text
    caplog.clear()
    sound = whitebox(weaken=1.0)
    assert not sound["violated"] and sound["epsilon_lower_bound"] <= CLAIMED
    assert "PRIVACY BUG" not in caplog.text


def test_a_per_layer_rule_is_audited_at_its_full_sensitivity(caplog):
    # lm_dp_sgd clips layer l to C w_l: canaries spanning every layer (the head of 64 x 3 + 3
    # = 195 coordinates bounds them to 195) are clipped to C in all, and a tenth of the noise
    # is refuted (measured: 2.69, against 2.17 with 300 one-layer canaries); the sound
    # mechanism is not
    weakened = whitebox(weaken=10.0, method="lm_dp_sgd", hidden=(64,), weights="public")
    assert weakened["canary_span"] == "every_layer" and weakened["canaries"] == 195
    assert weakened["violated"] and weakened["epsilon_lower_bound"] > 2 * CLAIMED
    assert "PRIVACY BUG" in caplog.text
    caplog.clear()
    sound = whitebox(weaken=1.0, method="lm_dp_sgd", hidden=(64,), weights="public")
    assert not sound["violated"] and sound["epsilon_lower_bound"] <= CLAIMED
    assert "PRIVACY BUG" not in caplog.text
    # a whole-record rule keeps one-layer canaries: as many as asked for
    assert whitebox(weaken=1.0)["canary_span"] == "one_layer"


def test_spanning_canaries_are_clipped_per_layer_and_scored_along_the_rule():
    import torch

    groups = LayerGroups(["fc1", "head"], [[torch.nn.Parameter(torch.zeros(4, 3))],
                                           [torch.nn.Parameter(torch.zeros(2))]], [None, None])
    canaries = GradientCanaries(groups, m=2, q=1.0, seed=0, span="every_layer")
    assert canaries.param.shape == (2, 2) and (canaries.layer == [[0, 1], [0, 1]]).all()
    chosen, norms = canaries.sample("cpu")
    # R / sqrt(2) in each layer: a total norm of R
    assert torch.allclose(norms.norm(dim=1), torch.full((len(chosen),), RAW_NORM))

    class PerLayer:  # C w = (0.6, 0.8) per layer, as LM-DP-SGD with unit-norm weights
        @staticmethod
        def scale(layer_norms):
            return torch.tensor([0.6, 0.8]) / layer_norms.clamp_min(1e-30)

    canaries.observe(PerLayer, "cpu")
    assert canaries.direction == pytest.approx([0.6, 0.8])  # a canary's clipped parts
    sums = [torch.zeros(4, 3), torch.zeros(2)]
    canaries.add(sums, chosen, PerLayer.scale(norms))
    for c in chosen:  # 0.6 at its fc1 coordinate, 0.8 at its head one: norm C = 1
        assert sums[0].view(-1)[canaries.offset[c, 0]] == pytest.approx(0.6)
        assert sums[1].view(-1)[canaries.offset[c, 1]] == pytest.approx(0.8)
    start = [torch.zeros(4, 3), torch.zeros(2)]
    end = [-s for s in sums]  # moved against the clipped gradient
    expected = [1.0 if c in chosen else 0.0 for c in range(2)]  # 0.6^2 + 0.8^2
    assert canaries.scores(start, end) == pytest.approx(expected)
    with pytest.raises(ValueError, match="layer 'head' has 2"):
        GradientCanaries(groups, m=3, q=1.0, seed=0, span="every_layer")


def test_an_adaptive_method_is_audited_through_its_own_rule():
    # AdaClip's noisy count of unclipped records counts the canaries too (they are clipped)
    result = whitebox(weaken=1.0, method="adaclip", count_noise_fraction=1.0)
    assert result["applicable"] and not result["violated"]


def test_gradient_canaries_join_the_sum_clipped_to_the_threshold():
    import torch

    groups = LayerGroups(["fc1", "head"], [[torch.nn.Parameter(torch.zeros(4, 3))],
                                           [torch.nn.Parameter(torch.zeros(2))]], [None, None])
    canaries = GradientCanaries(groups, m=14, q=1.0, seed=0)  # every coordinate, once
    assert sorted(zip(canaries.param.ravel(), canaries.offset.ravel())) == \
        [(0, i) for i in range(12)] + [(1, 0), (1, 1)]
    assert (canaries.layer == canaries.param).all()  # one parameter per layer here
    chosen, norms = canaries.sample("cpu")
    assert len(chosen) and list(chosen) == list(np.flatnonzero(canaries.included))  # q = 1
    assert (norms.sum(dim=1) == RAW_NORM).all()
    assert (norms[torch.arange(len(chosen)), canaries.layer[chosen, 0]] == RAW_NORM).all()
    sums = [torch.zeros(4, 3), torch.zeros(2)]
    # per-layer factors, as a layer-wise rule gives them: C = 0.5 in fc1, 0.25 in head
    factors = torch.tensor([[0.5 / RAW_NORM, 0.25 / RAW_NORM]]).repeat(len(chosen), 1)
    canaries.add(sums, chosen, factors)
    expected = [0.5 if canaries.layer[i, 0] == 0 else 0.25 for i in chosen]
    total = torch.cat([s.reshape(-1) for s in sums])
    assert total.sum().item() == pytest.approx(sum(expected))
    assert sorted(total[total > 0].tolist()) == pytest.approx(sorted(expected))


def test_a_memorising_non_private_model_fails_a_small_epsilon_black_box():
    # 50 features: 60 records and about 100 mislabelled canaries are easy to memorise
    x, y = sparse_records(n=60, informative=50, zeros=0)
    public_x, public_y = sparse_records(n=200, informative=50, zeros=0, seed=2)
    cfg = tiny_train_config("non_private", target_epsilon=None, batch_size=10, epochs=60,
                            hidden=(64,), lr=0.5)
    result = audit_blackbox(x, y, public_x, public_y, (50,), 3, cfg, m=200, seed=3)
    assert result["applicable"] and result["claimed_epsilon"] is None
    assert not result["violated"]  # no claim, nothing to violate
    # but the canaries are plainly memorised: at least 95 of the 100 surest guesses right
    assert result["correct"] >= 0.95 * result["guesses"] and result["epsilon_lower_bound"] > 2


@pytest.mark.parametrize("method", ["dp_sgd", "auto_s"])
@pytest.mark.parametrize("batch", [10, 0], ids=["batch", "empty-batch"])
def test_the_dp_step_clips_canaries_by_the_methods_rule_before_the_noise(method, batch):
    """Two identical runs take one step on the same batch, one with every included canary
    sampled: without noise, the weights differ by exactly lr C / B at the included canaries'
    coordinates (C: the method's clip, B: the expected batch) and nowhere else."""
    import torch

    x, y = sparse_records(n=100)
    cfg = tiny_train_config(method, batch_size=10, hidden=(8,))
    runs = [build_run((x.shape[1],), 3, len(x), cfg) for _ in range(2)]
    canaries = GradientCanaries(runs[1].groups, m=40, q=1.0, seed=5)
    runs[1].canaries = canaries
    seen = []  # the norms the method's extra queries get: the canaries count as records
    release = runs[1].method.release_extras
    runs[1].method.release_extras = lambda norms, rng: seen.append(norms) or release(norms, rng)
    for run in runs:
        run.sigma_train = 0.0  # the noise would hide nothing here, but it differs per call
        run.apply_step(torch.as_tensor(x[:batch]), torch.as_tensor(y[:batch]), step=1)
    flat = [torch.cat([p.detach().reshape(-1) for p in run.groups.flat()]) for run in runs]
    starts = np.cumsum([0] + [p.numel() for p in runs[0].groups.flat()])
    at = starts[canaries.param] + canaries.offset
    moved = (flat[1] - flat[0]).numpy()
    expected = np.zeros_like(moved)
    clip, lr, expected_batch = cfg.train.clip_norm, cfg.train.lr, runs[0].q * 100
    expected[at[canaries.included]] = -lr * clip / expected_batch  # gamma / 1e4 of C: 1e-6
    assert canaries.included.sum() > 5
    assert moved == pytest.approx(expected, rel=1e-4, abs=1e-7)
    (norms,) = seen
    assert len(norms) == batch + canaries.included.sum()
    assert (norms[batch:].sum(dim=1) == RAW_NORM).all()


CANARY_DROPPING_KIND = '''
from dpclip.train.runs.base import register_run_kind
from dpclip.train.runs.private import PrivateRun
from dpclip.train.step import dp_step


@register_run_kind
class NoCanaryRun(PrivateRun):
    kind = "no_canaries"  # inherits takes_gradient_canaries from PrivateRun

    def apply_step(self, x, y, step):
        loss, _ = dp_step(self.model, self.groups, self.loss_fn, x, y, self.method, 0.0,
                          self.q * self.n_records, self.optimizer, self.rng, step, None,
                          most_records=self.n_records)
        return loss
'''


def test_a_kind_that_inherits_the_canary_flag_but_drops_the_canaries_is_refused(plugin):
    """A privacy auditor's case: a subclass of the shared step's kind inherits
    takes_gradient_canaries, steps without noise and passes no canaries; the audit said
    "applicable, bound 0, not violated" against its claim. It now stops with the count."""
    from dpclip.errors import DpclipError

    kind = plugin("dpclip.train.runs", "no_canaries", CANARY_DROPPING_KIND)
    method = plugin("dpclip.methods", "no_canary_method", f'''
from dpclip.methods.base import Method, clip_factors, register


@register
class NoCanaryMethod(Method):
    name = "no_canary_method"
    run_kind = "{kind}"

    def scale(self, layer_norms):
        return clip_factors(layer_norms, self.clip_threshold)
''')
    x, y = sparse_records()
    run = build_run((x.shape[1],), 3, len(x), tiny_train_config(method, batch_size=20))
    with pytest.raises(DpclipError, match=r"drew them at 0 of its \d+ steps"):
        audit_whitebox(run, x, y, m=50, seed=1)
