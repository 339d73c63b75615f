"""What a run's audit record says in a few words: audited (and with which canaries), or why
it has no bound. Read by the audit stage, ``dpclip cost``, the report's table and the
claimed-vs-audited plot's table."""

from __future__ import annotations


def why_not_audited(method: str, options=None, kind: str | None = None) -> str | None:
    """Why a method's runs with ``options`` (None: the defaults) get no audit of ``kind``
    (None: of any kind); None when they do. No DP claim, a neighbouring notion other than the
    whole records the canaries add or remove, or (white-box) no shared DP step to put gradient
    canaries in."""
    from dpclip.methods import get_method
    from dpclip.train.runs import run_class

    method_cls = get_method(method)
    claim = method_cls.privacy_claim(options)
    if not method_cls.private:
        return "no DP claim"
    if claim.adjacency != "add_remove":
        return (f"{claim.adjacency} adjacency (the canaries are added or removed whole "
                "records)")
    if kind == "whitebox" and not run_class(method_cls.run_kind).takes_gradient_canaries:
        return f"run kind {method_cls.run_kind!r} has no shared DP step"
    return None


def audit_status(audit: dict) -> str | None:
    """"audited (<kinds>)", or why the run has no bound ("not applicable (<reason>)": no DP
    claim, another adjacency); None when the metrics hold no audit."""
    entries = {kind: r for kind, r in audit.items() if isinstance(r, dict)}
    if not entries:
        return None
    audited = [kind for kind, r in entries.items() if r.get("applicable")]
    if audited:
        return f"audited ({', '.join(audited)})"
    reasons = [r["reason"] for r in entries.values() if r.get("reason") != "not in audit.kinds"]
    return f"not applicable ({reasons[0]})" if reasons else "off (audit.kinds is empty)"
