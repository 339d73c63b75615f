"""The one DP-SGD step shared by every gradient method (docs/privacy.md, "The DP step"): the
method scales each record's per-layer gradients so that ||gbar_i|| <= C_t, the step adds
N(0, sigma_T^2 C_t^2 I) to their sum, divides by the expected batch size B = q N (not the
batch's actual size) and steps the optimizer, and the method's controller then reads only
released quantities. One forward and one backward pass (no weight gradients) give every
layer's per-sample norms and weighted sum (:mod:`dpclip.train.book_keeping`,
:mod:`dpclip.train.per_sample`), whose names are importable from here too.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from dpclip.methods.base import Method, StepRelease
from dpclip.randomness import NoiseSources
from dpclip.train.book_keeping import (BookKeeping, LayerGroups, LayerUse, StateBeforeStep,
                                       backward_keeping, per_layer_norms, scaled_sum,
                                       sequence_advice, wrap_for_dp)
from dpclip.train.model_check import TRAIN_MODE_RECORDS as CHECKED_RECORDS, check_model


# numbers drawn per call: a multiple of 16, the block torch's CPU Gaussian sampler fills
NOISE_CHUNK = {"cpu": 1 << 16, "cuda": 1 << 24}


def add_noise(total: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """``total + N(0, std^2 I)``, in place, drawn in ``total``'s dtype (float64 for the step's
    sums: docs/privacy.md), a chunk at a time (:data:`NOISE_CHUNK`). On the CPU the chunks give
    exactly the numbers of one draw of the whole tensor: torch fills blocks of 16 and redraws a
    ragged last block, so every chunk but the last is a multiple of 16 and a last one shorter
    than 16 joins the one before it."""
    flat = total.view(-1) if total.is_contiguous() else total.contiguous().view(-1)
    chunk = NOISE_CHUNK.get(flat.device.type, NOISE_CHUNK["cuda"])
    starts = list(range(0, flat.numel(), chunk))
    if len(starts) > 1 and flat.numel() - starts[-1] < 16:
        starts.pop()
    for start, end in zip(starts, starts[1:] + [flat.numel()]):
        flat[start:end].add_(torch.normal(0.0, std, size=(end - start,), generator=generator,
                                          dtype=flat.dtype, device=flat.device))
    return flat.view(total.shape)


def rounding_slack(records: int) -> float:
    """eta such that the float64 sum of at most ``records`` vectors, each of norm at most C,
    changes by at most C (1 + eta) when one record joins or leaves, rounding included:
    2 n gamma_n, gamma_n = n u / (1 - n u), u = 2^-53 (Higham 2002; docs/privacy.md). The
    noise is scaled by (1 + eta): 8e-7 for n = 60,000."""
    unit = 2.0 ** -53
    n = max(int(records), 1) + 1
    return 2 * n * (n * unit / (1 - n * unit))


def dp_step(model: nn.Module, groups: LayerGroups, loss_fn, x: torch.Tensor, y: torch.Tensor,
            method: Method, sigma_train: float, expected_batch: float,
            optimizer: torch.optim.Optimizer, rng: NoiseSources, step: int,
            canaries=None, *, most_records: int) -> tuple[float, StepRelease]:
    """One DP step on Poisson batch (x, y); returns (mean batch loss, the release). A model not
    yet passed by :func:`~dpclip.train.model_check.check_model` (``model.checked``) is checked
    on its first batch of four or more records. An empty batch is a full step (the update is
    the noise alone; its loss is NaN). Noise comes from ``rng.noise``, extra answers from the
    method. ``canaries`` (the audit's :class:`~dpclip.audit.canaries.GradientCanaries`, never in
    a released run): those sampled join the batch as records, after the real ones. The noise's
    std is scaled by 1 + :func:`rounding_slack` of ``most_records`` (the most records a batch
    can hold: the data set's size, public; the canaries are added here)."""
    if not model.checked and len(x) >= CHECKED_RECORDS + 2:
        # a model wrapped by hand: the check runs on the first batch that lets it change the
        # other records of a batch around the ones it checks
        check_model(model._module, loss_fn, x, y, batch_size=round(expected_batch))
        model.checked = True
    clip = method.clip_threshold
    optimizer.zero_grad(set_to_none=True)
    n_layers = len(groups.names)
    chosen, canary_norms = canaries.sample(x.device) if canaries is not None else \
        ([], torch.zeros((0, n_layers), device=x.device))
    if len(x) == 0:
        loss = float("nan")
        layer_norms = torch.cat([torch.zeros((0, n_layers), device=x.device), canary_norms])
        factors = method.scale(layer_norms)  # a rule with state sees the batch as always
        sums = [torch.zeros_like(p, dtype=torch.float64) for p in groups.flat()]
    else:
        before = StateBeforeStep(model)
        out, uses = model.forward_keeping(x)
        losses = loss_fn(out, y)  # per-sample losses, reduction="none"
        kept = backward_keeping(model, losses, uses)  # no weight gradients computed
        del out, uses  # kept holds the activations now, and lets go of them layer by layer
        loss = float(losses.mean().detach())
        layer_norms = torch.cat([per_layer_norms(groups, kept), canary_norms])
        # a record whose factor is not finite contributes nothing (its gradient is zeroed too)
        factors = torch.nan_to_num(method.scale(layer_norms), nan=0.0, posinf=0.0, neginf=0.0)
        sums = scaled_sum(groups, kept, factors[:len(x)])  # empties kept as it goes
        before.restore()  # nothing the batch wrote into the model outlives the step
    if canaries is not None:
        canaries.observe(method, x.device)  # every step, whoever was sampled
    if len(chosen):
        canaries.add(sums, chosen, factors[len(x):])
    extras = method.release_extras(layer_norms, rng)
    noisy = []
    most = most_records + (len(canaries.included) if canaries is not None else 0)
    std = sigma_train * clip * (1 + rounding_slack(most))
    for k, p in enumerate(groups.flat()):
        total, sums[k] = sums[k], None
        p.grad = add_noise(total, std, rng.noise).div_(expected_batch).to(p.dtype)
        noisy.append(p.grad.detach())
    optimizer.step()
    release = StepRelease(step=step, noisy_grad=noisy, extras=extras)
    method.update(release)
    return loss, release


def plain_step(model: nn.Module, loss_fn, x, y, optimizer) -> float:
    """Non-private step: mean loss, plain gradient."""
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y).mean()
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def layer_norms_of(model: nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor,
                   batch: int = 512) -> torch.Tensor:
    """n_i^(l) for every record (N x L) under ``model``'s current weights, with the same
    per-sample norms as the DP step. Works on a copy: ``model`` keeps no hooks."""
    private_copy = copy.deepcopy(model).train()
    groups = LayerGroups.of(private_copy)
    wrapped = BookKeeping(private_copy, groups)
    out = []
    for start in range(0, len(x), batch):
        logits, uses = wrapped.forward_keeping(x[start:start + batch])
        kept = backward_keeping(wrapped, loss_fn(logits, y[start:start + batch]), uses)
        out.append(per_layer_norms(groups, kept).detach())
    return torch.cat(out)


__all__ = ["BookKeeping", "LayerGroups", "LayerUse", "StateBeforeStep", "add_noise",
           "backward_keeping", "dp_step", "layer_norms_of", "per_layer_norms", "plain_step",
           "rounding_slack", "scaled_sum", "sequence_advice", "wrap_for_dp"]
