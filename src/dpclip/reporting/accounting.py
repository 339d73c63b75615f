"""Claims about privacy accounting, checked by computation instead of runs.

Some of the papers' claims are about the epsilon itself, not about what training buys. Each
check here redoes a paper's accounting with the project's own accountant (Opacus's RDP) and the
accounting of the mechanism the paper describes, and says whether the claimed epsilon is one
that mechanism gives. A check takes the claim's ``accounting`` mapping from
``presets/claims.yaml`` and returns a :class:`~dpclip.reporting.checks.Check`;
:func:`dpclip.reporting.evidence.judge` turns it into the verdict "held by the accounting" or
"contradicted by the accounting".

* ``poisson_amplification`` (the sanitization layer, Table 2): the paper accounts its
  ``epochs`` passes over ``records`` in batches of ``batch_size`` as that many Poisson-subsampled
  steps at q = batch_size / records, which gives (``epsilon``, ``delta``) at some sigma. Its
  batches are shuffled partitions: each epoch releases every record's sanitized features once,
  in the one batch that holds it, so no record is protected by the chance of not being sampled.
  The mechanism is ``epochs`` Gaussian releases of each record at that sigma (sensitivity 1 in
  units of sigma), whose epsilon is the RDP of ``epochs`` full-batch Gaussian mechanisms:
  the same function the sanitize runs report as ``epsilon_of_the_releases``.
* ``noise_split`` (DC-SGD): a step that releases the clipped gradient sum (sensitivity C, noise
  std sigma_T C) and a histogram of the batch's gradient norms (sensitivity 1, noise std
  sigma_H) on the same Poisson batch is one sampled Gaussian mechanism with multiplier
  sigma = (sigma_T^-2 + sigma_H^-2)^(-1/2): scale each query by its noise std and the two are
  one query of sensitivity sqrt(sigma_T^-2 + sigma_H^-2) with unit isotropic noise. So with
  sigma_T = (sigma^-2 - sigma_H^-2)^(-1/2) the step costs what a DP-SGD step at sigma costs,
  and T steps the epsilon of DP-SGD's T steps. The check computes sigma for the target, splits
  it, recombines it, and gives both epsilons, beside what accounting the two queries as
  separate mechanisms would charge.
* ``batch_weights_sensitivity`` (LM-DP-SGD's literal rule, Theorem 5.1): the proof bounds the
  sum's sensitivity by C because each record's reweighted gradient has norm C_i <= C, with
  weights w_base^(l) = mean_i n_i^(l) / C_i taken from the batch itself. But one record changes
  w, and w scales every other record's contribution. The check builds the pair: ``batch_size``
  records whose gradients lie in layer 1 (n_i = (C, 0), one direction u_1), and the same batch
  with one record more whose gradient lies in layer 2 (n = (0, M C), M = ``outlier_norm``).
  Before, w = (1, 0) and the sum is B C u_1; after, w = (B, M) / ||(B, M)||, so the B
  records' part shrinks to B C w_1 u_1 and the sum moves by
  C sqrt(B^2 (1 - w_1)^2 + w_2^2), about B C for large M: the sensitivity is not C, and
  since a Poisson batch can hold any number of records, it has no bound in C at all: DP-SGD's
  accountant gives the mechanism no epsilon. The sums are the method's own
  (``lm_dp_sgd``'s ``scale`` with ``weights: batch``); the same pair under ``weights:
  private`` moves the sum by at most C. With ``audit`` (a model: ``model``, ``hidden``,
  ``features``, ``classes``; the audit's ``canaries``, and ``confidence`` of the white-box kind:
  0.95 when it runs alone, the default, 0.975 beside the black-box kind) the check also
  says whether the one-run audit could measure the extra leakage at all: a per-layer rule's
  white-box canaries span every layer group (docs: the privacy audit), so at most as many fit as
  the smallest group has coordinates, and even with every guess right the audit refutes no
  epsilon above :func:`audit_ceiling` of that many canaries.
"""

from __future__ import annotations

import math

from dpclip.errors import DpclipError
from dpclip.reporting.checks import Check, positive_number


def _number(spec: dict, key: str, check: str) -> float:
    return positive_number(spec, key, f"accounting check {check!r}")


def poisson_amplification(spec: dict) -> Check:
    """The paper's Poisson-amplified epsilon against the epsilon of the releases its shuffled
    epochs make (module docstring)."""
    from dpclip.methods.sanitize import noise_for_record_epsilon, record_epsilon

    name = "poisson_amplification"
    records, batch = _number(spec, "records", name), _number(spec, "batch_size", name)
    epochs, epsilon = int(_number(spec, "epochs", name)), _number(spec, "epsilon", name)
    delta = _number(spec, "delta", name)
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


def noise_split(spec: dict) -> Check:
    """sigma split into the gradient's and the histogram's shares and recombined: the joint
    release costs DP-SGD's epsilon (module docstring)."""
    from dpclip.privacy import ExtraQuery, combined_sigma, epsilon_of, noise_for_epsilon, \
        split_sigma

    name = "noise_split"
    epsilon, delta = _number(spec, "epsilon", name), _number(spec, "delta", name)
    q, steps = _number(spec, "sample_rate", name), int(_number(spec, "steps", name))
    ratio = _number(spec, "sigma_h_ratio", name)
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


def _lm_sum(rows: list[list[float]], weights: str, batch: int):
    """lm_dp_sgd's reweighted, clipped sum (before noise) of records whose per-layer gradient
    norms are ``rows`` (C = 1), each layer's gradients along one direction: the sum's
    coefficient per layer's direction. Equal shadow error rates, so the risk factors cancel."""
    import torch

    from dpclip.methods import get_method
    from dpclip.methods.base import MethodContext

    names = [f"layer{i + 1}" for i in range(len(rows[0]))]
    risk = {"layers": {n: {"error_rate": 0.5, "norm_share": 1.0} for n in names},
            "layer_names": names}
    cls = get_method("lm_dp_sgd")
    method = cls(MethodContext(1.0, names, expected_batch=float(batch),
                               options=cls.parse_options({"weights": weights}),
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
    """A neighbouring pair that moves LM-DP-SGD's literal-rule sum by about B C (module
    docstring): no sensitivity bound in C, so no epsilon, follows for the literal rule."""
    from dpclip.privacy import noise_for_epsilon

    name = "batch_weights_sensitivity"
    batch = int(_number(spec, "batch_size", name))
    epsilon, delta = _number(spec, "epsilon", name), _number(spec, "delta", name)
    q, steps = _number(spec, "sample_rate", name), int(_number(spec, "steps", name))
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


CHECKS = {"poisson_amplification": poisson_amplification, "noise_split": noise_split,
          "batch_weights_sensitivity": batch_weights_sensitivity}


def run_check(spec: dict) -> Check:
    """The check ``spec["check"]`` on the rest of ``spec``."""
    check = spec.get("check") if isinstance(spec, dict) else None
    if check not in CHECKS:
        raise DpclipError(f"accounting check {check!r} is not one of {list(CHECKS)}")
    return CHECKS[check](spec)
