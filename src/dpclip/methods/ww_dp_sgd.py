"""``ww_dp_sgd`` (Partohaghighi, Marcia, West and Chen, Algorithm 1): DP-SGD whose clip
threshold follows a spectral "health" signal of the weights.

Clipping is DP-SGD's. Every K steps the probe layer's eigenvalues of W^T W give a power-law tail
exponent zeta (``estimator``: ``loglog_topk``, the paper's, or ``mle_ks``); u = log C moves by
kappa sat((EMA(zeta) - zeta*) / r), and C = exp(u), optionally clamped. It reads only the
weights: post-processing. The update, the estimators and what is inferred from the paper:
docs/methods.md, "WW-DP-SGD: a controller on the weight spectrum".
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
    """Power-law tail exponent of an eigenvalue spectrum (the WeightWatcher convention): the
    continuous MLE alpha = 1 + n / sum_j log(lambda_j / lambda_min), lambda_min where the KS
    distance of the fit is smallest, keeping at least ``min_tail`` eigenvalues; a spectrum with
    fewer positive ones uses its top ``top_k`` (docs/methods.md, "WW-DP-SGD: a controller on
    the weight spectrum", ``mle_ks`` in full)."""
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
    """Tail exponent zeta of the density (p ~ lambda^-zeta): the Theil-Sen slope s of
    log lambda_(i) against log i over the top ``top_k`` eigenvalues gives zeta = 1 - 1 / s;
    s = 0 (no tail) gives inf (docs/methods.md, "WW-DP-SGD: a controller on the weight
    spectrum", what ``loglog_topk`` infers)."""
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
    """Eigenvalues of W^T W (= squared singular values of W) above n eps32 lambda_max, the
    float32 round-off, from the smaller Gram matrix in float32 (docs/methods.md, "WW-DP-SGD:
    a controller on the weight spectrum")."""
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
