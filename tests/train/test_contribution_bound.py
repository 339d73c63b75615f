"""The DP step's contribution bound for any model: what one record adds to the clipped sum never
exceeds the norm it was clipped with, for every supported layer kind and input rank and for
every method's rule, on adversarial inputs (large common offsets, tiny variation, readouts of
alternating sign, huge head weights) drawn by Hypothesis. The truth is float64 autograd.

A record's contribution is measured as the step makes it: ``scaled_sum`` with the record's own
factor and every other record's set to 0 (the sum is linear in the factors), so the float32 or
float64 arithmetic of each path is part of what is checked."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opacus.layers import DPGRU, DPLSTM, DPRNN, DPMultiheadAttention
from opacus.validators import ModuleValidator
from torch import nn

from dpclip.errors import DpclipError
from dpclip.methods import available_methods, get_method
from dpclip.methods.base import MethodContext
from dpclip.models import ResidualBlock
from dpclip.train import per_sample
from dpclip.train.step import (BookKeeping, LayerGroups, backward_keeping, per_layer_norms,
                               scaled_sum)
from conftest import shadow_risk_for

SLACK = 1 + 1e-6
PER_SAMPLE_METHODS = [m for m in available_methods()
                      if get_method(m).run_kind in ("private", "opacus_optimizer")]
LOSS = nn.CrossEntropyLoss(reduction="none")


@contextlib.contextmanager
def instantiation_budget(numbers):
    """Per-sample gradients instantiated up to ``numbers`` numbers (0: the ghost norm wherever
    the layer's shape favours it; None: the default budget)."""
    default = per_sample.INSTANTIATION_BUDGET
    per_sample.INSTANTIATION_BUDGET = default if numbers is None else numbers
    try:
        yield
    finally:
        per_sample.INSTANTIATION_BUDGET = default


class Readout(nn.Module):
    """body -> sum over positions (alternating signs, or a mean) -> head. With alike inputs
    and alternating signs the body's per-position gradients cancel in the record's gradient."""

    def __init__(self, body: nn.Module, features: int, alternate: bool, head_scale: float):
        super().__init__()
        self.body, self.head = body, nn.Linear(features, 3)
        self.alternate = alternate
        with torch.no_grad():
            self.head.weight.mul_(head_scale)

    def forward(self, x):
        h = self.body(x)
        if h.dim() > 2:  # (B, C, ...) maps or (B, T, d) sequences: positions to one vector
            h = h.flatten(1, -2) if self.body_is_sequence else h.flatten(2).transpose(1, 2)
            signs = torch.ones(h.shape[1], dtype=h.dtype, device=h.device)
            if self.alternate:
                signs[1::2] = -1
            h = (h * signs[:, None]).sum(dim=1) / h.shape[1]
        return self.head(h)

    body_is_sequence = False


class Sequence(Readout):
    body_is_sequence = True


class Residual(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.inner = nn.Linear(width, width)

    def forward(self, x):
        return x + torch.tanh(self.inner(x))


class KeywordCall(nn.Module):
    """Calls its layer with a keyword argument: the forward hook must still see the input."""

    def __init__(self, width):
        super().__init__()
        self.layer = nn.Linear(width, width)

    def forward(self, x):
        return self.layer(input=x)


class Tokens(nn.Module):
    """Token ids (stored as floats, like every feature) -> Embedding -> sequence Linear."""

    def __init__(self, padding_idx, max_norm):
        super().__init__()
        self.embed = nn.Embedding(9, 6, padding_idx=padding_idx, max_norm=max_norm)
        self.mix = nn.Linear(6, 8)

    def forward(self, x):
        return self.mix(self.embed(x.long()))


class CalledTwice(nn.Module):
    """One layer applied twice: a record's gradient is the sum over both calls."""

    def __init__(self, width):
        super().__init__()
        self.layer = nn.Linear(width, width)

    def forward(self, x):
        return self.layer(torch.tanh(self.layer(x)))


class Recurrent(nn.Module):
    """Opacus's DPLSTM, DPGRU or DPRNN (batch first): one cell called at every time step."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(x)[0]


class SelfAttention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.attention = DPMultiheadAttention(width, heads, batch_first=True)

    def forward(self, x):
        return self.attention(x, x, x)[0]


def encoder_layer(width, heads):
    """torch's TransformerEncoderLayer with its attention swapped for Opacus's by Opacus's own
    fixer, as docs/privacy.md tells users to do."""
    return ModuleValidator.fix(nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0,
                                                          batch_first=True))


def lstm(layers, directions):
    layer = DPLSTM(4, 5, num_layers=layers, batch_first=True, bidirectional=directions == 2)
    return Recurrent(layer), 5 * directions, (6, 4), True


# name -> (body, its output features, input shape after the batch, sequence body?, tokens?)
def bodies(draw_int):
    return {
        "linear 2-D": lambda: (nn.Linear(12, 10), 10, (12,), False),
        "linear 3-D ghost": lambda: (nn.Linear(32, 32), 32, (4, 32), True),       # 2*16 < 1024
        "linear 3-D instantiated": lambda: (nn.Linear(6, 5), 5, (16, 6), True),   # 512 > 30
        "linear 4-D": lambda: (nn.Linear(8, 6), 6, (3, 2, 8), True),
        "residual sequence linear": lambda: (Residual(16), 16, (3, 16), True),
        "keyword call": lambda: (KeywordCall(7), 7, (7,), False),
        "conv1d": lambda: (nn.Conv1d(3, 8, 3, stride=draw_int(1, 2), dilation=draw_int(1, 2),
                                     padding=draw_int(0, 1)), 8, (3, 12), False),
        "conv2d ghost": lambda: (nn.Conv2d(16, 32, 3), 32, (16, 5, 5), False),  # T=9, pd=4608
        "conv2d instantiated": lambda: (nn.Conv2d(2, 4, 3, stride=draw_int(1, 2),
                                                  padding=draw_int(0, 2),
                                                  dilation=draw_int(1, 2)), 4, (2, 9, 9), False),
        "conv2d groups": lambda: (nn.Conv2d(4, 8, 3, groups=2), 8, (4, 6, 6), False),
        "conv2d reflect": lambda: (nn.Conv2d(2, 4, 3, padding=1, padding_mode="reflect"), 4,
                                   (2, 6, 6), False),
        "conv2d circular": lambda: (nn.Conv2d(2, 4, 3, padding=1, padding_mode="circular"), 4,
                                    (2, 6, 6), False),
        "conv2d same": lambda: (nn.Conv2d(2, 4, 3, padding="same"), 4, (2, 6, 6), False),
        "conv3d": lambda: (nn.Conv3d(2, 4, 2, stride=draw_int(1, 2)), 4, (2, 4, 4, 4), False),
        "layer norm": lambda: (nn.Sequential(nn.Linear(6, 6), nn.LayerNorm(6)), 6, (5, 6),
                               True),
        "group norm": lambda: (nn.Sequential(nn.Conv2d(2, 4, 3), nn.GroupNorm(2, 4)), 4,
                               (2, 6, 6), False),
        "embedding": lambda: (Tokens(None, None), 8, (5,), True),
        "embedding padding_idx": lambda: (Tokens(0, None), 8, (5,), True),
        "layer called twice": lambda: (CalledTwice(6), 6, (6,), False),
        "resnet block": lambda: (ResidualBlock(4, 8, draw_int(1, 2)), 8, (4, 6, 6), False),
        "lstm": lambda: lstm(layers=draw_int(1, 2), directions=draw_int(1, 2)),
        "gru": lambda: (Recurrent(DPGRU(4, 5, batch_first=True)), 5, (6, 4), True),
        "rnn": lambda: (Recurrent(DPRNN(4, 5, batch_first=True)), 5, (6, 4), True),
        "attention": lambda: (SelfAttention(8, 2), 8, (5, 8), True),
        "transformer encoder layer": lambda: (encoder_layer(8, 2), 8, (5, 8), True),
    }


LAYER_KINDS = list(bodies(lambda low, high: low))


def build(kind, draw_int, alternate, head_scale, offset, variation, batch, seed):
    """The model and adversarial records: x = offset * c + variation * noise (c a common
    pattern per feature, so all positions and records look alike)."""
    torch.manual_seed(seed)
    body, features, shape, sequence = bodies(draw_int)[kind]()
    model = (Sequence if sequence else Readout)(body, features, alternate, head_scale)
    gen = torch.Generator().manual_seed(seed)
    if kind.startswith("embedding"):
        x = torch.randint(0, 9, (batch, *shape), generator=gen).float()
    else:
        common = torch.randn(shape, generator=gen)
        x = offset * common + variation * torch.randn(batch, *shape, generator=gen)
    y = torch.randint(0, 3, (batch,), generator=gen)
    return model, x, y


def fresh_terms(wrapped, x, y):
    out, uses = wrapped.forward_keeping(x)
    return backward_keeping(wrapped, LOSS(out, y), uses)


def clipped_terms(model, x, y):
    """(per-layer norms (B, L) as the step computes them, what each record alone adds per
    layer at unit weight (B, L) in float64, the layers' float64 autograd norms (B, L), which
    layers' norms come without instantiated per-sample gradients)."""
    groups = LayerGroups.of(model)
    wrapped = BookKeeping(model, groups)
    kept = fresh_terms(wrapped, x, y)
    truth = float64_layer_norms(groups, kept, model, x, y)
    norms = per_layer_norms(groups, kept)
    analytic = [next(t.per_sample is None for t in kept if t.module is m) for m in groups.modules]
    batch, n_layers = norms.shape
    alone = torch.zeros(batch, n_layers, dtype=torch.float64)
    for i in range(batch):
        kept = fresh_terms(wrapped, x, y)
        torch.testing.assert_close(per_layer_norms(groups, kept), norms, rtol=0, atol=0)
        sums = iter(scaled_sum(groups, kept, torch.eye(batch, device=x.device)[i]))
        for k, params in enumerate(groups.params):
            alone[i, k] = sum(next(sums).double().square().sum() for _ in params).sqrt().item()
    return norms.double().cpu(), alone, truth, analytic


def float64_layer_norms(groups, kept, model, x, y):
    """||g_i^(l)|| by float64 autograd of each layer alone, on the very inputs and output
    gradients the float32 forward and backward gave it: the gradient the step should clip. A
    layer called several times (its calls' terms already summed) by float64 autograd of the
    whole model on the record alone."""
    truth = torch.zeros(len(x), len(groups.modules), dtype=torch.float64)
    for terms in kept:
        k = next(j for j, m in enumerate(groups.modules) if m is terms.module)
        if terms.backprops is None:
            truth[:, k] = whole_model_norms(model, groups.names[k], x, y)
            continue
        layer = copy.deepcopy(terms.module).double()
        for i in range(len(terms.backprops)):
            inputs = [a[i:i + 1].double() if a.is_floating_point() else a[i:i + 1]
                      for a in terms.activations]
            if isinstance(layer, nn.Embedding):
                inputs = [a.long() for a in inputs]
            out = layer(*inputs)
            params = [p for p in layer.parameters(recurse=False) if p.requires_grad]
            grads = torch.autograd.grad((out * terms.backprops[i:i + 1].double()).sum(), params)
            truth[i, k] = torch.sqrt(sum(g.square().sum() for g in grads)).item()
    return truth


def whole_model_norms(model, layer_name, x, y):
    """||g_i|| of one layer's parameters by float64 autograd of the whole model, record by
    record."""
    twin = copy.deepcopy(model).double()
    layer = twin.get_submodule(layer_name)
    params = [p for p in layer.parameters(recurse=False) if p.requires_grad]
    norms = []
    for i in range(len(x)):
        loss = LOSS(twin(x[i:i + 1].double()), y[i:i + 1]).sum()
        grads = torch.autograd.grad(loss, params)
        norms.append(torch.sqrt(sum(g.square().sum() for g in grads)))
    return torch.stack(norms).cpu()


def method_factors(name, norms, clip, names):
    method = get_method(name)(MethodContext(clip, names, n_params=100,
                                            expected_batch=float(len(norms)),
                                            shadow_risk=shadow_risk_for(names)))
    method.bind_noise(1.0, 1.1)
    factors = method.scale(norms.float()).double()
    return factors[:, None].expand(-1, norms.shape[1]) if factors.dim() == 1 else factors


def check_bound(model, x, y, clip=1.0):
    """Every path's contract, every method's bound; returns max contribution / C over methods
    and max (contribution / norm) over records and layers."""
    norms, alone, truth, analytic = clipped_terms(model, x, y)
    assert torch.all(alone <= norms * SLACK + 1e-30), (alone / norms).max()
    for k, exact in enumerate(analytic):  # ghost and Linear norms: upper bounds on the truth
        if exact:
            assert torch.all(norms[:, k] >= truth[:, k] * (1 - 1e-6)), (k, norms[:, k],
                                                                          truth[:, k])
    names = LayerGroups.of(model).names
    worst = 0.0
    for name in PER_SAMPLE_METHODS:
        factors = method_factors(name, norms, clip, names)
        blocks = factors * alone
        total = blocks.square().sum(dim=1).sqrt()
        assert torch.all(total <= clip * SLACK), (name, total.max() / clip)
        worst = max(worst, float(total.max()) / clip)
    return worst


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          derandomize=True)
@given(kind=st.sampled_from(LAYER_KINDS), data=st.data(),
       alternate=st.booleans(), head_scale=st.sampled_from([1.0, 1e3]),
       offset=st.sampled_from([0.0, 1.0, 100.0, 1000.0]),
       variation=st.sampled_from([1.0, 1e-2, 1e-4]), batch=st.integers(2, 5),
       seed=st.integers(0, 10_000), budget=st.sampled_from([0, None]))
def test_no_record_contributes_more_than_its_clipped_norm(kind, data, alternate, head_scale,
                                                          offset, variation, batch, seed,
                                                          budget):
    draw_int = lambda low, high: data.draw(st.integers(low, high))  # noqa: E731
    model, x, y = build(kind, draw_int, alternate, head_scale, offset, variation, batch, seed)
    with instantiation_budget(budget):  # both ways to a norm, where the layer has both
        check_bound(model, x, y)


@pytest.mark.parametrize("budget", [0, None])
@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_every_layer_kind_clips_with_its_float64_gradient_norm_on_ordinary_inputs(kind, budget):
    """Fidelity, not only the bound: on ordinary inputs each layer's norm is its float64
    autograd norm to float32 accuracy, whatever the path."""
    model, x, y = build(kind, lambda low, high: high, True, 1.0, 0.0, 1.0, 4, seed=7)
    with instantiation_budget(budget):
        norms, alone, truth, _ = clipped_terms(model, x, y)
    torch.testing.assert_close(norms, truth, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(alone, truth, rtol=1e-4, atol=1e-7)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_every_layer_kind_holds_the_bound_on_each_device(kind, device):
    """The adversarial case (large common offset, tiny variation, alternating readout, a head
    x 1000) on every device there is: on a GPU its own kernels, cuDNN's TF32 convolutions
    (torch's default) included, must keep each record within C."""
    model, x, y = build(kind, lambda low, high: high, True, 1e3, 1000.0, 1e-4, 5, seed=3)
    assert check_bound(model.to(device), x.to(device), y.to(device)) <= SLACK


def sequence_repro(offset=100.0):
    """The audit's repro: Linear(32 -> 32) on (8, 16, 32), x = c + 1e-3 noise with ||c|| about
    ``offset``, positions summed with alternating signs, a head with weights x 1000."""
    torch.manual_seed(0)
    model = Sequence(nn.Linear(32, 32), 32, alternate=True, head_scale=1e3)
    common = torch.randn(32)
    x = offset * common / common.norm() + 1e-3 * torch.randn(8, 16, 32)
    return model, x, torch.randint(0, 3, (8,))


@pytest.mark.parametrize("budget", [0, None])
@pytest.mark.parametrize("offset", [100.0, 1000.0])
def test_a_sequence_linear_never_lets_a_record_past_C(offset, budget):
    """Before: its norm (Opacus's Gram form in float32) was 0.000 against a true 0.009-0.014,
    and a record contributed up to 13.4 C (dp_sgd), 14.5 C at offset 1000."""
    model, x, y = sequence_repro(offset)
    with instantiation_budget(budget):
        norms, _, truth, analytic = clipped_terms(model, x, y)
        assert analytic[0] is (budget == 0)  # the ghost norm, or instantiated
        assert check_bound(model, x, y) <= SLACK
    if budget == 0:
        assert torch.all(norms[:, 0] >= truth[:, 0] * (1 - 1e-6))


@pytest.mark.parametrize("budget", [0, None])
def test_lm_dp_sgd_never_scales_a_block_past_its_bound(budget):
    """Before: an underestimated block norm (0 on a nonzero block) times C w / max(n, 1e-30)
    gave contributions of 5.4e27 - 8.7e27 C. Each block is now within C_i w^(l)."""
    model, x, y = sequence_repro()
    with instantiation_budget(budget):
        norms, alone, _, _ = clipped_terms(model, x, y)
    names = LayerGroups.of(model).names
    factors = method_factors("lm_dp_sgd", norms, 1.0, names)
    blocks = factors * alone  # C_i w^(l) / n_i^(l) times the block's contribution
    assert torch.all(blocks <= factors * norms * SLACK + 1e-30)
    assert float(blocks.square().sum(dim=1).sqrt().max()) <= SLACK


def test_a_ghost_convolution_sums_what_it_clipped():
    """Conv2d(16 -> 32, 3x3) on 6x6 maps with channel offset 1000 and 1e-4 variation,
    alternating readout, head x 1000: the float64 norm with a float32 weighted sum let a record
    contribute 1.064 C (dp_sgd)."""
    torch.manual_seed(0)
    model = Readout(nn.Conv2d(16, 32, 3), 32, alternate=True, head_scale=1e3)
    x = 1000 * torch.ones(1, 16, 1, 1) + 1e-4 * torch.randn(6, 16, 6, 6)
    with instantiation_budget(0):
        assert check_bound(model, x, torch.randint(0, 3, (6,))) <= SLACK


def tied(model):
    """Tied weights: the last layer uses the first one's weight."""
    model[2].weight = model[0].weight
    return model


@pytest.mark.parametrize("build_model, words", [
    (lambda: nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), "batch-normalisation"),
    (lambda: nn.Sequential(torch.nn.utils.weight_norm(nn.Linear(4, 3))), "weight_norm"),
    (lambda: nn.Sequential(torch.nn.utils.parametrizations.weight_norm(nn.Linear(4, 3))),
     "parametrized"),
    (lambda: tied(nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))), "share"),
])
def test_models_the_step_cannot_clip_exactly_are_refused_naming_the_layer(build_model, words):
    model = build_model()
    with pytest.raises(DpclipError, match=words) as error:
        BookKeeping(model, LayerGroups.of(model))
    assert "'0'" in str(error.value) or "[" in str(error.value)  # the layer is named


class WeightUsedTwice(nn.Module):
    """The layer's weight also used directly: autograd's gradient has both uses, the layer's
    call only one (before: that use's gradient was dropped, computed / true 0.93-0.98)."""

    def __init__(self):
        super().__init__()
        self.fc, self.head = nn.Linear(5, 5), nn.Linear(5, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.fc(x)) + nn.functional.linear(x, self.fc.weight))


class ChangesInputInPlace(nn.Module):
    """The head's input changed in place after the head ran (before: the norm came from the
    changed input, 2.615 against a true 0.944; autograd itself would raise)."""

    def __init__(self):
        super().__init__()
        self.fc, self.head = nn.Linear(5, 5), nn.Linear(5, 3)

    def forward(self, x):
        h = torch.tanh(self.fc(x))
        out = self.head(h)
        h.mul_(2.0)
        return out


def test_a_weight_used_outside_its_layer_is_refused_before_training():
    from dpclip.train.model_check import check_model

    torch.manual_seed(0)
    x, y = torch.randn(6, 5), torch.randint(0, 3, (6,))
    with pytest.raises(DpclipError, match="'fc.weight'.*used outside its layer"):
        check_model(WeightUsedTwice(), LOSS, x, y)
    check_model(nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3)), LOSS, x, y)


def test_an_input_changed_in_place_after_its_layer_ran_is_refused():
    torch.manual_seed(0)
    model = ChangesInputInPlace()
    wrapped = BookKeeping(model, LayerGroups.of(model))
    with pytest.raises(DpclipError, match="input of layer 'head' was changed in place"):
        fresh_terms(wrapped, torch.randn(4, 5), torch.randint(0, 3, (4,)))


def test_a_private_run_refuses_a_model_the_step_gets_wrong(monkeypatch):
    """The check runs before the first step of a real run (its model built as one whose
    weight is used twice)."""
    from dpclip.train import build_run, loop
    from conftest import gaussian_records, tiny_train_config

    class Reused(WeightUsedTwice):
        def __init__(self):
            super().__init__()
            self.fc, self.head = nn.Linear(6, 6), nn.Linear(6, 3)

    monkeypatch.setattr(loop, "build_model", lambda *args: Reused())
    x, y = gaussian_records(40)
    run = build_run((6,), 3, len(x), tiny_train_config())
    with pytest.raises(DpclipError, match="'fc.weight'"):
        run.fit(torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y), progress=False,
                desc="")
    assert not run.trace  # refused before any step


class SequenceFirst(nn.Module):
    """Layers that see (T, B, d): the batch is not on dimension 0 (an independent audit: the
    step clipped per position, and one record reached 2.1 C under dp_sgd)."""

    def __init__(self):
        super().__init__()
        self.inp, self.head = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.inp(x.transpose(0, 1))).mean(dim=0))


class CentresTheBatch(nn.Module):
    """x - x.mean(0): each record's output depends on the others (the audit: 6.4 C)."""

    def __init__(self):
        super().__init__()
        self.inp, self.head = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        h = self.inp(x)
        return self.head(torch.tanh(h - h.mean(dim=0)))


def test_a_layer_without_the_batch_on_dimension_0_is_refused():
    from dpclip.train.model_check import check_model

    torch.manual_seed(0)
    x, y = torch.randn(8, 4, 6), torch.randint(0, 3, (8,))
    with pytest.raises(DpclipError, match="layer 'inp' sees .* rows for a batch of 1"):
        check_model(SequenceFirst(), LOSS, x, y)
    model = SequenceFirst()
    with pytest.raises(DpclipError, match="batch on dimension 0"):
        fresh_terms(BookKeeping(model, LayerGroups.of(model)), x, y)


def test_records_that_change_each_others_gradients_are_refused_before_training():
    from dpclip.train.model_check import check_model

    torch.manual_seed(0)
    with pytest.raises(DpclipError, match="change each other's gradients"):
        check_model(CentresTheBatch(), LOSS, torch.randn(6, 6), torch.randint(0, 3, (6,)))


@pytest.mark.parametrize("budget", [0, None])
@pytest.mark.parametrize("kind", ["linear 3-D instantiated", "conv2d instantiated",
                                  "conv2d ghost", "linear 2-D"])
def test_a_record_whose_gradient_overflows_contributes_nothing(kind, budget):
    """The audit: features of 1e37 (a finite forward) made one record's float32 per-sample
    gradient inf, its factor 0 and 0 x inf = NaN: the whole released sum was NaN."""
    model, x, y = build(kind, lambda low, high: low, False, 1e3, 0.0, 1.0, 3, seed=1)
    with torch.no_grad():
        for p in model.body.parameters():
            p.mul_(1e-37)
    x[0] = x[0].sign() * 1e37
    with instantiation_budget(budget):
        groups = LayerGroups.of(model)
        wrapped = BookKeeping(model, groups)
        kept = fresh_terms(wrapped, x, y)
        norms = per_layer_norms(groups, kept)
        sums = scaled_sum(groups, kept, torch.ones(3))
    assert all(torch.isfinite(s).all() for s in sums)
    assert torch.isfinite(norms[1:]).all()  # the other records are clipped as usual
    assert torch.isinf(norms[0]).any() or torch.isfinite(norms[0]).all()


@pytest.mark.parametrize("build_model, words", [
    (lambda: nn.Sequential(nn.Linear(4, 3).half()), "float16"),
    (lambda: nn.Sequential(nn.Embedding(5, 3, scale_grad_by_freq=True)), "scale_grad_by_freq"),
])
def test_layers_whose_bounds_or_gradients_do_not_hold_are_refused(build_model, words):
    model = build_model()
    with pytest.raises(DpclipError, match=words):
        BookKeeping(model, LayerGroups.of(model))


def test_a_failing_per_sample_path_and_a_layer_run_without_gradient_are_clear_errors():
    from dpclip.train.model_check import check_model

    class NoGrad(nn.Module):
        def __init__(self):
            super().__init__()
            self.frozen, self.head = nn.Linear(6, 6), nn.Linear(6, 3)

        def forward(self, x):
            with torch.no_grad():
                h = self.frozen(x)
            return self.head(h)

    x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
    with pytest.raises(DpclipError, match="LayerNorm layer: its per-sample gradients failed"):
        check_model(nn.Sequential(nn.Linear(6, 6), nn.LayerNorm(6, bias=False),
                                  nn.Linear(6, 3)), LOSS, x, y)
    with pytest.raises(DpclipError, match=r"no per-sample norm for layer\(s\) \['frozen'\]"):
        check_model(NoGrad(), LOSS, x, y)


@pytest.mark.parametrize("dtype, batch, spread", [(torch.bfloat16, 1024, 0.37),
                                                   (torch.float32, 4096, 0.0)])
def test_what_one_record_changes_in_the_sum_is_c_with_rounding_included(dtype, batch, spread):
    """Records whose clipped gradients all point the same way: the sum with and without one
    of them differs by at most C (1 + rounding_slack). Before, the sum was kept in the model's
    dtype: 2.52 C in bfloat16 at a batch of 1024, 1.000156 C in float32 at 4096."""
    from dpclip.methods.base import clip_factors
    from dpclip.train.step import rounding_slack

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3)).to(dtype)
    scales = 1 + torch.linspace(0, spread, batch)[:, None]  # alike, or identical
    x = (scales * torch.tensor([1.0, 0.3, -0.7, 2.0])).to(dtype)
    y = torch.zeros(batch, dtype=torch.int64)
    groups = LayerGroups.of(model)
    wrapped = BookKeeping(model, groups)
    clip = 1.0
    kept = fresh_terms(wrapped, x, y)
    factors = clip_factors(per_layer_norms(groups, kept), clip)
    everyone = scaled_sum(groups, kept, factors)
    kept = fresh_terms(wrapped, x, y)
    per_layer_norms(groups, kept)
    without = scaled_sum(groups, kept, torch.cat([factors[:-1], torch.zeros(1, dtype=dtype)]))
    change = torch.sqrt(sum((a.double() - b.double()).square().sum()
                            for a, b in zip(everyone, without)))
    assert float(change) <= clip * (1 + rounding_slack(batch)), float(change)
