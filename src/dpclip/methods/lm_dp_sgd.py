"""``lm_dp_sgd`` (Meng et al., Algorithm 1): layer-wise reweighted clipping that protects the
layers a shadow model found leakiest.

With C_i = min(C, n_i), layer l of record i becomes ghat_i^(l) = C_i w^(l) g_i^(l) / n_i^(l),
so with sum_l (w^(l))^2 = 1, ||ghat_i|| <= C_i <= C. w = normalize(w_base^(l) (ER^(l))^r),
w_base by ``weights``: ``private`` (a noisy, accounted query), ``public`` or ``batch``
(literal, no DP). docs/methods.md, "LM-DP-SGD and the layer-wise membership risk".
"""

from __future__ import annotations

import math

import numpy as np
import torch

from dpclip.claim_checks import Check, accounting_numbers
from dpclip.errors import DpclipError
from dpclip.methods.base import (Method, MethodContext, Option, PrivacyClaim, StepRelease,
                                 Tunable, register, rounded, total_norms)
from dpclip.privacy import ExtraQuery, noise_for_epsilon
from dpclip.randomness import NoiseSources

ER_FLOOR = 1e-3
WEIGHT_SOURCES = ("private", "public", "batch")


def risk_factors(error_rates, r: float) -> list[float]:
    """(ER^(l))^r, with ER floored at ``ER_FLOOR``."""
    return [max(float(e), ER_FLOOR) ** r for e in error_rates]


def layer_weights(base, error_rates, r: float) -> np.ndarray:
    """w = normalize(w_base * ER^r), unit L2 norm."""
    return np.array(_normalised([b * f for b, f in zip(base, risk_factors(error_rates, r))]))


def _normalised(raw: list[float]) -> list[float]:
    norm = math.sqrt(sum(v * v for v in raw))
    if not math.isfinite(norm) or norm <= 0:
        raise DpclipError(f"lm_dp_sgd: layer weights {raw} cannot be normalised")
    return [v / norm for v in raw]


def reweighted_factors(layer_norms: torch.Tensor, clip: float, weights: torch.Tensor,
                       totals: torch.Tensor | None = None) -> torch.Tensor:
    """s_i^(l) = min(C, n_i) w^(l) / max(n_i^(l), 1e-30)   (shape B x L).

    ``totals`` (n_i), when the caller has them already. Then ||s_i^(l) g_i^(l)|| =
    C_i w^(l) min(1, n_i^(l) / 1e-30) <= C_i w^(l): a zero block stays zero, and the bound
    ||ghat_i|| <= C_i holds for every block.
    """
    totals = total_norms(layer_norms) if totals is None else totals
    # in float64, rounded towards 0: a float32 or bfloat16 product exceeded C_i w^(l)
    wide = totals.double().clamp(max=clip)[:, None] * weights.double() / \
        layer_norms.double().clamp_min(1e-30)
    return rounded(wide, layer_norms.dtype, upward=False)


@register
class LMDPSGD(Method):
    name = "lm_dp_sgd"
    needs_shadow_risk = True
    OPTIONS = {
        "r": Option(2.0, low=1.0, help="emphasis on the layer-wise risk, r >= 1"),
        "weights": Option("private", choices=WEIGHT_SOURCES,
                          help="w_base: private (noisy, accounted) | public | batch (literal)"),
        "sigma_w_ratio": Option(5.0, low=1.0, low_open=True,
                                help="sigma_W / sigma for the private layer-share query"),
        "w_floor": Option(0.01, low=0.0, low_open=True,
                          help="floor of the private w_base (a noisy share can be <= 0)"),
    }
    TUNED_OPTIONS = {"r": Tunable(1.0, 5.0)}  # the paper uses 2 to 5

    def __init__(self, context):
        super().__init__(context)
        risk = context.shadow_risk
        if risk is None:
            raise DpclipError("lm_dp_sgd needs the shadow stage's per-layer risks")
        missing = [n for n in self.layer_names if n not in risk["layers"]]
        if missing:
            raise DpclipError(f"the shadow risk file has no layer(s) {missing}; the model has "
                              f"{self.layer_names}")
        self.error_rates = [float(risk["layers"][n]["error_rate"]) for n in self.layer_names]
        self.public_shares = [float(risk["layers"][n]["norm_share"]) for n in self.layer_names]
        self._risk = risk_factors(self.error_rates, self.options.r)
        self.source = self.options.weights
        self._set_weights(self.public_shares)

    @classmethod
    def privacy_claim(cls, options=None) -> PrivacyClaim:
        # batch: w_base from the members' norms of the batch, without noise
        return PrivacyClaim(cls.typed_options(options).weights != "batch", cls.adjacency)

    def data_use(self) -> dict[str, str]:
        base = {"private": "the noisy sum of members' per-layer norm shares (accounted)",
                "public": "the shadow model's per-layer norm shares on the public shadow split",
                "batch": "members' per-layer norms of the current batch, without noise (no DP)"}
        return {**super().data_use(),
                "layer_risk": "the shadow model's per-layer attacks on the public shadow splits",
                "layer_weights": base[self.source]}

    @property
    def weights(self) -> np.ndarray:
        return np.array(self._weights)

    def _set_weights(self, base) -> None:
        # the L-vectors are kept as Python floats: several times faster than numpy or torch for
        # a handful of numbers updated every step
        self._weights = _normalised([b * f for b, f in zip(base, self._risk)])
        self._weights_t = None  # converted to the norms' dtype and device on next use

    def _weights_like(self, layer_norms: torch.Tensor) -> torch.Tensor:
        if self._weights_t is None:
            self._weights_t = torch.tensor(self._weights, dtype=torch.float64,
                                           device=layer_norms.device)
        return self._weights_t

    def extra_queries(self, sigma_eff: float) -> list[ExtraQuery]:
        if self.source != "private":
            return []
        return [ExtraQuery("layer_shares", 1.0, self.options.sigma_w_ratio * sigma_eff,
                           option="methods.lm_dp_sgd.sigma_w_ratio")]

    def scale(self, layer_norms: torch.Tensor) -> torch.Tensor:
        totals = self.total_norms(layer_norms)
        if self.source == "batch" and len(layer_norms):  # the paper's rule: batch statistics
            ratios = layer_norms / totals.clamp(max=self.clip_threshold).clamp_min(1e-30)[:, None]
            ratios = ratios[torch.isfinite(totals)].nan_to_num(0.0, 0.0, 0.0)
            if len(ratios):
                self._set_weights(ratios.mean(dim=0).tolist())
        return reweighted_factors(layer_norms, self.clip_threshold,
                                  self._weights_like(layer_norms), totals)

    def release_extras(self, layer_norms: torch.Tensor, rng: NoiseSources) -> dict:
        """sum_i u_i + N(0, sigma_W^2 I_L), u_i = (n_i^(l) / n_i)_l (0 for a zero gradient, and
        for a record whose norm is not finite: it contributes nothing to the step either)."""
        if self.source != "private":
            return {}
        totals = self.total_norms(layer_norms).double()
        # summed in float64: the query's sensitivity 1 must hold with the rounding (a float32
        # sum of 4,096 shares moved by 1.0002, a bfloat16 one of 1,024 by 4.1)
        shares = (layer_norms.double() / totals.clamp_min(1e-30)[:, None]).nan_to_num(0.0, 0.0,
                                                                                      0.0)
        shares = torch.where(torch.isfinite(totals)[:, None], shares, 0.0).sum(dim=0)
        shares += torch.normal(0.0, self.options.sigma_w_ratio * self.sigma_eff,
                               size=shares.shape, generator=rng.noise, device=shares.device)
        return {"layer_shares": shares.tolist()}

    def update(self, release: StepRelease) -> None:
        if self.source == "private":
            batch, floor = self.context.expected_batch, self.options.w_floor
            self._set_weights([max(v / batch, floor) for v in release.extras["layer_shares"]])

    @classmethod
    def step_metrics(cls, columns) -> list[str]:
        return [c for c in columns if c.startswith("lm_w_")]  # one weight per layer

    def trace_row(self) -> dict:
        return {f"lm_w_{name}": w for name, w in zip(self.layer_names, self._weights)}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "weights": list(self._weights)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._weights = [float(w) for w in state["weights"]]
        self._weights_t = None


__all__ = ["LMDPSGD", "layer_weights", "reweighted_factors", "risk_factors"]


def _lm_sum(rows: list[list[float]], weights: str, batch: int):
    """lm_dp_sgd's reweighted, clipped sum (before noise) of records whose per-layer gradient
    norms are ``rows`` (C = 1), each layer's gradients along one direction: the sum's
    coefficient per layer's direction. Equal shadow error rates, so the risk factors cancel."""
    names = [f"layer{i + 1}" for i in range(len(rows[0]))]
    risk = {"layers": {n: {"error_rate": 0.5, "norm_share": 1.0} for n in names},
            "layer_names": names}
    method = LMDPSGD(MethodContext(1.0, names, expected_batch=float(batch),
                                   options=LMDPSGD.parse_options({"weights": weights}),
                                   shadow_risk=risk))
    norms = torch.tensor(rows, dtype=torch.float64)
    return (method.scale(norms) * norms).sum(dim=0)


def audit_ceiling(canaries: int, delta: float, confidence: float) -> float:
    """The largest epsilon a one-run audit with ``canaries`` canaries can refute: every guess
    right at each guess size the audit tries (:data:`dpclip.audit.bound.GUESS_FRACTIONS`, each
    at its Bonferroni share of ``confidence``), the best of them."""
    from dpclip.audit.bound import GUESS_FRACTIONS, epsilon_lower_bound

    each = 1.0 - (1.0 - confidence) / len(GUESS_FRACTIONS)
    sizes = {max(1, min(canaries, round(f * canaries))) for f in GUESS_FRACTIONS}
    return max(epsilon_lower_bound(canaries, r, r, delta, each) for r in sizes)


def spanning_canaries(audit: dict) -> int:
    """How many white-box canaries spanning every layer group fit in the model ``audit``
    describes (one distinct coordinate per group each): the smallest group's size, at most
    ``audit["canaries"]`` (:func:`dpclip.audit.run.canaries_that_fit`)."""
    return min(int(audit["canaries"]), min(_layer_sizes(audit)))


def _layer_sizes(audit: dict) -> list[int]:
    """Trainable coordinates of each layer group (the parameterised layers) of the model."""
    from dpclip.models import build_model, parameterised_layers

    model = build_model(audit["model"], tuple(audit["features"]), int(audit["classes"]),
                        list(audit["hidden"]))
    modules = dict(model.named_modules())
    return [sum(p.numel() for p in modules[name].parameters(recurse=False) if p.requires_grad)
            for name in parameterised_layers(model)]


def _audit_power_line(audit: dict, epsilon: float, delta: float) -> str:
    canaries, smallest = spanning_canaries(audit), min(_layer_sizes(audit))
    confidence = float(audit["confidence"])
    ceiling = audit_ceiling(canaries, delta, confidence)
    verdict = ("so no outcome of that audit could show the leakage: a run at the claimed "
               "epsilon passes it whatever it leaks" if ceiling <= epsilon else
               f"so the audit can refute the claimed epsilon, but only with guesses right "
               f"far more often than epsilon {epsilon:g} allows: nearly all of them as the "
               f"ceiling nears it")
    fit = (f"{canaries} (the smallest layer's coordinates)" if canaries == smallest else
           f"{canaries} (audit.canaries; the smallest layer has {smallest} coordinates)")
    return (f"whether the one-run audit could measure it: in the {audit['model']} model "
            f"(hidden {list(audit['hidden'])}) canaries spanning every layer fit {fit}; the "
            f"audit gives a per-layer rule those, since one-layer canaries are clipped below "
            f"C. With every guess right they refute at most epsilon {ceiling:.3g} at "
            f"{confidence:.1%} against the claimed {epsilon:g}, {verdict}")


def batch_weights_sensitivity(spec: dict) -> Check:
    """LM-DP-SGD's literal rule (Theorem 5.1), an accounting check (``presets/claims.yaml``):
    how far one record (gradient norm ``outlier_norm`` C in layer 2) moves the sum of
    ``batch_size`` records in layer 1 when the weights come from the batch, against the C the
    proof assumes; with ``audit`` (``model``, ``hidden``, ``features``, ``classes``,
    ``canaries``, ``confidence``), also :func:`audit_ceiling` of the canaries that fit.
    docs/methods.md, "LM-DP-SGD and the layer-wise membership risk", "The method"."""
    batch, epsilon, delta, q, steps = accounting_numbers(
        spec, "batch_weights_sensitivity", "batch_size", "epsilon", "delta", "sample_rate", "steps")
    batch, steps = int(batch), int(steps)
    outlier = float(spec.get("outlier_norm", 1e6))
    members, added = [[1.0, 0.0]] * batch, [[0.0, outlier]]
    moved = {rule: float((_lm_sum(members + added, rule, batch)
                          - _lm_sum(members, rule, batch)).norm())
             for rule in ("batch", "private")}
    kappa = moved["batch"]
    sigma = noise_for_epsilon(epsilon, delta, q, steps, "rdp")
    holds = kappa <= 1 + 1e-9
    return Check(epsilon, epsilon if holds else math.inf, holds, [
        "the proof's premise: each record's reweighted, clipped gradient has norm at most C, "
        "so one record moves the sum by at most C",
        f"the pair: {batch} records with gradients in layer 1 only (norms (C, 0)), and the "
        f"same with one record more whose gradient lies in layer 2 (norms (0, {outlier:g} C)); "
        f"the weights from the batch go from (1, 0) to about (0, 1), so the {batch} records' "
        f"part of the sum shrinks to almost nothing",
        f"lm_dp_sgd's own sums (weights: batch): the record moves the sum by {kappa:.4g} C; "
        f"with weights: private (weights fixed before the step, from the previous step's "
        f"noisy release) the same pair moves it by {moved['private']:.4g} C",
        f"DP-SGD's accountant at epsilon {epsilon:g}, delta {delta:g}, q = {q:.4g}, "
        f"{steps:,} steps sets sigma {sigma:.4g}: noise of std {sigma:.3g} C against a shift of "
        f"{kappa:.4g} C, a ratio of {kappa / sigma:.3g} where the accountant assumes "
        f"{1 / sigma:.3g}; since a Poisson batch can hold any number of records, no sensitivity "
        f"bound in C, and so no epsilon, follows for the literal rule",
        *([_audit_power_line(spec["audit"], epsilon, delta)] if spec.get("audit") else [])],
        summary=None if holds else (
            f"one record moves the noised sum by {kappa:.4g} C in a batch of {batch}, not at "
            f"most C (the proof's premise), so DP-SGD's accountant gives no epsilon for it; "
            f"the paper claims {epsilon:g}"))


# the claims about this method's epsilon that need no runs (dpclip.reporting.accounting)
ACCOUNTING_CHECKS = {"batch_weights_sensitivity": batch_weights_sensitivity}
