"""The result of a claim checked without runs: by the accounting of the method it is about
(each method's module holds its own checks, ``ACCOUNTING_CHECKS``; collected by
:mod:`dpclip.reporting.accounting`) or by a committed benchmark
(:mod:`dpclip.reporting.benchmarks`); and the number check both read their specs with."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dpclip.errors import DpclipError


@dataclass
class Check:
    """The paper's number (``claimed``), ours (``computed``: the epsilon the mechanism gives,
    or the measured cost), whether the claim holds, the computation or measurement in words
    (``lines``), and ``summary``: the finding in one clause where the two numbers alone would
    say less than the check found."""

    claimed: float
    computed: float
    holds: bool
    lines: list[str] = field(default_factory=list)
    summary: str | None = None


def positive_number(mapping: dict, key: str, what: str) -> float:
    """``mapping[key]`` as a finite number above 0, else a DpclipError naming ``what``, the
    key and the value."""
    value = mapping.get(key) if isinstance(mapping, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or not value > 0:
        raise DpclipError(f"{what}: {key} must be a finite number above 0, not {value!r}")
    return float(value)


def accounting_numbers(spec: dict, check: str, *keys: str) -> list[float]:
    """``spec``'s values of ``keys``, each a finite number above 0 (:func:`positive_number`),
    for the accounting check named ``check``."""
    return [positive_number(spec, key, f"accounting check {check!r}") for key in keys]
