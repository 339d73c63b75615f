"""audit: the one-run privacy audit of one configuration (Steinke, Nasr and Jagielski 2023;
:mod:`dpclip.audit`).

For every run with a DP claim and each kind of ``audit.kinds`` (``whitebox`` gradient
canaries in the DP step, ``blackbox`` mislabelled public records), one extra model trained with
the run's own configuration and canaries gives a lower bound on epsilon; a bound above the claim
is a privacy bug. Writes ``audits/<run>/audit.json`` and its ``provenance.json``. See
docs/attacks.md, "The privacy audit".
"""

from __future__ import annotations

from dataclasses import replace

import hashlib

from dpclip.stage_outputs import load_split
from dpclip.audit.run import audit_blackbox, audit_whitebox, not_applicable
from dpclip.config import Params
from dpclip.files import write_json
from dpclip.layout import Layout
from dpclip.audit.status import why_not_audited
from dpclip.run_keys import RunKey
from dpclip.catalog import BY_NAME
from dpclip.pipeline import provenance
from dpclip.threads import use_threads
from dpclip.train import build_run
from dpclip.pipeline.inputs import RunInputs, run_inputs

KINDS = ("whitebox", "blackbox")


STAGE = BY_NAME["audit"]


def canary_seed(params: Params, run: str, kind: str) -> int:
    """The canaries' seed: ``audit.seed``, the run and the kind (each run's canaries differ)."""
    text = f"{params.audit.seed}:{run}:{kind}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big")


def audit(params: Params, method: str, epsilon, alpha, seed: int, layout: Layout = Layout()
          ) -> dict:
    key = RunKey(method, epsilon, alpha, int(seed))
    run = key.name
    a = params.audit
    reasons = {kind: "not in audit.kinds" if kind not in a.kinds else
               why_not_audited(method, params.method_options(method), kind) for kind in KINDS}
    # what the run's training reads, resolved once for every kind and the provenance
    data = run_inputs(params, key, layout) if None in reasons.values() else None
    inputs = provenance.inputs(STAGE, params, key, layout,
                          **({} if data is None else {"tuned": data.tuned}))
    use_threads(params.train.threads)
    results = {kind: not_applicable(kind, reason) if reason is not None else
               _audit_kind(params, key, kind, layout, data) for kind, reason in reasons.items()}
    write_json(layout.audit(run), results)
    provenance.record(STAGE, layout, key, inputs)
    return results


def _audit_kind(params: Params, key: RunKey, kind: str, layout: Layout,
                data: RunInputs) -> dict:
    a = params.audit
    seed = canary_seed(params, key.name, kind)
    name = f"{key.name} ({kind} audit)"
    # audit.confidence split (Bonferroni) over the kinds run, so the larger of their bounds
    # (the summary's) holds at audit.confidence
    confidence = 1.0 - (1.0 - a.confidence) / max(1, len(a.kinds))
    # the audit's own noise: trained with the released run's streams, its model would differ
    # from the released one by the canaries' effect alone (never released, but no reason to)
    cfg = replace(data.cfg, data_label=f"{data.cfg.data_label} audit={kind}")
    if kind == "whitebox":
        run = build_run(data.shape, data.n_classes, len(data.x), cfg, data.public)
        return audit_whitebox(run, data.x, data.y, a.canaries, seed, confidence, name,
                              a.canary_span)
    px, py, _ = load_split(layout, "shadow_holdout")  # public, disjoint from the members
    return audit_blackbox(data.x, data.y, px, py, data.shape, data.n_classes, cfg,
                          min(a.input_canaries, len(px)), seed, confidence, name, data.public)


def describe(result: dict, layout: Layout) -> str:
    """The line ``dpclip audit`` prints: each kind's lower bound against the claim, and a
    refuted epsilon that was no guarantee (a literal-paper variant) said as such."""
    def verdict(r: dict) -> str:
        if r["violated"]:
            return ", REFUTED"
        return ", refuted: no DP guarantee claimed" if r.get("refutes_reported_epsilon") else ""

    return "; ".join(
        f"{kind} " + (f"eps >= {r['epsilon_lower_bound']:.3f} (claimed "
                      f"{r['claimed_epsilon']:.3f}{verdict(r)})"
                      if r["applicable"] else f"not applicable ({r['reason']})")
        for kind, r in result.items())
