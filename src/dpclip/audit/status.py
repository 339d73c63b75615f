"""What a run's audit record says in a few words: audited (and with which canaries), or why
it has no bound. Read by the report's table and the claimed-vs-audited plot's table."""

from __future__ import annotations


def why_not_audited(method: str) -> str | None:
    """Why a method's runs get no audit (None: they do): no DP claim, or another
    neighbouring notion than the whole records the canaries add or remove."""
    from dpclip.methods import get_method

    method_cls = get_method(method)
    if not method_cls.private:
        return "no DP claim"
    if method_cls.adjacency != "add_remove":
        return (f"{method_cls.adjacency} adjacency (the canaries are added or removed whole "
                "records)")
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
