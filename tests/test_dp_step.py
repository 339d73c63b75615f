"""The shared DP step: clip bound, the noisy sum against an independent per-example
computation, the noise scale, empty batches, determinism and the budget."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dpclip.methods import available_methods, get_method
from dpclip.methods.base import MethodContext
from dpclip.randomness import NoiseSources
from dpclip.train import build_run, train_model
from dpclip.train.step import LayerGroups, dp_step, wrap_for_dp
from conftest import shadow_risk_for, tiny_train_config

# methods on a per-sample gradient step (sanitize noises an activation layer instead: its
# invariants are in test_sanitization.py)
PRIVATE_METHODS = [m for m in available_methods()
                   if get_method(m).run_kind in ("private", "opacus_optimizer")]


def as_layer_factors(factors: torch.Tensor, n_layers: int) -> torch.Tensor:
    """How the DP step applies a method's factors: (B,) for every layer, or (B, L) as given."""
    return factors[:, None].expand(-1, n_layers) if factors.dim() == 1 else factors


@pytest.mark.parametrize("method_name", PRIVATE_METHODS)
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_every_scaled_per_sample_gradient_is_within_the_clip_bound(method_name, data):
    n_layers = data.draw(st.integers(1, 4))
    batch = data.draw(st.integers(1, 16))
    clip = data.draw(st.floats(1e-3, 1e3))
    seed = data.draw(st.integers(0, 2 ** 31 - 1))
    gen = torch.Generator().manual_seed(seed)
    # per-layer gradient blocks with norms spread over 12 orders of magnitude, some exactly 0
    scales = 10 ** (torch.rand(batch, n_layers, generator=gen) * 12 - 6)
    scales[torch.rand(batch, n_layers, generator=gen) < 0.1] = 0.0
    blocks = [torch.randn(batch, 7, generator=gen, dtype=torch.float64) for _ in range(n_layers)]
    blocks = [b / b.norm(dim=1, keepdim=True) * scales[:, l:l + 1].double()
              for l, b in enumerate(blocks)]
    layer_norms = torch.stack([b.norm(dim=1) for b in blocks], dim=1)
    names = [f"layer{l}" for l in range(n_layers)]
    method = get_method(method_name)(MethodContext(clip, names, n_params=7 * n_layers,
                                                   expected_batch=float(batch),
                                                   shadow_risk=shadow_risk_for(names)))
    method.bind_noise(1.0, 1.1)
    factors = as_layer_factors(method.scale(layer_norms), n_layers)
    scaled_norms = torch.stack([(factors[:, l:l + 1] * b).norm(dim=1) for l, b in
                                enumerate(blocks)], dim=1).pow(2).sum(dim=1).sqrt()
    assert torch.all(scaled_norms <= clip * (1 + 1e-9))


def _tiny_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))


def _reference_clipped_sum(model, x, y, clip):
    """Per-example gradients by one autograd call per record, clipped by hand."""
    total = [torch.zeros_like(p) for p in model.parameters()]
    for i in range(len(x)):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i:i + 1]), y[i:i + 1], reduction="sum").backward()
        grads = [p.grad.detach().clone() for p in model.parameters()]
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        factor = min(1.0, clip / norm.item())
        total = [t + factor * g for t, g in zip(total, grads)]
    return total


def _run_dp_step(sigma, clip=0.5, seed=0, expected_batch=8.0):
    model = _tiny_model()
    gen = torch.Generator().manual_seed(123)
    x, y = torch.randn(6, 5, generator=gen), torch.randint(0, 3, (6,), generator=gen)
    reference = _reference_clipped_sum(_tiny_model(), x, y, clip)
    groups = LayerGroups.of(model)
    method = get_method("dp_sgd")(MethodContext(clip, groups.names))
    wrapped = wrap_for_dp(model)
    optimizer = torch.optim.SGD(groups.flat(), lr=0.0)
    dp_step(wrapped, groups, nn.CrossEntropyLoss(reduction="none"), x, y, method, sigma,
            expected_batch, optimizer, NoiseSources.seeded(seed), step=1,
            most_records=len(x))
    return [p.grad.detach() for p in groups.flat()], reference


def test_noiseless_step_equals_independent_per_example_clipping():
    grads, reference = _run_dp_step(sigma=0.0, expected_batch=8.0)
    for g, r in zip(grads, reference):
        torch.testing.assert_close(g, r / 8.0, rtol=1e-5, atol=1e-7)


def test_noise_has_std_sigma_times_clip_over_expected_batch():
    sigma, clip, b = 3.0, 0.5, 8.0
    samples = []
    for seed in range(40):
        grads, reference = _run_dp_step(sigma=sigma, clip=clip, seed=seed, expected_batch=b)
        samples.append(torch.cat([(g * b - r).flatten() for g, r in zip(grads, reference)]))
    noise = torch.cat(samples)
    # noise = N(0, sigma^2 C^2): 40 x 39 draws, so the sample std is within a few percent
    assert noise.std().item() == pytest.approx(sigma * clip, rel=0.05)
    assert abs(noise.mean().item()) < 0.05 * sigma * clip


def _cfg(method="dp_sgd", **kw):
    return tiny_train_config(method, **kw)


def _data(n=100, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 6)).astype(np.float32), rng.integers(0, 3, size=n)


def test_empty_batch_update_is_the_gradient_noise_alone():
    from dpclip.train.step import rounding_slack

    x, y = _data()
    run = build_run((6,), 3, len(x), _cfg(lr=0.1))
    before = [p.detach().clone() for p in run.groups.flat()]
    run.step(torch.as_tensor(x), torch.as_tensor(y), [], epoch=1)
    replay = NoiseSources.for_run(0, key=run.cfg.stream_key())  # the run's own streams
    for b, p in zip(before, run.groups.flat()):
        # float64 draws (float32's stop at 5.77 sigma), scaled by the float64 sum's rounding
        # slack over the n records
        std = run.sigma_train * 1.0 * (1 + rounding_slack(len(x)))
        noise = torch.normal(0.0, std, size=p.shape, generator=replay.noise,
                             dtype=torch.float64)
        torch.testing.assert_close(p.detach() - b, (-0.1 * noise / (run.q * len(x))).float())


def test_training_with_many_empty_batches_finishes_within_budget():
    x, y = _data(n=40)
    result = train_model(x, y, (6,), 3, _cfg(batch_size=1, epochs=3), progress=False)
    sizes = [row["batch_size"] for row in result.trace]
    assert 0 in sizes  # q = 1/40: about a third of the steps are empty
    assert result.privacy["steps"] == len(result.trace) == 120
    assert result.privacy["epsilon"] <= 4.0


def test_cpu_training_is_deterministic_for_a_seed():
    x, y = _data()
    a = train_model(x, y, (6,), 3, _cfg(), progress=False)
    b = train_model(x, y, (6,), 3, _cfg(), progress=False)
    c = train_model(x, y, (6,), 3, _cfg(seed=1), progress=False)
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)
    assert any(not torch.equal(pa, pc) for pa, pc in zip(a.model.parameters(),
                                                         c.model.parameters()))


def test_reported_epsilon_is_the_accountants_and_at_most_the_target():
    x, y = _data()
    result = train_model(x, y, (6,), 3, _cfg(), progress=False)
    p = result.privacy
    assert p["dp_guarantee"] and p["epsilon"] <= p["target_epsilon"]
    assert p["steps"] == result.training["steps_planned"]
    eps_trace = [row["epsilon_spent"] for row in result.trace]
    assert eps_trace == sorted(eps_trace) and eps_trace[-1] == pytest.approx(p["epsilon"])


def test_non_private_run_reports_no_epsilon():
    x, y = _data()
    result = train_model(x, y, (6,), 3, _cfg(method="non_private"), progress=False)
    assert result.privacy["epsilon"] is None and result.privacy["dp_guarantee"] is False


def test_per_layer_factors_scale_each_layer_separately():
    from dpclip.methods.base import Method

    class PerLayer(Method):  # not registered: a stand-in for per-layer rules
        name = "per_layer_test"

        def scale(self, layer_norms):
            weights = torch.tensor([0.25, 2.0], dtype=layer_norms.dtype)
            return weights[None, :].expand(layer_norms.shape[0], -1)

    model = _tiny_model()
    gen = torch.Generator().manual_seed(7)
    x, y = torch.randn(5, 5, generator=gen), torch.randint(0, 3, (5,), generator=gen)
    reference_model = _tiny_model()
    reference_model.zero_grad()
    nn.functional.cross_entropy(reference_model(x), y, reduction="sum").backward()
    layer_of = [0, 0, 1, 1]  # (weight, bias) of the first Linear, then of the second
    reference = [[0.25, 2.0][layer] * p.grad for layer, p in
                 zip(layer_of, reference_model.parameters())]
    groups = LayerGroups.of(model)
    wrapped = wrap_for_dp(model)
    dp_step(wrapped, groups, nn.CrossEntropyLoss(reduction="none"), x, y,
            PerLayer(MethodContext(1.0, groups.names)), 0.0, 1.0, torch.optim.SGD(groups.flat(), lr=0.0),
            NoiseSources.seeded(0), step=1,
            most_records=len(x))
    for p, r in zip(groups.flat(), reference):
        torch.testing.assert_close(p.grad, r, rtol=1e-5, atol=1e-7)


def test_trained_model_is_the_plain_network():
    x, y = _data()
    result = train_model(x, y, (6,), 3, _cfg(), progress=False)
    assert all(not name.startswith("_module") for name in result.model.state_dict())
    assert type(result.model) is nn.Sequential


def test_noiseless_cnn_step_equals_independent_per_example_clipping():
    # conv layers take Opacus's materialised per-sample path, linear layers the ghost norms
    from dpclip.models import build_model

    def cnn():
        torch.manual_seed(3)
        return build_model("cnn", (1, 6, 6), 3, [5])

    gen = torch.Generator().manual_seed(11)
    x, y = torch.randn(4, 1, 6, 6, generator=gen), torch.randint(0, 3, (4,), generator=gen)
    reference = _reference_clipped_sum(cnn(), x, y, clip=0.3)
    model = cnn()
    groups = LayerGroups.of(model)
    dp_step(wrap_for_dp(model), groups, nn.CrossEntropyLoss(reduction="none"), x, y,
            get_method("dp_sgd")(MethodContext(0.3, groups.names)), 0.0, 2.0,
            torch.optim.SGD(groups.flat(), lr=0.0), NoiseSources.seeded(0), step=1,
            most_records=len(x))
    for p, r in zip(groups.flat(), reference):
        torch.testing.assert_close(p.grad, r / 2.0, rtol=1e-4, atol=1e-6)


def test_tied_weights_and_batch_norm_are_refused():
    """Per-layer norms would understate a parameter shared by two layers (its per-sample
    gradient is the sum over both), and batch norm mixes records: both fail loudly instead of
    clipping wrongly."""
    from dpclip.errors import DpclipError

    with pytest.raises(DpclipError, match="batch-normalisation"):
        wrap_for_dp(nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.Linear(3, 2)))
    shared = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3))
    shared[2].weight = shared[0].weight
    with pytest.raises(DpclipError, match="share a parameter"):
        wrap_for_dp(shared)


def test_a_layer_called_twice_is_clipped_with_the_sum_over_its_calls():
    """A record's gradient of a layer applied twice is the sum of both calls' gradients: the
    step's clipped update at a clip no record reaches equals the autograd gradient (per-call
    norms, refused before, would have understated it)."""

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            return self.fc(torch.relu(self.fc(x)))

    torch.manual_seed(3)
    model = Twice()
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 2, 0])
    loss_fn = nn.CrossEntropyLoss(reduction="none")
    reference = torch.autograd.grad(loss_fn(model(x), y).sum(), list(model.parameters()))
    groups = LayerGroups.of(model)
    dp_step(wrap_for_dp(model), groups, loss_fn, x, y,
            get_method("dp_sgd")(MethodContext(1e6, groups.names)), 0.0, 4.0,
            torch.optim.SGD(groups.flat(), lr=0.0), NoiseSources.seeded(0), step=1,
            most_records=len(x))
    for p, r in zip(groups.flat(), reference):
        torch.testing.assert_close(p.grad, r / 4.0, rtol=1e-5, atol=1e-7)


def test_an_in_place_op_on_a_layer_output_changes_no_gradient():
    """The step asks for the gradient at the layer's own output slot in the graph, so a ReLU
    that overwrites z in place gives the same clipped update as the out-of-place one (asking
    for dL/dz by the tensor z would return the gradient of the ReLU's output instead)."""
    x, y = torch.randn(4, 3, generator=torch.Generator().manual_seed(5)), \
        torch.tensor([0, 1, 2, 0])
    updates = []
    for in_place in (False, True):
        torch.manual_seed(2)
        model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(inplace=in_place), nn.Linear(5, 3))
        groups = LayerGroups.of(model)
        dp_step(wrap_for_dp(model), groups, nn.CrossEntropyLoss(reduction="none"), x, y,
                get_method("dp_sgd")(MethodContext(0.1, groups.names)), 0.0, 4.0,
                torch.optim.SGD(groups.flat(), lr=0.0), NoiseSources.seeded(0), step=1,
            most_records=len(x))
        updates.append([p.grad for p in groups.flat()])
    for out_of_place, in_place in zip(*updates):
        torch.testing.assert_close(in_place, out_of_place, rtol=0, atol=0)


def test_the_step_computes_no_weight_gradient_in_its_backward_pass():
    """Book-keeping: autograd is asked for dL/dz only, so no parameter's .grad is written
    before the step sets the noisy one (the weight gradients it would throw away)."""
    model = _tiny_model()
    groups = LayerGroups.of(model)
    wrapped = wrap_for_dp(model)
    x, y = torch.randn(5, 5), torch.tensor([0, 1, 2, 0, 1])
    out, uses = wrapped.forward_keeping(x)
    from dpclip.train.step import backward_keeping

    kept = backward_keeping(wrapped, nn.functional.cross_entropy(out, y, reduction="none"), uses)
    assert all(p.grad is None for p in groups.flat())
    assert [type(terms.module) for terms in kept] == [nn.Linear, nn.Linear]


def test_public_init_starts_from_the_public_pre_training_and_reads_no_member():
    """train.public_init: the model before any private step is the public pre-training's
    (the same weights a direct call of the shared pre-training gives), the run's sampling stream
    is the one without it, and without public data the run is refused, naming the key."""
    from dpclip.errors import DpclipError
    from dpclip.models import build_model
    from dpclip.pretraining import PUBLIC_PRETRAINING, pretrain
    from dpclip.train import PublicData
    from dpclip.train.loop import seed_everything

    x, y = _data()
    public = PublicData(*_data(200, seed=1), held_out=_data(100, seed=2))
    cfg = _cfg(public_init=True)
    run = build_run((6,), 3, len(x), cfg, public)
    seed_everything(cfg.seed)  # the same initial weights, pre-trained by hand
    expected = build_model(cfg.train.model, (6,), 3, list(cfg.train.hidden))
    fit = pretrain(expected, nn.CrossEntropyLoss(reduction="none"), public, PUBLIC_PRETRAINING,
                   min(cfg.train.batch_size, 200), torch.Generator().manual_seed(cfg.seed), "cpu")
    for (name, p), q in zip(expected.named_parameters(), run.groups.flat()):
        torch.testing.assert_close(q, p, msg=name)
    assert run.public_init == {f"init_{k}": v for k, v in fit.items()}
    plain = build_run((6,), 3, len(x), _cfg(), public)
    assert plain.public_init == {}
    # the pre-training drew nothing from the run's own streams
    untouched = NoiseSources.for_run(cfg.seed, key=cfg.stream_key())
    assert torch.equal(run.rng.sampling.get_state(), untouched.sampling.get_state())
    with pytest.raises(DpclipError, match="train.public_init: true needs the public"):
        build_run((6,), 3, len(x), cfg)


def test_the_forward_keeps_no_layer_output_alive():
    """The step keeps where each output enters the graph, not the output: a Linear layer's
    output feeding an out-of-place ReLU (which saves only its result) is freed after the forward
    pass, as in a non-private step (holding every output was most of the CNN's extra memory)."""
    import gc
    import weakref

    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    outputs = []
    model[0].register_forward_hook(lambda module, inputs, output: outputs.append(
        weakref.ref(output)))
    wrapped = wrap_for_dp(model)
    logits, uses = wrapped.forward_keeping(torch.randn(5, 4))
    gc.collect()
    assert len(uses) == 2 and outputs[0]() is None
    from dpclip.train.step import backward_keeping

    kept = backward_keeping(wrapped, nn.functional.cross_entropy(
        logits, torch.tensor([0, 1, 2, 0, 1]), reduction="none"), uses)
    assert kept[0].backprops.shape == (5, 6)


@pytest.mark.parametrize("size", [1, 15, 16, 40, 64, 65, 79, 80, 97, 1000])
def test_noise_drawn_in_chunks_is_the_one_draw_of_the_whole_tensor(monkeypatch, size):
    """add_noise draws at most NOISE_CHUNK numbers at a time (here 32) and still adds exactly
    what one draw of the whole tensor gives, leaving the generator where that draw leaves it:
    chunking changes the step's memory, not its noise."""
    from dpclip.train import step

    monkeypatch.setitem(step.NOISE_CHUNK, "cpu", 32)
    total = torch.arange(size, dtype=torch.float32).reshape(-1, 1) / 7
    chunked_gen, whole_gen = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    whole = torch.normal(0.0, 1.5, size=total.shape, generator=whole_gen).add_(total)
    noisy = step.add_noise(total.clone(), 1.5, chunked_gen)
    assert torch.equal(noisy, whole)
    assert torch.equal(chunked_gen.get_state(), whole_gen.get_state())


@pytest.mark.parametrize("labels, words", [
    ([0, 1, 3], "10 labels are outside the class indices 0..2"),
    ([0, -1, 2], "outside the class indices"),
    ([0, -100, 2], "outside the class indices"),  # the loss would ignore it silently
    ([0.0, 1.5, 2.0], "whole numbers"),
])
def test_labels_that_are_not_class_indices_are_refused_before_any_step(labels, words):
    from dpclip.errors import DpclipError

    x, _ = _data(n=3)
    y = np.array(labels)
    with pytest.raises(DpclipError, match=words):
        train_model(np.repeat(x, 10, axis=0), np.repeat(y, 10), (6,), 3, _cfg(epochs=1),
                    progress=False)


def test_records_with_features_that_are_not_finite_are_refused():
    from dpclip.errors import DpclipError

    x, y = _data()
    x[4, 2] = np.nan
    with pytest.raises(DpclipError, match="1 records have features that are not finite"):
        train_model(x, y, (6,), 3, _cfg(epochs=1), progress=False)
