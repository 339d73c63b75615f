"""The one DP-SGD step shared by every gradient method (docs/privacy.md, "The DP step").

    gbar_i^(l) = s_i^(l) g_i^(l)                    (method's scaling rule, ||gbar_i|| <= C_t)
    G          = ( sum_i gbar_i + N(0, sigma_T^2 C_t^2 I) ) / B      (B = q N, the expected
                                                                      batch size, not |L_t|)
    theta     <- optimizer(theta, G)
    state     <- controller(released quantities)

One forward pass keeps each parameterised layer's input activations a_i and output z_i
(:class:`~dpclip.train.book_keeping.BookKeeping`); one backward pass asks autograd for dL/dz of every layer (delta_i) and
for no weight gradient, which the DP step would throw away. Each layer's per-sample norms and
its weighted sum sum_i s_i^(l) g_i^(l) come from (a, delta) (:mod:`dpclip.train.per_sample`:
ghost norms for Linear layers, the cheaper of ghost norms and instantiated per-sample gradients
for convolutions, Opacus's per-sample gradients for the others), for per-sample and per-layer
factors alike. No second backward pass is needed. A "layer" is one module that owns parameters
(its weight and bias together).

The book-keeping's names (``BookKeeping``, ``LayerGroups``, ``wrap_for_dp``, ...) live in
:mod:`dpclip.train.book_keeping` and are importable from here too.
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
    """``total + N(0, std^2 I)``, in place in ``total``, drawn in ``total``'s dtype (float64
    for the step's sums: torch's float32 normal on the CPU is Box-Muller on 24-bit uniforms,
    so its draws never exceed 5.77 sigma, and an output beyond that from the neighbouring
    data set would be impossible, a delta the accountant does not count; float64's reach
    8.57 sigma with mass 2^-53 beyond), a chunk at a time
    (:data:`NOISE_CHUNK`) so that the step never holds a second tensor of the largest layer's
    size beside the sums. On the CPU the chunks are exactly the numbers one draw of the whole
    tensor gives: torch fills blocks of 16 and redraws a ragged last block, so every chunk but
    the last is a multiple of 16 and a last one shorter than 16 joins the one before it."""
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
    changes by at most C (1 + eta) when one record joins or leaves, rounding included: any
    order of summation is within gamma_{n} sum_i |v_i| of the exact sum (Higham, Accuracy and
    Stability of Numerical Algorithms, 2002, eq. 4.4; each entry is a dot product over the
    records), so the two sums' errors add at most 2 gamma_{n} n C, with gamma_n = n u /
    (1 - n u) and u = 2^-53. The noise is scaled by (1 + eta): 8e-7 for n = 60,000."""
    unit = 2.0 ** -53
    n = max(int(records), 1) + 1
    return 2 * n * (n * unit / (1 - n * unit))


def dp_step(model: nn.Module, groups: LayerGroups, loss_fn, x: torch.Tensor, y: torch.Tensor,
            method: Method, sigma_train: float, expected_batch: float,
            optimizer: torch.optim.Optimizer, rng: NoiseSources, step: int,
            canaries=None, *, most_records: int) -> tuple[float, StepRelease]:
    """One DP step on Poisson batch (x, y); returns (mean batch loss, the release).

    A model that :func:`dpclip.train.model_check.check_model` has not passed (``model.checked``)
    is checked on the first batch of two or more records before anything is computed.

    An empty batch is a full step, as the accountant models it and as Opacus does: the clipped
    sum is zero, so the update is the noise alone, the extra queries release their noise, and
    the controller reads those releases as usual (skipping the step would reveal that the batch
    was empty). Its loss is NaN. Noise comes from ``rng.noise``, extra answers from the method.

    ``canaries`` (the audit's :class:`~dpclip.audit.canaries.GradientCanaries`, never in a
    released run): the included canaries sampled into this batch join it as records, after
    the real ones: the method scales them and counts them in its extra queries.

    The clipped sum is accumulated in float64 and the noise added to it there, with its
    standard deviation scaled by 1 + :func:`rounding_slack` of ``most_records`` (the most
    records a batch can hold: the data set's size, public, plus the audit's canaries), so the
    sensitivity the noise is calibrated to holds with the rounding included.
    """
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
