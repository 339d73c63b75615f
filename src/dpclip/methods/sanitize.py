"""``sanitize`` (Monir, Fauzan, Ghinita and Abdallah): private features, public labels. Noise
goes on one intermediate layer's activations, not on the gradients.

After the n-wide ReLU of the funnel 8n-4n-2n-n, each record's activations are clipped to
[0, C], dropout-masked (the mask drawn first) and each of its k kept units gets
N(0, sigma^2 C^2 k): a Gaussian release of replace-one sensitivity C sqrt(k). Each epoch
releases every record once (:func:`record_epsilon`); the run is
:mod:`dpclip.train.runs.sanitize`. The mechanism, its accounting and the options (encoder,
head_fit, keep_public_head, accounting): docs/methods.md, "`sanitize`: private features, public
labels".
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from torch import nn

from dpclip.claim_checks import Check, accounting_numbers
from dpclip.config import BUILT_IN_MODELS
from dpclip.errors import bad_value
from dpclip.methods.base import CONSTANT_CLIP, Method, Option, PrivacyClaim, Tunable, register
from dpclip.models import per_record_std
from dpclip.pretraining import PUBLIC_PRETRAINING

ENCODER_MODES = ("frozen", "joint")
ACCOUNTING = ("releases", "paper")
HEAD_FITS = ("class_means", "sgd")

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
    """z clipped to [0, C] (or [-C, C]); an activation that is not a number (a record of
    features near 3e38 overflows the encoder) counts as 0 and an infinite one as its bound, so
    every release stays in range: clamp alone passes NaN through, and one record made the
    released head partly NaN."""
    low = -clip if signed else 0.0
    return z.nan_to_num(nan=0.0, posinf=clip, neginf=low).clamp(low, clip)


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


def record_epsilon(sigma_eff: float, uses: int, delta: float, sample_rate: float = 1.0) -> float:
    """Epsilon of ``uses`` Gaussian releases of one record (multiplier sigma_eff), by RDP.
    ``sample_rate`` below 1 is the paper's accounting (each use a Poisson-subsampled step),
    which the shuffled batches of this run do not give: for ``accounting: paper`` only."""
    if uses == 0:
        return 0.0
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent  # on use

    rdp = compute_rdp(q=sample_rate, noise_multiplier=sigma_eff, steps=uses, orders=RDP_ORDERS)
    epsilon, _ = get_privacy_spent(orders=RDP_ORDERS, rdp=rdp, delta=delta)
    return float(epsilon)


def noise_for_record_epsilon(target_epsilon: float, delta: float, uses: int,
                             tolerance: float = 0.01, sample_rate: float = 1.0) -> float:
    """The smallest sigma_eff (within ``tolerance`` in epsilon) whose ``uses`` releases stay
    within the target: Opacus's search, at ``sample_rate`` (1: no amplification claimed)."""
    from opacus.accountants.utils import get_noise_multiplier  # on use: opacus loads slowly

    sigma = get_noise_multiplier(target_epsilon=target_epsilon, target_delta=delta,
                                 sample_rate=sample_rate, steps=uses, accountant="rdp",
                                 epsilon_tolerance=tolerance)
    if not math.isfinite(sigma) or \
            record_epsilon(sigma, uses, delta, sample_rate) > target_epsilon + 1e-9:
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



class ClassMeans:
    """The head as the nearest-class-mean classifier of the sanitized activations: per class,
    the sum and count of its releases so far; m_c = sum / (count (1 - p)), weight_c = m_c,
    bias_c = -|m_c|^2 / 2 (docs/methods.md, "`sanitize`: private features, public labels",
    ``head_fit``)."""

    def __init__(self, head: nn.Linear, keep_rate: float):
        self.head, self.keep_rate = head, keep_rate
        self.sums = torch.zeros_like(head.weight, dtype=torch.float64)
        self.counts = torch.zeros(head.out_features, dtype=torch.float64,
                                  device=head.weight.device)

    def step(self, sanitizer: nn.Module, features: torch.Tensor, y: torch.Tensor,
             loss_fn) -> float:
        """Release the batch's sanitized activations (``features``: the frozen encoder's output,
        the sanitizer's input), add them to the class sums, refit the head; returns the refitted
        head's loss on the released batch."""
        with torch.no_grad():
            released = sanitizer(features)
            self.sums.index_add_(0, y, released.to(torch.float64))
            self.counts += torch.bincount(y, minlength=len(self.counts)).to(torch.float64)
            seen = self.counts > 0
            means = torch.where(seen[:, None], self.sums / (self.counts[:, None].clamp(min=1)
                                                            * self.keep_rate), 0.0)
            bias = torch.where(seen, -0.5 * (means ** 2).sum(dim=1), -1e4)
            self.head.weight.copy_(means)
            self.head.bias.copy_(bias)
            return float(loss_fn(self.head(released), y).mean())

    def state_dict(self) -> dict:
        return {"sums": self.sums.clone(), "counts": self.counts.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.sums.copy_(state["sums"])
        self.counts.copy_(state["counts"])


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
        "public_steps": Option(PUBLIC_PRETRAINING.public_steps, low=1, integer=True,
                               help="frozen: most Adam steps of the public pre-training"),
        "public_patience": Option(PUBLIC_PRETRAINING.public_patience, low=1, integer=True,
                                  help="frozen: held-out checks without improvement before "
                                       "the pre-training stops (the best weights are kept)"),
        "public_check_every": Option(PUBLIC_PRETRAINING.public_check_every, low=1,
                                     integer=True,
                                     help="frozen: steps between held-out public checks"),
        "public_lr": Option(PUBLIC_PRETRAINING.public_lr, low=0.0, low_open=True,
                            help="frozen: Adam learning rate of the public pre-training"),
        "head_fit": Option("class_means", choices=HEAD_FITS,
                           help="frozen: class_means (nearest class mean of the sanitized "
                                "activations) | sgd (train.optimizer at head_lr, the paper's)"),
        "keep_public_head": Option("auto", choices=("auto", True, False),
                                   help="frozen: after the private phase keep the public "
                                        "pre-training's head instead when it is more accurate "
                                        "on the public holdout split (auto: on when the public "
                                        "split is of the same dataset, off with "
                                        "data.shadow_dataset)"),
        "epochs": Option(10, low=1, integer=True,
                         help="private epochs: each one releases every record once"),
        "accounting": Option("releases", choices=ACCOUNTING,
                             help="releases: each epoch releases every record once, no "
                                  "amplification (sound) | paper: Poisson amplification at "
                                  "q = B / N claimed for the shuffled batches (not a guarantee)"),
        "batch_size": Option(0, low=0, integer=True,
                             help="the method's own batch size (0: train.batch_size)"),
        "optimizer": Option("train", choices=("train", "sgd", "adam"),
                            help="the optimizer of the layers trained on private data (train: "
                                 "train.optimizer)"),
        "head_lr": Option(0.002, low=0.0, low_open=True,
                          help="head_fit sgd / joint: learning rate (train.optimizer) on the "
                               "sanitized activations"),
    }
    TUNED_OPTIONS = {"n": Tunable(2, 32, log=True, integer=True),
                     "clip": Tunable(0.1, 5.0, log=True)}

    @classmethod
    def resolved_options(cls, options, params):
        """keep_public_head ``auto``: on when the public holdout split is of the private
        task's dataset, off with a separate ``data.shadow_dataset`` (another task's accuracy
        cannot choose this task's head)."""
        options = options if options is not None else cls.options_model()()
        if options.keep_public_head != "auto":
            return options
        return options.model_copy(update={"keep_public_head": not params.data.shadow_dataset})

    @classmethod
    def params_problems(cls, options, params):
        """keep_public_head scores heads on the public holdout split, which only says anything
        of the private task when the public split is of the same dataset: set true with a
        separate public dataset, it is refused (``auto`` turns it off there). The
        sanitization layer goes after a layer of dpclip's own models: a ``train.model`` of the
        user's own is refused by name."""
        if params.train.model not in BUILT_IN_MODELS:
            return [bad_value("train.methods", cls.name,
                              f"puts its sanitization layer into one of dpclip's models "
                              f"({', '.join(BUILT_IN_MODELS)}), not into train.model "
                              f"{params.train.model!r}: leave it out of train.methods")]
        if (params.data.shadow_dataset and options.encoder == "frozen"
                and options.keep_public_head is True):
            return [bad_value(f"methods.{cls.name}.keep_public_head", True,
                              f"would choose the head on another dataset's task "
                              f"(data.shadow_dataset: {params.data.shadow_dataset}): set it "
                              f"auto or false")]
        return []

    @classmethod
    def tuning_space(cls, options, lr, clip_norm):
        """The width n and the activation clip C; not train.lr nor train.clip_norm, which this
        method's run never reads. The head's learning rate when a head is trained by SGD."""
        space = {f"methods.{cls.name}.{name}": t for name, t in cls.TUNED_OPTIONS.items()}
        if options.head_fit == "sgd" or options.encoder == "joint":
            space[f"methods.{cls.name}.head_lr"] = Tunable(lr.low / 100, lr.high / 100,
                                                           log=True)
        return space

    def __init__(self, context):
        super().__init__(context)
        self.clip_threshold = float(self.options.clip)

    @classmethod
    def privacy_claim(cls, options=None) -> PrivacyClaim:
        options = cls.typed_options(options)
        # joint: the encoder sees raw private features; paper accounting: amplification that
        # shuffled batches do not give. Either way the epsilon is not one the run gives.
        # The paper's accounting claims add/remove adjacency.
        return PrivacyClaim(options.encoder == "frozen" and options.accounting == "releases",
                            "add_remove" if options.accounting == "paper" else cls.adjacency)

    def data_use(self) -> dict[str, str]:
        encoder = ("the public shadow_train split (pre-trained without noise, stopped on the "
                   "public shadow_holdout split, then frozen)"
                   if self.options.encoder == "frozen" else
                   "members' raw features without noise (joint mode: no DP for the encoder)")
        clip = ("the sanitization layer's released weights (post-processing)"
                if self.options.adaptive else CONSTANT_CLIP)
        fit = ("class means of " if self.options.encoder == "frozen" and
               self.options.head_fit == "class_means" else "")
        return {"encoder": encoder,
                "head": f"{fit}members' sanitized activations (clipped, masked, noised per "
                        f"record) and their labels in the clear (public by the threat model)",
                "clip_threshold": clip}


def poisson_amplification(spec: dict) -> Check:
    """The sanitization layer's Table 2, an accounting check (``presets/claims.yaml``): the sigma
    at which the paper's ``epochs`` x ``records`` / ``batch_size`` Poisson-subsampled steps reach
    (``epsilon``, ``delta``), and the epsilon of ``epochs`` full-batch Gaussian releases at that
    sigma, which the mechanism gives (docs/methods.md, "`sanitize`: private features, public
    labels", ``accounting: paper``)."""
    records, batch, epochs, epsilon, delta = accounting_numbers(
        spec, "poisson_amplification", "records", "batch_size", "epochs", "epsilon", "delta")
    epochs = int(epochs)
    q = batch / records
    steps = int(epochs * records // batch)
    sigma = noise_for_record_epsilon(epsilon, delta, steps, sample_rate=q)
    amplified = record_epsilon(sigma, steps, delta, sample_rate=q)
    releases = record_epsilon(sigma, epochs, delta)
    return Check(epsilon, releases, releases <= epsilon * (1 + 1e-6), [
        f"the paper's accounting: {steps:,} Poisson-subsampled steps at q = {batch:g} / "
        f"{records:,.0f} = {q:.3g} reach epsilon {epsilon:g} at delta {delta:g} with sigma "
        f"{sigma:.4g} (Opacus RDP: {amplified:.3g}, so the paper's number is reproduced under "
        f"its own assumption)",
        f"the mechanism: shuffled batches release each record's features once per epoch, "
        f"{epochs} releases at sigma {sigma:.4g}; with nothing subsampled the RDP of {epochs} "
        f"Gaussian releases gives epsilon {releases:.3g} at delta {delta:g}, "
        f"{releases / epsilon:.3g} times the claim",
        "Poisson amplification needs each record to join each step independently with "
        "probability q; a shuffled epoch puts every record in exactly one batch, so the "
        "adversary knows a record's release is in the epoch's output"])


# the claims about this method's epsilon that need no runs (dpclip.reporting.accounting)
ACCOUNTING_CHECKS = {"poisson_amplification": poisson_amplification}
