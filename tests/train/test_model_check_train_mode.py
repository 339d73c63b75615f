"""The model check as the step runs the model (training mode, the step's batch size and dtype):
batch mixing measured as contribution, parameters changed in place by the forward pass, and
buffers written from the records. Each model here passed the eval-mode check before
2026-11-29 and trained end to end (an independent privacy audit: 3.4-8.3 C for one record)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from dpclip.errors import DpclipError
from dpclip.train.model_check import check_model

LOSS = nn.CrossEntropyLoss(reduction="none")


class FunctionalBatchNorm(nn.Module):
    """A parameter-free normalisation of the user's own: batch statistics while training,
    running ones in eval mode (not a _BatchNorm subclass, so no type rule sees it)."""

    def __init__(self, width):
        super().__init__()
        self.register_buffer("running_mean", torch.zeros(width), persistent=False)
        self.register_buffer("running_var", torch.ones(width), persistent=False)

    def forward(self, x):
        return F.batch_norm(x, self.running_mean.clone(), self.running_var.clone(),
                            training=self.training)


class Net(nn.Module):
    def __init__(self, middle: nn.Module, width=6):
        super().__init__()
        self.inp, self.middle, self.head = nn.Linear(6, width), middle, nn.Linear(width, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.middle(self.inp(x))))


class Mixup(nn.Module):
    """Manifold mixup inside forward, in training mode only."""

    def forward(self, h):
        if not self.training:
            return h
        lam = 0.7
        return lam * h + (1 - lam) * h[torch.randperm(len(h))]


class Counter(nn.Module):
    """A buffer the forward pass writes, the same whatever the records."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, h):
        self.calls += 1
        return h


class Ema(nn.Module):
    """A buffer written from the records (an EMA of the batch mean): released without noise."""

    def __init__(self, width):
        super().__init__()
        self.register_buffer("average", torch.zeros(width))

    def forward(self, h):
        if self.training:
            self.average.mul_(0.9).add_(0.1 * h.detach().mean(0))
        return h


def _data(n=40, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=gen), torch.randint(0, 3, (n,), generator=gen)


@pytest.mark.parametrize("middle, module", [(FunctionalBatchNorm(6), "middle"),
                                            (Mixup(), "middle")])
def test_mixing_only_in_training_mode_is_refused_and_the_module_named(middle, module):
    torch.manual_seed(0)
    x, y = _data()
    with pytest.raises(DpclipError, match=f"training mode.*change each other's gradients"
                                          f".*module '{module}'"):
        check_model(Net(middle), LOSS, x, y, batch_size=8)


def test_buffers_written_from_the_records_are_refused_by_name():
    torch.manual_seed(0)
    x, y = _data()
    with pytest.raises(DpclipError, match="attribute 'middle.average' is written during the "
                                          "training forward pass"):
        check_model(Net(Ema(6)), LOSS, x, y, batch_size=8)
    norm = nn.InstanceNorm1d(1, affine=False, track_running_stats=True)
    model = Net(nn.Sequential(nn.Unflatten(1, (1, 6)), norm, nn.Flatten()))
    with pytest.raises(DpclipError, match=r"attribute 'middle.1.(running_mean|running_var|num_batches_tracked)'"):
        check_model(model, LOSS, x, y, batch_size=8)


def test_any_buffer_written_is_refused_and_dropout_passes():
    # the step puts buffers back after every step, so even a counter would never count
    torch.manual_seed(0)
    x, y = _data()
    with pytest.raises(DpclipError, match="attribute 'middle.calls' is written"):
        check_model(Net(Counter()), LOSS, x, y, batch_size=8)
    check_model(Net(nn.Dropout(0.5)), LOSS, x, y, batch_size=16)


class Tokens(nn.Module):
    def __init__(self, **embedding):
        super().__init__()
        self.embed, self.head = nn.Embedding(9, 4, **embedding), nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.embed(x.long()).mean(1))


def test_an_in_place_renormalisation_of_the_weights_is_refused():
    # Embedding(max_norm) rescales the rows of the tokens in the batch, in place: the audit
    # moved the released weights by 1.40 against the step's sensitivity lr C / B = 0.0125
    torch.manual_seed(0)
    x, y = torch.randint(0, 9, (20, 5)).float() * 0 + torch.arange(5).float(), \
        torch.randint(0, 3, (20,))
    with pytest.raises(DpclipError, match="max_norm"):
        check_model(Tokens(max_norm=0.1), LOSS, x, y, batch_size=8)
    check_model(Tokens(), LOSS, x, y, batch_size=8)


class RenormalisesInPlace(nn.Module):
    """Any in-place change of a parameter in forward, not only Embedding's."""

    def __init__(self):
        super().__init__()
        self.fc, self.head = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        if self.training:
            with torch.no_grad():
                self.fc.weight.mul_(0.99)
        return self.head(torch.tanh(self.fc(x)))


def test_a_parameter_changed_by_the_forward_pass_is_refused_by_name():
    torch.manual_seed(0)
    x, y = _data()
    with pytest.raises(DpclipError, match="changes parameter 'fc.weight' in place"):
        check_model(RenormalisesInPlace(), LOSS, x, y, batch_size=8)


def test_refusals_print_nothing_computed_from_the_records():
    # before: "norm 0.1197 against 0.03697", gradient norms of private records
    from test_contribution_bound import CentresTheBatch, WeightUsedTwice

    torch.manual_seed(0)
    x, y = _data()
    for model, inputs in ((WeightUsedTwice(), x[:, :5]), (CentresTheBatch(), x)):
        with pytest.raises(DpclipError) as refused:
            check_model(model, LOSS, inputs, y)
        assert not re.search(r"\d\.\d|\de-?\d", str(refused.value)), str(refused.value)


def test_a_private_run_refuses_train_mode_mixing_before_any_step(monkeypatch):
    from conftest import gaussian_records, tiny_train_config
    from dpclip.train import build_run, loop

    monkeypatch.setattr(loop, "build_model", lambda *args: Net(FunctionalBatchNorm(6)))
    x, y = gaussian_records(40)
    run = build_run((6,), 3, len(x), tiny_train_config())
    with pytest.raises(DpclipError, match="training mode"):
        run.fit(torch.as_tensor(x), torch.as_tensor(y), progress=False, desc="")
    assert not run.trace


def test_the_check_leaves_the_caller_s_random_streams_alone():
    x, y = _data()
    model = Net(nn.Dropout(0.3))
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    check_model(model, LOSS, x, y, batch_size=8)
    assert torch.equal(torch.rand(3), expected)


class ScaleThenDropout(nn.Module):
    """A bare parameter and Dropout in one layer: functorch's per-sample path cannot draw the
    mask (before: accepted by the eval-mode check, then failed at the first step)."""

    def __init__(self):
        super().__init__()
        self.w, self.drop = nn.Parameter(torch.ones(6)), nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(x * self.w)


def test_a_layer_that_draws_random_numbers_is_refused_by_the_check_with_advice():
    torch.manual_seed(0)
    x, y = _data()
    with pytest.raises(DpclipError, match="ScaleThenDropout layer.*Dropout in a module of its"):
        check_model(Net(ScaleThenDropout()), LOSS, x, y, batch_size=8)


class Sequence(nn.Module):
    """(B, 32) -> (B, 4, 8) tokens -> a sequence layer -> mean over positions -> head."""

    def __init__(self, layer, call):
        super().__init__()
        self.layer, self.call, self.head = layer, call, nn.Linear(8, 3)

    def forward(self, x):
        tokens = x.view(len(x), 4, 8)
        return self.head(self.call(self.layer, tokens).mean(1))


def _attend(layer, t):
    return layer(t, t, t)[0]


def _recur(layer, t):
    return layer(t)[0]


def _encode(layer, t):
    return layer(t)


@pytest.mark.parametrize("build, call, advice", [
    (lambda: nn.MultiheadAttention(8, 2, batch_first=True), _attend,
     "opacus.layers.DPMultiheadAttention, .*ModuleValidator.fix"),
    (lambda: nn.LSTM(8, 8, batch_first=True), _recur, "DPLSTM, .*ModuleValidator.fix"),
    (lambda: nn.GRU(8, 8, batch_first=True), _recur, "DPGRU, .*ModuleValidator.fix"),
    (lambda: nn.RNN(8, 8, batch_first=True), _recur, "DPRNN, the same layer"),
    (lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
     lambda layer, t: layer(t), "'layer.self_attn'.*DPMultiheadAttention"),
])
def test_fused_sequence_layers_are_refused_naming_opacus_replacements(build, call, advice):
    torch.manual_seed(0)
    x, y = torch.randn(20, 32), torch.randint(0, 3, (20,))
    with pytest.raises(DpclipError, match=advice):
        check_model(Sequence(build(), call), LOSS, x, y, batch_size=8)


@pytest.mark.parametrize("build, call", [
    (lambda: nn.MultiheadAttention(8, 2, batch_first=True), _attend),
    (lambda: nn.LSTM(8, 8, num_layers=2, dropout=0.3, batch_first=True), _recur),
    (lambda: nn.GRU(8, 4, batch_first=True, bidirectional=True), _recur),
    (lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1, batch_first=True), _encode),
])
def test_the_advised_opacus_fix_makes_each_sequence_layer_pass_the_check_in_training(build,
                                                                                   call):
    """What the refusal advises works: Opacus's fixer swaps in its DP layers (a recurrent
    cell called at every time step, attention from Linear layers) and the model passes the
    check as the step runs it, dropout included."""
    from opacus.validators import ModuleValidator

    torch.manual_seed(0)
    x, y = torch.randn(20, 32), torch.randint(0, 3, (20,))
    check_model(ModuleValidator.fix(Sequence(build(), call)), LOSS, x, y, batch_size=8)


def test_opacus_dp_rnn_which_its_fixer_does_not_swap_in_passes_the_check():
    from opacus.layers import DPRNN

    torch.manual_seed(0)
    x, y = torch.randn(20, 32), torch.randint(0, 3, (20,))
    check_model(Sequence(DPRNN(8, 8, batch_first=True), _recur), LOSS, x, y, batch_size=8)


class PairMixup(nn.Module):
    """Mixes records (0, 1), (2, 3), ...: a re-audit found it passed while the two checked
    records were held fixed together (3.6 C at B = 16, 9.1 C at 256)."""

    def forward(self, h):
        if not self.training:
            return h
        partner = h.view(-1, 2, h.shape[1]).flip(1).reshape(h.shape)
        return 0.7 * h + 0.3 * partner


class MixesAboveItsBatch(nn.Module):
    """Mixes only when a batch is larger than 8, as a Poisson batch often is (13.8 C)."""

    def forward(self, h):
        return h - h.mean(0) if self.training and len(h) > 8 else h


@pytest.mark.parametrize("middle", [PairMixup(), MixesAboveItsBatch()])
def test_mixing_the_re_audit_found_past_the_check_is_refused(middle):
    torch.manual_seed(0)
    x, y = _data(64)
    with pytest.raises(DpclipError, match="change each other's gradients"):
        check_model(Net(middle), LOSS, x, y, batch_size=8)


class CallCount:
    n = 0


class KeepsRecords(nn.Module):
    """Appends each training batch to a list and keeps a numpy copy of it: raw records that
    torch.save(model) would publish."""

    def __init__(self):
        super().__init__()
        self.fc, self.head = nn.Linear(6, 6), nn.Linear(6, 3)
        self.cache, self.last = [], np.zeros(0)

    def forward(self, x):
        if self.training:
            self.cache.append(x.detach())
            self.last = x.detach().numpy().copy()
        return self.head(torch.tanh(self.fc(x)))


def test_records_kept_in_a_list_or_an_array_are_refused_and_put_back():
    from dpclip.methods import get_method
    from dpclip.methods.base import MethodContext
    from dpclip.randomness import NoiseSources
    from dpclip.train.step import LayerGroups, dp_step, wrap_for_dp

    torch.manual_seed(0)
    x, y = _data()
    with pytest.raises(DpclipError, match=r"attribute '(cache|last)' is written"):
        check_model(KeepsRecords(), LOSS, x, y, batch_size=8)
    model = KeepsRecords()
    groups = LayerGroups.of(model)
    wrapped = wrap_for_dp(model)
    wrapped.checked = True
    optimizer = torch.optim.SGD(groups.flat(), lr=0.1)
    for step in (1, 2):
        dp_step(wrapped, groups, LOSS, x[:8], y[:8], get_method("dp_sgd")(
            MethodContext(1.0, groups.names)), 1.0, 8.0, optimizer, NoiseSources.seeded(0),
            step=step, most_records=len(x))
    assert model.cache == [] and model.last.shape == (0,)


class WritesEveryThirdCall(nn.Module):
    """Past any check that runs a pass or two: every third training call (counted in an object
    of its own, which the step does not put back) copies a record into a buffer, writes a record into a
    weight through ``.data`` (no version counter moves), creates a buffer from the batch and
    keeps a tensor attribute (re-audits: each was released, records exactly)."""

    def __init__(self):
        super().__init__()
        self.fc, self.head = nn.Linear(6, 6), nn.Linear(6, 3)
        self.register_buffer("seen", torch.zeros(6))
        self.calls = CallCount()

    def forward(self, x):
        self.calls.n += 1
        if self.training and self.calls.n % 3 == 0:
            with torch.no_grad():
                self.seen.copy_(x[0])
                self.fc.weight.data[0] = x[1]
            self.register_buffer("centre", x.detach().mean(0))
            self.scale = x.detach().abs().max()
        return self.head(torch.tanh(self.fc(x)))


def test_the_step_itself_puts_back_what_a_batch_wrote_into_the_model():
    from dpclip.methods import get_method
    from dpclip.methods.base import MethodContext
    from dpclip.randomness import NoiseSources
    from dpclip.train.step import LayerGroups, dp_step, wrap_for_dp

    torch.manual_seed(0)
    model = WritesEveryThirdCall()
    groups = LayerGroups.of(model)
    wrapped = wrap_for_dp(model)
    wrapped.checked = True  # as if the check had not seen the k-th call write
    optimizer = torch.optim.SGD(groups.flat(), lr=0.0)  # lr 0: the weights may not move
    weights = [p.detach().clone() for p in groups.flat()]
    x, y = _data()
    for step in range(1, 7):
        dp_step(wrapped, groups, LOSS, x[:8], y[:8], get_method("dp_sgd")(
            MethodContext(1.0, groups.names)), 1.0, 8.0, optimizer, NoiseSources.seeded(0),
            step=step, most_records=len(x))
    assert model.calls.n == 6  # the writes happened, twice
    assert torch.equal(model.seen, torch.zeros(6))
    assert all(torch.equal(p, w) for p, w in zip(groups.flat(), weights))
    assert "centre" not in dict(model.named_buffers()) and not hasattr(model, "scale")


class TinyTerm(nn.Module):
    """h + 1e-9 sum over the batch: under a float32 tolerance, and amplified without bound by
    one extreme record (a re-audit: 164 C at B = 256 with a record at 3e37)."""

    def forward(self, h):
        return h + 1e-9 * h.sum(0) if self.training else h


class SometimesMixes(nn.Module):
    """Mixup on a coin flip: the first replayed draw did not fire (13.7 C when it does)."""

    def forward(self, h):
        if self.training and float(torch.rand(())) > 0.5:
            return h - h.mean(0)
        return h


class MixesAboveThreeBatches(nn.Module):
    def forward(self, h):
        return h - h.mean(0) if self.training and len(h) > 24 else h


@pytest.mark.parametrize("middle", [TinyTerm(), SometimesMixes(), MixesAboveThreeBatches()])
def test_mixing_a_second_re_audit_would_try_is_refused(middle):
    torch.manual_seed(0)
    x, y = _data(80)
    with pytest.raises(DpclipError, match="change each other's gradients"):
        check_model(Net(middle), LOSS, x, y, batch_size=8)


class CoinInForkedStream(nn.Module):
    """Mixup on a coin drawn inside ``fork_rng`` (the caller's stream left as it was): no pass
    changes torch's generator, yet whether it mixes follows the seed (a privacy audit of a check
    that replayed the other seeds only where a pass had drawn: this model passed it)."""

    def forward(self, h):
        if self.training:
            with torch.random.fork_rng():
                coin = float(torch.rand(()))
            if coin > 0.5:
                return h - h.mean(0)
        return h


def test_every_replay_seed_is_tried_even_when_no_pass_moves_the_generator():
    torch.manual_seed(0)
    x, y = _data(80)
    with pytest.raises(DpclipError, match="change each other's gradients"):
        check_model(Net(CoinInForkedStream()), LOSS, x, y, batch_size=8)


def test_a_model_wrapped_by_hand_is_checked_at_its_first_step():
    # an audit: wrap_for_dp and dp_step ran no check, so a direct user of them got none
    from dpclip.methods import get_method
    from dpclip.methods.base import MethodContext
    from dpclip.randomness import NoiseSources
    from dpclip.train.step import LayerGroups, dp_step, wrap_for_dp

    torch.manual_seed(0)
    model = Net(FunctionalBatchNorm(6))
    groups = LayerGroups.of(model)
    x, y = _data()
    with pytest.raises(DpclipError, match="training mode"):
        dp_step(wrap_for_dp(model), groups, LOSS, x[:8], y[:8], get_method("dp_sgd")(
            MethodContext(1.0, groups.names)), 1.0, 8.0, torch.optim.SGD(groups.flat(), lr=0.1),
            NoiseSources.seeded(0), step=1, most_records=len(x))


class Pairs(nn.Module):
    """Reshapes the batch into pairs: works at even batch sizes only (a re-audit: passed the
    check at B = 8, then stopped mid-run at a batch of 13, telling its size and step)."""

    def forward(self, h):
        return h.view(-1, 2, h.shape[1]).reshape(h.shape)


def test_a_model_that_breaks_at_other_batch_sizes_fails_before_training():
    torch.manual_seed(0)
    x, y = _data()
    with pytest.raises(RuntimeError, match="invalid for input of size"):
        check_model(Net(Pairs()), LOSS, x, y, batch_size=8)


@pytest.mark.parametrize("name", ["mlp", "cnn", "paper_cnn"])
def test_the_pipeline_s_own_models_pass_at_the_paper_s_batch(name):
    # the check once compared the records' norms too, whose float32 or float64 path the whole
    # batch's range picks: the CNN was refused on MNIST at B = 256 (2.5e-4 apart)
    from dpclip.models import build_model

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(1100, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (1100,), generator=gen)
    check_model(build_model(name, (1, 28, 28), 10, [32]), LOSS, x, y, batch_size=256)


class MixesAbove600(nn.Module):
    def forward(self, h):
        return h - h.mean(0) if self.training and len(h) > 600 else h


def test_a_large_expected_batch_is_checked_at_its_own_size_and_above():
    # a re-audit: every size was capped at 512, so mixing above 600 passed at B = 1024 and
    # trained (60.5 C for one record)
    torch.manual_seed(0)
    x, y = _data(2100)
    with pytest.raises(DpclipError, match="change each other's gradients"):
        check_model(Net(MixesAbove600()), LOSS, x, y, batch_size=1024)


def test_a_first_batch_too_small_to_check_leaves_the_model_unchecked():
    # a re-audit: a first batch of exactly two records ran no training-mode check yet marked
    # the model checked; later steps mixed at 3.26 C
    from dpclip.methods import get_method
    from dpclip.methods.base import MethodContext
    from dpclip.randomness import NoiseSources
    from dpclip.train.step import LayerGroups, dp_step, wrap_for_dp

    torch.manual_seed(0)
    model = Net(FunctionalBatchNorm(6))
    groups = LayerGroups.of(model)
    wrapped = wrap_for_dp(model)
    x, y = _data()
    step = dict(method=get_method("dp_sgd")(MethodContext(1.0, groups.names)),
                optimizer=torch.optim.SGD(groups.flat(), lr=0.1))
    dp_step(wrapped, groups, LOSS, x[:2], y[:2], step["method"], 1.0, 8.0, step["optimizer"],
            NoiseSources.seeded(0), step=1, most_records=len(x))
    assert not wrapped.checked
    with pytest.raises(DpclipError, match="training mode"):
        dp_step(wrapped, groups, LOSS, x[:8], y[:8], step["method"], 1.0, 8.0,
                step["optimizer"], NoiseSources.seeded(0), step=2, most_records=len(x))


class ParitySign(nn.Module):
    """A privacy audit's model: the hidden layer's sign follows the batch size's parity, so one
    record joining flips every other record's contribution (7.3 C at B = 12; it passed)."""

    def __init__(self):
        super().__init__()
        self.fc, self.head = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x):
        h = torch.tanh(self.fc(x))
        return self.head(-h if self.training and len(x) % 2 else h)


class CallsBySize(nn.Module):
    """Its layer is called len(x) % 3 + 1 times in training (4.9 C; it passed)."""

    def __init__(self):
        super().__init__()
        self.fc, self.head = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        for _ in range(len(x) % 3 + 1 if self.training else 1):
            x = torch.tanh(self.fc(x))
        return self.head(x)


class CentresTheTail(nn.Module):
    """Centres the rows after the first two, in training only (3.4 C; it passed while the
    check followed the first two records alone)."""

    def __init__(self):
        super().__init__()
        self.fc, self.head = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x):
        h = self.fc(x)
        if self.training and len(x) > 2:
            h = torch.cat([h[:2], h[2:] - h[2:].mean(0)])
        return self.head(h)


@pytest.mark.parametrize("model, words", [
    (ParitySign, "changes when its batch holds one record more"),
    (CallsBySize, "changes when its batch holds one record more"),
    (CentresTheTail, "records of one batch change each other's gradients"),  # the last one
])
def test_a_forward_that_follows_the_batch_size_or_mixes_later_rows_is_refused(model, words):
    torch.manual_seed(0)
    x, y = _data()
    with pytest.raises(DpclipError, match=words):
        check_model(model(), LOSS, x, y, batch_size=8)


class HandRolledRecurrence(nn.Module):
    """A recurrent cell written by hand (one Linear called at every step, which the step now
    clips), with its state made in float32: the check's float64 copy failed with a bare
    dtype error."""

    def __init__(self, like_input: bool):
        super().__init__()
        self.like_input = like_input
        self.ih, self.hh, self.head = nn.Linear(2, 4), nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x):
        h = x.new_zeros(len(x), 4) if self.like_input else torch.zeros(len(x), 4)
        for t in range(3):
            h = torch.tanh(self.ih(x[:, 2 * t:2 * t + 2]) + self.hh(h))
        return self.head(h)


def test_a_state_made_in_a_fixed_dtype_is_refused_with_what_to_write_instead():
    torch.manual_seed(0)
    x, y = _data()
    with pytest.raises(DpclipError, match=r"float64 copy .*x.new_zeros"):
        check_model(HandRolledRecurrence(like_input=False), LOSS, x, y, batch_size=8)
    check_model(HandRolledRecurrence(like_input=True), LOSS, x, y, batch_size=8)
