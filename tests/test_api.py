"""The Python API (dpclip.api): docs/python-api.md's example as written, a model of the user's
own under every method (trained, or refused by name), and the refusals that keep the
accountant's assumptions."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from conftest import PROJECT
from dpclip.api import layer_risks, last_hidden_linear, train_private
from dpclip.errors import DpclipError
from dpclip.methods import available_methods, get_method


def _page_code() -> str:
    (code,) = re.findall(r"```python\n(.*?)```",
                         (PROJECT / "docs" / "python-api.md").read_text(), re.S)
    return code


def test_the_page_s_example_runs_as_written_and_the_controller_acts(capsys):
    scope: dict = {}
    exec(compile(_page_code(), "docs/python-api.md", "exec"), scope)
    result, accuracy = scope["result"], scope["accuracy"]
    assert result.epsilon == pytest.approx(8.0, rel=0.01) and result.epsilon <= 8.0
    assert result.options.probe == "encoder.2"  # the last hidden Linear: no layer is fc1
    # the controller read the probe and moved C off its start
    assert len(set(result.clip_thresholds)) > 1 and result.clip_thresholds[0] == 1.0
    assert accuracy > 0.5
    assert "epsilon 8.00" in capsys.readouterr().out


class Tiny(nn.Module):
    """No layer named like dpclip's (fc1, head)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 8), nn.ReLU())
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        return self.out(self.body(x))


def _data(n: int = 120, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=gen)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 1).long()


def _loader(x, y, batch_size: int = 24):
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True)


REFUSED = {"sanitize": "cannot take a model of yours",
           "adaclip_opacus": "cannot take a model of yours"}


@pytest.mark.parametrize("method", available_methods())
def test_a_model_of_the_user_s_own_trains_under_every_method_or_is_refused_by_name(method):
    x, y = _data()
    torch.manual_seed(0)
    model = Tiny()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    risk = None
    if get_method(method).needs_shadow_risk:
        px, py = _data(80, seed=1)
        hx, hy = _data(80, seed=2)
        risk = layer_risks(Tiny(), _loader(px, py), _loader(hx, hy), epochs=3)
        assert set(risk["layers"]) == {"body.0", "body.2", "out"}
    if method in REFUSED:
        with pytest.raises(DpclipError, match=REFUSED[method]):
            train_private(model, optimizer, _loader(x, y), method=method, epochs=1)
        return
    result = train_private(model, optimizer, _loader(x, y), method=method, epochs=2,
                           shadow_risk=risk)
    assert not all(torch.equal(a, p) for a, p in zip(before, model.parameters()))  # trained
    assert len(result.trace) == 2 * (120 // 24)  # N / B Poisson steps an epoch
    if get_method(method).private:
        assert 0 < result.epsilon <= 8.0 * 1.0001 and result.privacy["sample_rate"] == 0.2


class Reader(nn.Module):
    """Token ids (int64) -> Embedding -> a sequence layer -> mean over positions -> head: an
    LSTM (Opacus's DPLSTM, one cell called at every step) or a transformer encoder layer whose
    attention Opacus's fixer swapped for its DPMultiheadAttention."""

    def __init__(self, kind: str):
        super().__init__()
        from opacus.layers import DPLSTM
        from opacus.validators import ModuleValidator

        self.kind, self.embed = kind, nn.Embedding(20, 8)
        self.sequence = DPLSTM(8, 8, batch_first=True) if kind == "lstm" else \
            ModuleValidator.fix(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1,
                                                           batch_first=True))
        self.hidden, self.out = nn.Linear(8, 8), nn.Linear(8, 2)

    def forward(self, tokens):
        h = self.sequence(self.embed(tokens))
        h = h[0] if self.kind == "lstm" else h
        return self.out(torch.relu(self.hidden(h.mean(1))))


def _tokens(n: int, seed: int):
    tokens = torch.randint(0, 20, (n, 6), generator=torch.Generator().manual_seed(seed))
    return tokens, ((tokens < 10).sum(1) > 3).long()


@pytest.mark.parametrize("kind", ["lstm", "encoder"])
@pytest.mark.parametrize("method", available_methods())
def test_a_sequence_model_on_token_ids_trains_under_every_method_or_is_refused(kind, method):
    x, y = _tokens(120, 0)
    torch.manual_seed(0)
    model = Reader(kind)
    before = [p.detach().clone() for p in model.parameters()]
    risk = None
    if get_method(method).needs_shadow_risk:
        risk = layer_risks(Reader(kind), _loader(*_tokens(60, 1)), _loader(*_tokens(60, 2)),
                           epochs=2)
        assert "sequence.l0.ih" in risk["layers"] or "sequence.self_attn.qlinear" in \
            risk["layers"]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    if method in REFUSED:
        with pytest.raises(DpclipError, match=REFUSED[method]):
            train_private(model, optimizer, _loader(x, y), method=method)
        return
    result = train_private(model, optimizer, _loader(x, y), method=method, epochs=2,
                           shadow_risk=risk)
    assert not all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert model.embed.weight.dtype == torch.float32 and len(result.trace) == 10
    if get_method(method).private:
        assert 0 < result.epsilon <= 8.0 * 1.0001


def test_the_probe_is_the_last_hidden_linear_or_refused_by_name():
    assert last_hidden_linear(Tiny()) == "body.2"
    x, y = _data()
    model = Tiny()
    with pytest.raises(DpclipError, match=r"options.probe: 'fc9' is not a layer of the model"):
        train_private(model, torch.optim.SGD(model.parameters(), lr=0.1), _loader(x, y),
                      method="ww_dp_sgd", options={"probe": "fc9"})
    single = nn.Sequential(nn.Linear(6, 3))
    with pytest.raises(DpclipError, match="no nn.Linear before its output"):
        train_private(single, torch.optim.SGD(single.parameters(), lr=0.1), _loader(x, y),
                      method="ww_dp_sgd")


def test_what_would_break_the_accounting_or_the_step_is_refused():
    x, y = _data()
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(DpclipError, match="labels are outside the class indices 0..2"):
        train_private(model, optimizer, _loader(x, y + 5))
    partial = torch.optim.SGD(model.out.parameters(), lr=0.1)
    with pytest.raises(DpclipError, match="optimizer: it holds 2 parameters, the model trains 6"):
        train_private(model, partial, _loader(x, y))
    with pytest.raises(DpclipError, match="shadow_risk: 'lm_dp_sgd'"):
        train_private(model, optimizer, _loader(x, y), method="lm_dp_sgd")

    class Mixing(Tiny):  # an operation across the batch: one record moves the others
        def forward(self, x):
            return self.out(self.body(x - x.mean(dim=0)))

    mixing = Mixing()
    with pytest.raises(DpclipError, match="records of one batch change each other"):
        train_private(mixing, torch.optim.SGD(mixing.parameters(), lr=0.1), _loader(x, y))


def test_released_noise_is_fresh_and_a_seeded_run_replays():
    """By default the noise and batches come from the OS's entropy (a model to release); with
    secure_noise false the seed replays the run exactly (research only: whoever knows the seed
    and the other records can replay it)."""
    x, y = _data()

    def trained(**kwargs):
        torch.manual_seed(0)
        model = Tiny()
        result = train_private(model, torch.optim.SGD(model.parameters(), lr=0.2),
                               _loader(x, y), epochs=1, **kwargs)
        return result, [p.detach().clone() for p in model.parameters()]

    fresh, a = trained()
    again, b = trained()
    assert fresh.privacy["reproducible"] is False and fresh.privacy["secure_noise"] is True
    assert not all(torch.equal(p, q) for p, q in zip(a, b))
    seeded, c = trained(secure_noise=False, seed=3)
    replay, d = trained(secure_noise=False, seed=3)
    assert seeded.privacy["reproducible"] is True
    assert all(torch.equal(p, q) for p, q in zip(c, d))
    # the trace's columns computed from private batches without noise stay out of the public one
    assert "train_loss" in fresh.trace[0] and "batch_size" in fresh.trace[0]
    assert not {"train_loss", "batch_size"} & set(fresh.public_trace[0])


def test_a_rule_without_a_guarantee_reports_no_epsilon_and_loaders_it_cannot_honour_are_refused():
    x, y = _data()
    model = Tiny()
    risk = {"layers": {n: {"error_rate": 0.5, "norm_share": 1 / 3}
                       for n in ("body.0", "body.2", "out")}, "layer_names": ["body.0", "body.2", "out"]}
    literal = train_private(model, torch.optim.SGD(model.parameters(), lr=0.1), _loader(x, y),
                            method="lm_dp_sgd", options={"weights": "batch"}, shadow_risk=risk)
    assert literal.privacy["dp_guarantee"] is False and literal.epsilon is None
    subset = DataLoader(TensorDataset(x, y), batch_size=24,
                        sampler=torch.utils.data.SubsetRandomSampler(range(60)))
    with pytest.raises(DpclipError, match="its sampler draws from 60 of the dataset's 120"):
        train_private(model, torch.optim.SGD(model.parameters(), lr=0.1), subset)
    collated = DataLoader(TensorDataset(x, y), batch_size=24, collate_fn=lambda b: b)
    with pytest.raises(DpclipError, match="collate_fn of its own"):
        train_private(model, torch.optim.SGD(model.parameters(), lr=0.1), collated)
    with pytest.raises(DpclipError, match="probe ',' names no layer"):
        train_private(model, torch.optim.SGD(model.parameters(), lr=0.1), _loader(x, y),
                      method="ww_dp_sgd", options={"probe": ","})


def test_uint8_pixels_are_features_and_token_ids_stay_integers():
    """uint8 images (torchvision without ToTensor) train as float32 pixels, as before token
    ids became int64 (a privacy audit found them turned into int64 and refused by Conv2d
    with a bare error)."""
    from dpclip.models import as_model_input

    assert as_model_input(torch.zeros(2, 3, dtype=torch.uint8)).dtype == torch.float32
    assert as_model_input(torch.zeros(2, 3, dtype=torch.int32)).dtype == torch.int64
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (60, 1, 8, 8), dtype=torch.uint8, generator=gen)
    y = torch.randint(0, 2, (60,), generator=gen)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(144, 8),
                          nn.ReLU(), nn.Linear(8, 2))
    result = train_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                           DataLoader(TensorDataset(x, y), batch_size=12), secure_noise=False)
    assert 0 < result.epsilon <= 8.0 * 1.0001
