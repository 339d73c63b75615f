"""The models' own layers: dpclip's max-pool gives nn.MaxPool2d's numbers bit for bit."""

import pytest
import torch
from torch import nn

from dpclip.models import MaxPool2d, build_model


@pytest.mark.parametrize("shape, kernel, stride", [
    ((9, 16, 14, 14), 2, 1),    # the paper CNN's first pool
    ((9, 32, 5, 5), 2, 1),      # its second
    ((9, 16, 28, 28), 2, None),  # the cnn's
    ((5, 3, 11, 9), 3, 2),      # odd sizes, overlapping windows
])
@pytest.mark.parametrize("values", ["gaussian", "relu", "ties"])
def test_max_pool_matches_torch_bit_for_bit_forward_and_backward(shape, kernel, stride, values):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen)
    if values == "relu":
        x = x.relu()  # a quarter of the windows all zero
    elif values == "ties":
        x = torch.randint(0, 3, shape, generator=gen).float()  # most windows hold ties
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = MaxPool2d(kernel, stride)(ours)
    expected = nn.MaxPool2d(kernel, stride)(theirs)
    grad = torch.randn(expected.shape, generator=gen)
    out.backward(grad)
    expected.backward(grad)
    assert out.is_contiguous() and ours.grad.is_contiguous()
    assert torch.equal(out, expected)
    # overlapping windows send several output gradients to one input: same inputs, same order
    assert torch.equal(ours.grad, theirs.grad)


def test_models_with_pools_train_to_the_same_bits_as_with_torchs(monkeypatch):
    """Three SGD steps of the paper CNN: the same parameters, bit for bit, as with
    nn.MaxPool2d (the committed paper runs were trained with it)."""
    import dpclip.models as models

    def train(pool_class):
        monkeypatch.setattr(models, "MaxPool2d", pool_class)
        torch.manual_seed(3)
        model = build_model("paper_cnn", (1, 28, 28), 10, [32])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        gen = torch.Generator().manual_seed(4)
        for _ in range(3):
            x, y = torch.rand(32, 1, 28, 28, generator=gen), torch.randint(0, 10, (32,), generator=gen)
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        return [p.detach().clone() for p in model.parameters()], model

    ours, model = train(MaxPool2d)
    assert any(type(m) is MaxPool2d for m in model.modules())
    theirs, _ = train(nn.MaxPool2d)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def test_max_pool_under_torch_func_and_forward_ad_is_torchs():
    """The custom backward has no vmap or jvp rule: under torch.func and forward-mode AD the
    layer is nn.MaxPool2d itself, so per-sample gradients through it work and agree."""
    x = torch.randn(3, 2, 6, 6, generator=torch.Generator().manual_seed(1))

    def loss(pool):
        return lambda t: (pool(t) ** 2).sum()

    ours = torch.func.vmap(torch.func.grad(loss(MaxPool2d(2, 1))))(x[:, None])
    theirs = torch.func.vmap(torch.func.grad(loss(nn.MaxPool2d(2, 1))))(x[:, None])
    assert torch.equal(ours, theirs)
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        tangent = torch.ones_like(x)
        ours = fwAD.unpack_dual(MaxPool2d(2, 1)(fwAD.make_dual(x, tangent))).tangent
        theirs = fwAD.unpack_dual(nn.MaxPool2d(2, 1)(fwAD.make_dual(x, tangent))).tangent
    assert torch.equal(ours, theirs)


def test_dp_steps_of_the_paper_cnn_give_the_same_bits_as_with_torchs_pool(monkeypatch):
    """Two DP-SGD steps (clipping, noise) of the paper CNN through dpclip's step: the same
    parameter bytes with either pool."""
    import dpclip.models as models
    from dpclip.methods import get_method
    from dpclip.methods.base import MethodContext
    from dpclip.randomness import NoiseSources
    from dpclip.train.step import LayerGroups, dp_step, wrap_for_dp

    def train(pool_class):
        monkeypatch.setattr(models, "MaxPool2d", pool_class)
        torch.manual_seed(5)
        model = build_model("paper_cnn", (1, 28, 28), 10, [32])
        groups = LayerGroups.of(model)
        method = get_method("dp_sgd")(MethodContext(1.0, groups.names))
        optimizer = torch.optim.SGD(groups.flat(), lr=0.5)
        wrapped, noise = wrap_for_dp(model), NoiseSources.seeded(7)
        initial = [p.detach().clone() for p in groups.flat()]
        gen = torch.Generator().manual_seed(6)
        for step in (1, 2):
            x, y = torch.rand(24, 1, 28, 28, generator=gen), torch.randint(0, 10, (24,), generator=gen)
            dp_step(wrapped, groups, nn.CrossEntropyLoss(reduction="none"), x, y, method, 1.1,
                    24.0, optimizer, noise, step=step, most_records=24)
        assert not any(torch.equal(a, p) for a, p in zip(initial, groups.flat()))  # it trained
        return [p.detach().clone() for p in groups.flat()]

    ours, theirs = train(MaxPool2d), train(nn.MaxPool2d)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
