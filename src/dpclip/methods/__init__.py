"""Training methods, one module each. Importing this package registers all of them."""

from __future__ import annotations

from dpclip.methods import (adaclip, adaclip_opacus,  # noqa: F401  (registration)
                            auto_s, dc_sgd, dp_psac, dp_sgd, lm_dp_sgd, non_private,
                            sanitize, ww_dp_sgd)
from dpclip.methods.base import REGISTRY, Method, StepRelease


def available_methods() -> list[str]:
    return sorted(REGISTRY)


def get_method(name: str) -> type[Method]:
    return REGISTRY[name]


__all__ = ["Method", "StepRelease", "available_methods", "get_method"]
