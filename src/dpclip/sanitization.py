"""The sanitization layer's mechanism and its accounting (METHODS.md, ``sanitize``; paper:
papers/sanitization-layer_private-features-public-labels.txt). Threat model: labels are public,
features are private; neighbouring datasets differ in one record's features.

For one record, with z the n activations of the sanitization layer:

1. element-wise clip: z <- min(max(z, 0), C) after a ReLU (range [0, C]), or to [-C, C];
2. draw the dropout mask first (each unit kept with probability 1 - p) and zero dropped units;
3. add N(0, sigma^2 C^2 k) to each of the k kept units, with k the record's actual count.

Replacing the record moves the kept vector by at most C sqrt(k) in L2 on [0, C] (2 C sqrt(k) on
[-C, C]); the mask does not depend on the data. So the release is a Gaussian mechanism with
sigma_eff = noise std / sensitivity = sigma on [0, C] and sigma / 2 on [-C, C].

Accounting: every epoch uses each record once, so a record is released once per epoch: E
Gaussian releases of multiplier sigma_eff, composed with Opacus's RDP at sampling rate 1 (no
subsampling amplification is claimed).
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from torch import nn
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent
from opacus.accountants.utils import get_noise_multiplier

RDP_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [128, 256, 512]


def funnel_widths(n: int) -> list[int]:
    """The funnel's hidden widths 8n, 4n, 2n, n; the n-wide one is the sanitization layer."""
    if n < 1:
        raise ValueError(f"methods.sanitize.n: {n!r} must be >= 1")
    return [8 * n, 4 * n, 2 * n, n]


def sensitivity(clip: float, kept: torch.Tensor, signed: bool = False) -> torch.Tensor:
    """Replace-one L2 sensitivity C sqrt(k) on [0, C], 2 C sqrt(k) on [-C, C], per record."""
    return (2.0 if signed else 1.0) * clip * kept.to(torch.float64).sqrt()


def clip_activations(z: torch.Tensor, clip: float, signed: bool = False) -> torch.Tensor:
    return z.clamp(-clip if signed else 0.0, clip)


def sanitize(z: torch.Tensor, clip: float, drop_p: float, sigma: float,
             generator: torch.Generator | None = None, signed: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(sanitized activations, kept counts k_i) for a batch z of shape (B, n).

    The noise on a kept unit of record i has std sigma C sqrt(k_i); dropped units stay 0.
    """
    clipped = clip_activations(z, clip, signed)
    keep = (torch.rand(z.shape, generator=generator, device=z.device) >= drop_p).to(z.dtype)
    kept = keep.sum(dim=1)
    std = sigma * clip * kept.sqrt()[:, None]
    noise = torch.randn(z.shape, generator=generator, device=z.device, dtype=z.dtype)
    return (clipped + noise * std) * keep, kept


def record_epsilon(sigma_eff: float, uses: int, delta: float) -> float:
    """Epsilon of ``uses`` Gaussian releases of one record (multiplier sigma_eff), by RDP."""
    if uses == 0:
        return 0.0
    rdp = compute_rdp(q=1.0, noise_multiplier=sigma_eff, steps=uses, orders=RDP_ORDERS)
    epsilon, _ = get_privacy_spent(orders=RDP_ORDERS, rdp=rdp, delta=delta)
    return float(epsilon)


def noise_for_record_epsilon(target_epsilon: float, delta: float, uses: int,
                             tolerance: float = 0.01) -> float:
    """The smallest sigma_eff (within ``tolerance`` in epsilon) whose ``uses`` releases stay
    within the target: Opacus's search, at sampling rate 1."""
    sigma = get_noise_multiplier(target_epsilon=target_epsilon, target_delta=delta,
                                 sample_rate=1.0, steps=uses, accountant="rdp",
                                 epsilon_tolerance=tolerance)
    if record_epsilon(sigma, uses, delta) > target_epsilon + 1e-9 or not math.isfinite(sigma):
        raise ValueError(f"no noise multiplier reaches epsilon {target_epsilon} in {uses} uses")
    return float(sigma)


def per_record_std(z: torch.Tensor) -> float:
    """Mean over records (rows) of each record's standard deviation over its units."""
    if z.shape[1] < 2:
        return 0.0
    return float(z.detach().std(dim=1).mean())


class SanitizationLayer(nn.Module):
    """The mechanism as a layer, placed after the n-wide layer's ReLU (range [0, C]).

    With ``noisy`` on (private training), each record's activations are clipped, masked and
    noised (:func:`sanitize`) and the batch mean of each record's standard deviation of its
    sanitized vector is kept in ``last_std`` (the early-stopping series). Otherwise (public
    pre-training, evaluation) it only clips, so the head always sees activations in [0, C].
    It has no parameters: the model's parameterised layers keep their names.
    """

    def __init__(self, clip: float, drop_p: float = 0.0, sigma: float = 0.0):
        super().__init__()
        self.clip, self.drop_p, self.sigma = float(clip), float(drop_p), float(sigma)
        self.noisy = False
        self.generator: torch.Generator | None = None
        self.last_std = math.nan

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        if not self.noisy:
            return clip_activations(z, self.clip)
        out, _ = sanitize(z, self.clip, self.drop_p, self.sigma, self.generator)
        self.last_std = per_record_std(out)
        return out

    def extra_repr(self) -> str:
        return f"clip={self.clip:g}, drop_p={self.drop_p:g}, sigma={self.sigma:g}"


def with_sanitizer(model: nn.Sequential, after: str, layer: SanitizationLayer) -> nn.Sequential:
    """A copy of the Sequential ``model`` with ``layer`` (named "sanitizer") after ``after``."""
    modules = OrderedDict()
    for name, module in model.named_children():
        modules[name] = module
        if name == after:
            modules["sanitizer"] = layer
    if "sanitizer" not in modules:
        raise ValueError(f"the model has no layer {after!r} to put the sanitization layer after")
    return nn.Sequential(modules)
