"""Claims about privacy accounting, checked by computation instead of runs.

Some of the papers' claims are about the epsilon itself, not about what training buys. Each
check redoes a paper's accounting with the project's own accountant (Opacus's RDP) and the
accounting of the mechanism the paper describes, and says whether the claimed epsilon is one
that mechanism gives. A check lives with the method it is about, in its module's
``ACCOUNTING_CHECKS`` (name -> function): it takes the claim's ``accounting`` mapping from
``presets/claims.yaml`` and returns a :class:`~dpclip.claim_checks.Check`;
:func:`dpclip.reporting.evidence.judge` turns it into the verdict "held by the accounting" or
"contradicted by the accounting".
"""

from __future__ import annotations

import sys

from dpclip.claim_checks import Check
from dpclip.errors import DpclipError
from dpclip.methods import REGISTRY


def accounting_checks() -> dict:
    """Check name -> function, from the modules of every registered method."""
    checks = {}
    for cls in REGISTRY.discover().values():
        checks.update(getattr(sys.modules[cls.__module__], "ACCOUNTING_CHECKS", {}))
    return checks


def run_check(spec: dict) -> Check:
    """The check ``spec["check"]`` on the rest of ``spec``."""
    checks = accounting_checks()
    check = spec.get("check") if isinstance(spec, dict) else None
    if check not in checks:
        raise DpclipError(f"accounting check {check!r} is not one of {list(checks)}")
    return checks[check](spec)


def module_of(check: str) -> str:
    """The module that holds the check named ``check`` (the method it is about)."""
    return accounting_checks()[check].__module__
