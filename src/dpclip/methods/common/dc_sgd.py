"""DC-SGD's shared part (Wei et al. 2025, arXiv 2503.22988): the noisy
histogram of per-sample gradient norms and the two threshold rules read from it. The methods
``dc_sgd_p`` and ``dc_sgd_e`` (one module each) pick a rule; see :mod:`dpclip.methods.dc_sgd_p`
for the mechanism.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch

from dpclip.claim_checks import Check, accounting_numbers
from dpclip.methods.base import Method, Option, StepRelease, Tunable, clip_factors
from dpclip.privacy import (ExtraQuery, combined_sigma, epsilon_of, noise_for_epsilon,
                            split_sigma)
from dpclip.randomness import NoiseSources


def norm_histogram(norms: torch.Tensor, bins: int, b_max: float) -> np.ndarray:
    """Counts (float64) of ``norms`` in H equal bins on [0, b_max]; norms >= b_max go to the
    last bin, and so do non-finite ones (a record whose gradient overflowed, which contributes
    nothing to the sum): each record adds 1 to exactly one bin, whatever its norm, so no
    record can stop the run. B and H are tiny: numpy is several times faster than torch on
    them (no per-op dispatch), and this runs every step."""
    scaled = norms.detach().cpu().numpy().astype(np.float64) * (bins / b_max)
    # clipped before the cast: a norm above ~1.8e19 cast to an integer would wrap around
    scaled = np.clip(np.nan_to_num(scaled, nan=bins, posinf=bins), 0, bins - 1)
    index = scaled.astype(np.intp)
    return np.bincount(index, minlength=bins).astype(np.float64)


def percentile_threshold(noisy_counts, b_max: float, p: float) -> float | None:
    """Upper edge of the first bin whose cumulative share of the noisy mass reaches p."""
    cumulative = np.cumsum(np.asarray(noisy_counts, dtype=np.float64))
    total = cumulative[-1]
    if total <= 0:
        return None
    first = int(np.searchsorted(cumulative, (p - 1e-12) * total))
    return (first + 1) * b_max / len(cumulative)


@lru_cache(maxsize=16)
def _bin_geometry(bins: int, b_max: float) -> tuple[np.ndarray, np.ndarray]:
    """Candidate edges C_j = j * b_max / H and the bias matrix max(m_k - C_j, 0)^2 (j x k).

    Both depend only on (H, b_max), so they are built once, not every step.
    """
    width = b_max / bins
    mids = (np.arange(bins) + 0.5) * width
    candidates = np.arange(1, bins + 1) * width
    bias = np.maximum(mids[None, :] - candidates[:, None], 0.0) ** 2
    candidates.flags.writeable = bias.flags.writeable = False
    return candidates, bias


def error_threshold(noisy_counts, b_max: float, sigma_train: float, n_params: int,
                    expected_batch: float) -> float | None:
    """The bin edge C minimising noise variance plus clipping bias on the noisy histogram."""
    counts = np.asarray(noisy_counts, dtype=np.float64)
    total = counts.sum()
    if total <= 0:
        return None
    candidates, bias = _bin_geometry(len(counts), float(b_max))
    variance = (sigma_train ** 2 * n_params / expected_batch ** 2) * candidates ** 2
    return float(candidates[int(np.argmin(variance + bias @ counts / total))])


class DynamicClipping(Method):
    """DC-SGD's common part: DP-SGD clipping, the noisy histogram of the batch's norms as an
    extra query, and C_{t+1} = :meth:`next_threshold` of the noisy histogram."""

    controller_data = "the noisy histogram of members' gradient norms (accounted)"
    OPTIONS = {
        "bins": Option(20, low=2, integer=True, help="H, histogram bins"),
        "b_max": Option(5.0, low=0.0, low_open=True, help="histogram range [0, b_max]"),
        "sigma_h_ratio": Option(5.0, low=1.0, low_open=True,
                                help="sigma_H / sigma (histogram noise over overall noise)"),
        "hist_every": Option(50, low=1, integer=True,
                             help="trace the noisy histogram every this many steps"),
    }
    # train.clip_norm is C_0, the threshold before the first histogram
    TUNED_OPTIONS = {"sigma_h_ratio": Tunable(2.0, 20.0, log=True)}

    def __init__(self, context):
        super().__init__(context)
        self._hist_row: dict = {}

    def extra_queries(self, sigma_eff: float) -> list[ExtraQuery]:
        return [ExtraQuery("hist", 1.0, self.options.sigma_h_ratio * sigma_eff,
                           option=f"methods.{self.name}.sigma_h_ratio")]

    def scale(self, layer_norms: torch.Tensor) -> torch.Tensor:
        return clip_factors(layer_norms, self.clip_threshold, self.total_norms(layer_norms))

    def release_extras(self, layer_norms: torch.Tensor, rng: NoiseSources) -> dict:
        """max(c_k + N(0, sigma_H^2), 0) for the counts c_k of ``norm_histogram``'s bins."""
        bins = self.options.bins
        std = self.options.sigma_h_ratio * self.sigma_eff
        noisy = torch.normal(0.0, std, size=(bins,), dtype=torch.float64,
                             generator=rng.extras).numpy()
        noisy += norm_histogram(self.total_norms(layer_norms), bins, self.options.b_max)
        return {"hist": np.maximum(noisy, 0.0, out=noisy)}

    def update(self, release: StepRelease) -> None:
        noisy = release.extras["hist"]
        new = self.next_threshold(noisy)
        if new is not None:
            self.clip_threshold = new
        self._hist_row = {}
        if release.step % self.options.hist_every == 0:
            self._hist_row = {"noisy_histogram": ";".join(f"{c:.2f}" for c in noisy.tolist())}

    def next_threshold(self, noisy_counts: torch.Tensor) -> float | None:
        raise NotImplementedError

    def trace_row(self) -> dict:
        row, self._hist_row = self._hist_row, {}
        return row


def noise_split(spec: dict) -> Check:
    """DC-SGD's noise split, an accounting check (``presets/claims.yaml``): the gradient sum and
    the histogram on one Poisson batch are one Gaussian mechanism at sigma =
    (sigma_T^-2 + sigma_H^-2)^(-1/2), so the split step costs a DP-SGD step at sigma; it splits,
    recombines and compares (docs/methods.md, "DC-SGD: the sigma split")."""
    epsilon, delta, q, steps, ratio = accounting_numbers(
        spec, "noise_split", "epsilon", "delta", "sample_rate", "steps", "sigma_h_ratio")
    steps = int(steps)
    sigma = noise_for_epsilon(epsilon, delta, q, steps, "rdp")
    histogram = [ExtraQuery("histogram", 1.0, ratio * sigma)]
    sigma_t = split_sigma(sigma, histogram)
    recombined = combined_sigma(sigma_t, histogram)
    joint = epsilon_of("rdp", [(recombined, q, steps)], delta)
    dp_sgd = epsilon_of("rdp", [(sigma, q, steps)], delta)
    separate = epsilon_of("rdp", [(sigma_t, q, steps), (ratio * sigma, q, steps)], delta)
    holds = math.isclose(recombined, sigma, rel_tol=1e-9) and joint <= epsilon * (1 + 1e-6)
    return Check(epsilon, joint, holds, [
        f"DP-SGD at epsilon {epsilon:g}, delta {delta:g}, q = {q:.4g}, {steps:,} steps: sigma "
        f"{sigma:.4g} (epsilon {dp_sgd:.4g})",
        f"the split with sigma_H = {ratio:g} sigma = {ratio * sigma:.4g}: sigma_T = "
        f"(sigma^-2 - sigma_H^-2)^-1/2 = {sigma_t:.4g}; recombined, (sigma_T^-2 + "
        f"sigma_H^-2)^-1/2 = {recombined:.6g}, so each step is DP-SGD's step: epsilon "
        f"{joint:.4g}",
        f"for comparison, two independently subsampled mechanisms at sigma_T and sigma_H would "
        f"compose to epsilon {separate:.4g}; that is no bound here, since both queries read the "
        f"same Poisson batch (composition needs independent randomness), so the joint "
        f"analysis above is the one that applies"])
