"""``ww_dp_sgd`` (Partohaghighi, Marcia, West and Chen, "When Gradient Clipping Becomes a
Control Mechanism for Differential Privacy in Deep Learning", Algorithm 1): DP-SGD whose clip
threshold follows a spectral "health" signal of the weights.

Clipping is DP-SGD's, s_i = min(1, C_t / n_i). Every K steps the probe layer's weight matrix W
(Linear as is; Conv reshaped to C_out x (C_in kh kw)) gives eigenvalues lambda_j = s_j^2 of
W^T W and a power-law tail exponent zeta (:func:`tail_exponent`); with several probe layers,
the median. Then

    zeta_hat <- beta zeta_hat + (1 - beta) zeta        (zeta_hat starts at zeta*)
    u        <- u + kappa sat((zeta_hat - zeta*) / r), sat(x) = max(-1, min(1, x))
    C        <- exp(u), optionally clamped to [C_min, C_max]       (u starts at log C_0)

The controller reads only weights, which are already DP-released: post-processing, no extra
privacy cost (and the clamp, too, is post-processing).

The exponent has two estimators (option ``estimator``):

* ``loglog_topk`` (the default, the paper's): :func:`tail_exponent_loglog`, a robust
  regression in log-log coordinates on the top ``top_k`` eigenvalues.
* ``mle_ks``: :func:`tail_exponent`, the continuous power-law maximum likelihood with
  lambda_min chosen by a Kolmogorov-Smirnov distance (the WeightWatcher package's own rule;
  every result committed before the paper's estimator was added ran this one).

What the paper states (section 3.1): p(lambda) ~ lambda^-zeta for lambda >= lambda_min, and "in
practice, the fit is performed on the largest eigenvalues (e.g., top-k or those exceeding a
threshold) using robust regression in log-log coordinates". Section 3.2.1: lambda_min "selected
via a goodness-of-fit criterion (e.g., KS-based cutoff) or a fixed top-k rule in small-matrix
regimes; the exact protocol is reported in the experimental setup". Section 5.5 (the
experimental setup): "tail fitting using a fixed rule (e.g., top-k eigenvalues)". It states no
k, names no regression and does not say which log-log plot is fitted.

What is inferred here (each one a choice the paper leaves open):

* the plot: the rank plot of the top k, log lambda_(i) against log i (lambda_(1) the largest).
  A density p ~ lambda^-zeta has survival S ~ lambda^-(zeta - 1) and the i-th largest of n
  sits near S = i / n, so log lambda_(i) = c - log(i) / (zeta - 1): a slope s gives
  zeta = 1 - 1 / s. A histogram of the density is not fitted: 10 to 32 eigenvalues (the paper
  CNN's fc1 and head) fill too few bins.
* the robust regression: Theil-Sen (:func:`scipy.stats.theilslopes`), the median of the pairwise
  slopes. A pair's slope in the other orientation (log i against log lambda) is the reciprocal,
  so with an odd number of pairs the estimate does not depend on which axis is regressed.
  Plotting positions i (not i - 1/2): on Pareto samples Theil-Sen is then median-unbiased
  (k = 32 of 1,000 draws at zeta 4: median 3.98; with i - 1/2: 4.16).
* k = 10 (``top_k``), capped at the number of eigenvalues: the head of the paper CNN (10 x 32)
  gives 10, all fitted; fc1 (32 x 512) gives 32, the top 10 fitted. 10 is the tail size the
  ``mle_ks`` estimator falls back to and the fewest it lets a KS-chosen tail keep.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from torch import nn

from dpclip.errors import DpclipError
from dpclip.models import last_hidden_linear
from dpclip.methods.base import Method, Option, StepRelease, Tunable, clip_factors, register


def tail_exponent(eigenvalues: np.ndarray, min_tail: int = 10, top_k: int = 10) -> float:
    """Power-law tail exponent of an eigenvalue spectrum (the WeightWatcher convention).

    For each candidate lambda_min, the continuous power-law MLE over lambda_j >= lambda_min is
        alpha = 1 + n / sum_j log(lambda_j / lambda_min),
    and lambda_min is chosen where the Kolmogorov-Smirnov distance between the tail's empirical
    CDF and the fitted CDF 1 - (x / lambda_min)^(1 - alpha) is smallest (Clauset, Shalizi and
    Newman 2009). Candidates keep at least ``min_tail`` eigenvalues; when the spectrum has fewer
    than ``min_tail`` positive eigenvalues, the top ``top_k`` are used with lambda_min the
    smallest of them.
    """
    x = np.sort(np.asarray(eigenvalues, dtype=np.float64))
    x = x[x > x.max() * 1e-12] if x.size else x
    n = x.size
    if n < 2:
        raise ValueError(f"need at least 2 positive eigenvalues, got {n}")
    if n < min_tail:
        tail = x[-min(top_k, n):]
        return _mle(tail, tail[0])
    # every candidate lambda_min = x[i] at once: rows are candidates, columns eigenvalues
    logs = np.log(x)
    starts = np.arange(0, n - min_tail + 1)
    sizes = (n - starts).astype(np.float64)                 # m_i, tail sizes
    suffix = np.cumsum(logs[::-1])[::-1]                    # sum_{j >= i} log x_j
    spread = suffix[starts] - sizes * logs[starts]          # sum_j log(x_j / x_i)
    with np.errstate(divide="ignore", invalid="ignore"):
        alphas = np.where(spread > 0, 1.0 + sizes / spread, np.inf)
    slope = np.where(np.isfinite(alphas), 1.0 - alphas, 0.0)
    # fitted survival S_ij = (x_j / x_i)^(1 - alpha_i). Just below and at x_j the empirical
    # survival is R_j / m_i and (R_j - 1) / m_i, R_j = n - j, so the KS gap at x_j is
    # max(|S_ij - R_j/m_i|, |S_ij - (R_j - 1)/m_i|) = |S_ij - (R_j - 1/2)/m_i| + 1/(2 m_i).
    # the n x n part runs in torch: its exp is vectorised and threaded
    t_slope, t_logs = torch.from_numpy(slope), torch.from_numpy(logs)
    gap = torch.outer(t_slope, t_logs)
    gap -= (t_slope * t_logs[starts])[:, None]
    gap.exp_()
    gap -= torch.outer(torch.from_numpy(1.0 / sizes), torch.arange(n, 0, -1, dtype=torch.float64) - 0.5)
    gap.abs_()
    gap.masked_fill_(torch.arange(n)[None, :] < torch.from_numpy(starts)[:, None], 0.0)
    distance = gap.amax(dim=1).numpy() + 0.5 / sizes      # 0 outside candidate i's tail
    distance[~np.isfinite(alphas)] = np.inf                 # no spread: no tail to fit
    return float(alphas[int(np.argmin(distance))])


ESTIMATORS = ("loglog_topk", "mle_ks")  # the paper's (default), and the MLE with a KS cut


def tail_exponent_loglog(eigenvalues: np.ndarray, top_k: int = 10) -> float:
    """Power-law tail exponent zeta of the density (p ~ lambda^-zeta) by a Theil-Sen regression
    on the rank plot of the top ``top_k`` eigenvalues (the paper's section 3.1 rule; what it
    states and what is inferred: the module's docstring).

    With lambda_(1) >= ... >= lambda_(k) the largest, the slope s of log lambda_(i) against
    log i (the median of the pairwise slopes) gives zeta = 1 - 1 / s. Eigenvalues all equal
    (s = 0: no tail) give inf, as the MLE does on a spectrum without spread.
    """
    from scipy.stats import theilslopes  # on use: scipy.stats loads slowly

    x = np.sort(np.asarray(eigenvalues, dtype=np.float64))[::-1]
    x = x[x > x[0] * 1e-12] if x.size else x
    if x.size < 2:
        raise ValueError(f"need at least 2 positive eigenvalues, got {x.size}")
    tail = x[:min(int(top_k), x.size)]
    slope = float(theilslopes(np.log(tail), np.log(np.arange(1, tail.size + 1)))[0])
    return 1.0 - 1.0 / slope if slope < 0 else math.inf


def _mle(tail: np.ndarray, x_min: float, log_tail: np.ndarray | None = None) -> float:
    log_tail = np.log(tail) if log_tail is None else log_tail
    total = float(np.sum(log_tail - math.log(x_min)))
    return 1.0 + tail.size / total if total > 0 else math.inf


def probe_matrix(module: nn.Module) -> torch.Tensor:
    """A layer's weight as a 2-D matrix: Linear as is, Conv as C_out x (C_in kh kw)."""
    weight = module.weight.detach()
    return weight.reshape(weight.shape[0], -1)


def spectrum(module: nn.Module) -> np.ndarray:
    """Eigenvalues of W^T W (= squared singular values of W) above float32 round-off.

    They come from the smaller of the Gram matrices W^T W and W W^T, which share the non-zero
    ones, in the weights' float32 (cheaper than an SVD or float64). Eigenvalues below n * eps32 * lambda_max are round-off, not spectrum, and are
    dropped.
    """
    w = probe_matrix(module).float().cpu()
    gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
    # torch's LAPACK, not scipy's: a second BLAS thread pool would fight torch's for the cores
    values = torch.linalg.eigvalsh(gram).numpy().astype(np.float64)
    floor = len(values) * np.finfo(np.float32).eps * max(float(values[-1]), 0.0)
    return values[values > floor]


MAX_LOG_C = 700.0  # exp overflows a float beyond about 709


@register
class WWDPSGD(Method):
    name = "ww_dp_sgd"
    controller_data = "the released weights of the probe layer (post-processing)"
    OPTIONS = {
        "zeta_star": Option(4.0, low=1.0, low_open=True, help="zone centre zeta*"),
        "r": Option(2.0, low=0.0, low_open=True, help="zone radius"),
        "beta": Option(0.98, low=0.0, high=1.0, high_open=True, help="EMA factor"),
        "kappa": Option(0.05, low=0.0, help="controller gain (log C per probe); 0: the clamp "
                                             "alone moves C (an ablation)"),
        "probe_every": Option(50, low=1, integer=True, help="K: probe period in steps"),
        "probe": Option("fc1", help="probe layer(s), comma-separated; median of exponents"),
        "clamp": Option(True, help="clamp C to [c_min, c_max]"),
        "anti_windup": Option(True, help="set u back to log C after the clamp acts (ours); "
                                         "false: the paper's Algorithm 1, which clamps C only"),
        "c_min": Option(0.1, low=0.0, low_open=True),
        "c_max": Option(10.0, low=0.0, low_open=True),
        "estimator": Option("loglog_topk", choices=ESTIMATORS,
                            help="tail exponent: loglog_topk (the paper's section 3.1: Theil-Sen "
                                 "on the rank plot of the top_k eigenvalues) or mle_ks (power-law "
                                 "MLE, lambda_min by KS distance; the results committed before)"),
        "min_tail": Option(10, low=2, integer=True,
                           help="mle_ks: fewest eigenvalues a KS-chosen tail may keep"),
        "top_k": Option(10, low=2, integer=True,
                        help="loglog_topk: eigenvalues fitted; mle_ks: the tail of spectra "
                             "smaller than min_tail"),
    }
    # dpclip tune: the gain and the zone (train.clip_norm is C_0)
    TUNED_OPTIONS = {"kappa": Tunable(0.01, 0.3, log=True), "zeta_star": Tunable(2.0, 6.0),
                     "r": Tunable(0.5, 3.0)}

    STEP_METRICS = ("ww_zeta", "ww_zeta_ema", "ww_signal", "ww_clamp_hits_min",
                    "ww_clamp_hits_max", "ww_probe_norm")

    @classmethod
    def check_options(cls, values, prefix: str, layer_names: list[str]) -> list[str]:
        problems = []
        if values.c_min >= values.c_max:
            problems.append(f"{prefix}.c_min: {values.c_min!r} must be below "
                            f"{prefix}.c_max ({values.c_max!r})")
        default = cls.options_model().model_fields["probe"].default
        for name in probe_layers(values.probe) if layer_names is not None else []:
            # the default names no layer of a model without it: the run probes the model's
            # last hidden Linear instead, or refuses to start
            if name not in layer_names and values.probe != default:
                problems.append(f"{prefix}.probe: {name!r} is not a layer of the model "
                                f"(layers: {layer_names})")
        return problems

    def __init__(self, context):
        super().__init__(context)
        opts = self.options
        modules = dict(context.model.named_modules()) if context.model is not None else {}
        names = probe_layers(opts.probe)
        default = self.options_model().model_fields["probe"].default
        if names == [default] and default not in modules and context.model is not None:
            # a model of the user's own: its last hidden Linear, the default's counterpart
            names = [n for n in [last_hidden_linear(context.model)] if n] or names
        missing = [name for name in names if name not in modules]
        if context.model is not None and missing:  # else the controller would never act
            raise DpclipError(f"methods.ww_dp_sgd.probe: {missing} not layers of the model "
                              f"(layers: {context.layer_names}); name the layer(s) whose "
                              f"weights the controller reads")
        self.probes = [modules[name] for name in names if name in modules]
        self.log_c = math.log(self.clip_threshold)
        self.zeta_hat = opts.zeta_star
        self.zeta = math.nan
        self.probe_norm = math.nan  # Frobenius norm of the probed weights (median over probes)
        self.signal = 0.0
        self.clamp_hits = {"min": 0, "max": 0}
        self.probe_seconds = 0.0
        self._probed = False

    def scale(self, layer_norms: torch.Tensor) -> torch.Tensor:
        return clip_factors(layer_norms, self.clip_threshold)

    def update(self, release: StepRelease) -> None:
        self._probed = release.step % self.options.probe_every == 0
        if self._probed:
            tic = time.perf_counter()
            self.control(self.measure())
            self.probe_seconds += time.perf_counter() - tic

    def measure(self) -> float:
        """zeta of the probe layers now (median over several). Also keeps the probed weights'
        norm: noise the step adds grows it, and with it zeta (the feedback the trace shows)."""
        spectra = [spectrum(m) for m in self.probes]
        self.probe_norm = float(np.median([math.sqrt(values.sum()) for values in spectra]))
        return float(np.median([self.exponent(values) for values in spectra]))

    def exponent(self, eigenvalues: np.ndarray) -> float:
        """zeta of one spectrum by the configured estimator."""
        opts = self.options
        if opts.estimator == "loglog_topk":
            return tail_exponent_loglog(eigenvalues, opts.top_k)
        return tail_exponent(eigenvalues, opts.min_tail, opts.top_k)

    def control(self, zeta: float) -> None:
        """One controller update from a measured exponent (Algorithm 1, lines 16-21)."""
        opts = self.options
        self.zeta = zeta
        if math.isfinite(zeta):
            self.zeta_hat = opts.beta * self.zeta_hat + (1 - opts.beta) * zeta
        error = (self.zeta_hat - opts.zeta_star) / opts.r
        self.signal = max(-1.0, min(1.0, error))
        self.log_c += opts.kappa * self.signal
        c = math.exp(min(self.log_c, MAX_LOG_C))  # u may wind far without anti-windup
        if opts.clamp:
            if c < opts.c_min:
                c, self.clamp_hits["min"] = opts.c_min, self.clamp_hits["min"] + 1
            elif c > opts.c_max:
                c, self.clamp_hits["max"] = opts.c_max, self.clamp_hits["max"] + 1
            if opts.anti_windup:  # u follows the clamped C; else u winds on (Algorithm 1)
                self.log_c = math.log(c)
        self.clip_threshold = c

    def probe_cost(self) -> dict:
        return {"every": self.options.probe_every, "seconds": self.probe_seconds}

    def trace_row(self) -> dict:
        return {"ww_zeta": self.zeta if self._probed else math.nan, "ww_zeta_ema": self.zeta_hat,
                "ww_signal": self.signal, "ww_clamp_hits_min": self.clamp_hits["min"],
                "ww_clamp_hits_max": self.clamp_hits["max"],
                "ww_probe_norm": self.probe_norm if self._probed else math.nan}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "log_c": self.log_c, "zeta_hat": self.zeta_hat,
                "zeta": self.zeta, "signal": self.signal, "clamp_hits": dict(self.clamp_hits),
                "probe_seconds": self.probe_seconds}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.log_c, self.zeta_hat = state["log_c"], state["zeta_hat"]
        self.zeta, self.signal = state["zeta"], state["signal"]
        self.clamp_hits, self.probe_seconds = dict(state["clamp_hits"]), state["probe_seconds"]


def probe_layers(spec: str) -> list[str]:
    return [name.strip() for name in str(spec).split(",") if name.strip()]
