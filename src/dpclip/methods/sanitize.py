"""``sanitize`` (papers/sanitization-layer_private-features-public-labels.txt): private
features, public labels. Noise goes on one intermediate layer, not on the gradients.

The model is the funnel 8n, 4n, 2n, n on the dataset's trunk (``train.model``), with the
mechanism below after the n-wide layer's ReLU. Encoder modes:

* ``frozen`` (default, sound): every layer up to the sanitization layer is trained on the
  public shadow split, then frozen; only the head trains on sanitized activations of the
  private records, so the released model is post-processing of per-record Gaussian releases.
* ``joint`` (the paper's setting): the encoder also trains on the raw private features; its
  weights are not protected, so runs are flagged ``dp_guarantee: false`` and their epsilon
  covers the sanitized activations only.

The mechanism (METHODS.md, ``sanitize``). Threat model: labels are public, features are
private; neighbouring datasets differ in one record's features. For one record, with z the n
activations of the sanitization layer:

1. element-wise clip: z <- min(max(z, 0), C) after a ReLU (range [0, C]), or to [-C, C];
2. draw the dropout mask first (each unit kept with probability 1 - p) and zero dropped units;
3. add N(0, sigma^2 C^2 k) to each of the k kept units, with k the record's actual count.

Replacing the record moves the kept vector by at most C sqrt(k) in L2 on [0, C] (2 C sqrt(k) on
[-C, C]); the mask does not depend on the data. So the release is a Gaussian mechanism with
sigma_eff = noise std / sensitivity = sigma on [0, C] and sigma / 2 on [-C, C].

Accounting: each epoch releases every record once (shuffled batches, no subsampling claimed),
so epsilon is that of ``epochs`` Gaussian releases at sigma_eff (:func:`record_epsilon`,
Opacus's RDP at sampling rate 1); the target epsilon sets sigma like every other method's. The
method has its own ``epochs`` (not ``train.epochs``): by Gaussian composition, E releases at
sigma sqrt(E) carry what one release at sigma does, so more epochs buy no signal, only more
steps on noisier inputs. With ``adaptive: true``, C = t ||W||_F of the sanitization layer's
weights after each epoch (paper Alg. 3; post-processing). In ``frozen`` mode W is fixed, so C
stays t ||W||_F. The run itself is the ``sanitize`` run kind (:mod:`dpclip.train.runs.sanitize`).
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent
from opacus.accountants.utils import get_noise_multiplier
from torch import nn

from dpclip.methods.base import Method, Option, register
from dpclip.models import per_record_std

ENCODER_MODES = ("frozen", "joint")

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



@register
class Sanitize(Method):
    name = "sanitize"
    run_kind = "sanitize"  # its own run (dpclip.train.runs.sanitize), not the DP-SGD step
    adjacency = "replace_one_features"  # labels public, one record's features replaced
    early_stopping_watches = "the released sanitized outputs' std"
    early_stopping_series = "sanitized-output std"
    OPTIONS = {
        "n": Option(8, low=1, integer=True, help="width n of the sanitization layer"),
        "drop_p": Option(0.1, low=0.0, high=1.0, high_open=True,
                         help="dropout probability p, mask drawn before the noise"),
        "clip": Option(1.0, low=0.0, low_open=True, help="C: activations clipped to [0, C]"),
        "adaptive": Option(False, help="C = t ||W||_F after each epoch (paper Alg. 3)"),
        "t": Option(0.05, low=0.0, low_open=True, help="the constant t of the adaptive C"),
        "encoder": Option("frozen", choices=ENCODER_MODES,
                          help="frozen (trained on public data; sound) | joint (literal)"),
        "public_epochs": Option(100, low=1, integer=True,
                                help="frozen: epochs of public pre-training of the encoder"),
        "public_lr": Option(0.003, low=0.0, low_open=True,
                            help="frozen: Adam learning rate of the public pre-training"),
        "epochs": Option(10, low=1, integer=True,
                         help="private epochs: each one releases every record once"),
        "head_lr": Option(0.002, low=0.0, low_open=True,
                          help="learning rate (train.optimizer) on the sanitized activations"),
    }

    def __init__(self, context):
        super().__init__(context)
        self.clip_threshold = float(self.options["clip"])
        self.dp_guarantee = self.options["encoder"] == "frozen"

    def data_use(self) -> dict[str, str]:
        encoder = ("the public shadow_train split (pre-trained without noise, then frozen)"
                   if self.options["encoder"] == "frozen" else
                   "members' raw features without noise (joint mode: no DP for the encoder)")
        clip = ("the sanitization layer's released weights (post-processing)"
                if self.options["adaptive"] else "nothing: C is constant")
        return {"encoder": encoder,
                "head": "members' sanitized activations (clipped, masked, noised per record) "
                        "and their labels in the clear (public by the threat model)",
                "clip_threshold": clip}

    @classmethod
    def model_hidden(cls, options: dict, hidden) -> list[int]:
        return funnel_widths(int({**cls.default_options(),
                                  **options}["n"]))

    @classmethod
    def rebuild_for_evaluation(cls, model, architecture: dict):
        """The sanitization layer as clip-only (no noise) at evaluation."""
        sanitizer = architecture["sanitizer"]
        return with_sanitizer(model, sanitizer["after"], SanitizationLayer(sanitizer["clip"]))

    @classmethod
    def needs_public_data(cls, options: dict) -> bool:
        return {**cls.default_options(), **options}["encoder"] == "frozen"
