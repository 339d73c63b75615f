"""Training methods, one module each, found by being here.

:func:`discover` imports every module of this package (not ``base`` or the ``common``
subpackage) and every module named by the ``dpclip.methods`` entry-point group of an
installed plugin; each registers its :class:`Method` subclass with
:func:`~dpclip.methods.base.register`. Adding a method is adding its module: no list to edit.
"""

from __future__ import annotations

import importlib
import pkgutil
from importlib.metadata import entry_points

from dpclip.errors import DpclipError
from dpclip.methods.base import REGISTRY, Method, StepRelease

NOT_METHODS = {"base"}
ENTRY_POINT_GROUP = "dpclip.methods"


def discover() -> dict[str, type[Method]]:
    """Import every method module (of this package, then of plugins); the registry after."""
    for module in pkgutil.iter_modules(__path__):
        if not module.ispkg and module.name not in NOT_METHODS:
            importlib.import_module(f"{__name__}.{module.name}")
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        entry.load()  # "package.module" or "package.module:Class": importing registers it
    return REGISTRY


def available_methods() -> list[str]:
    return sorted(REGISTRY)


def get_method(name: str) -> type[Method]:
    """The registered method ``name``; an unknown name lists the known ones."""
    if name not in REGISTRY:
        raise DpclipError(f"method {name!r} is not one of {available_methods()}: a method is "
                          f"a module in src/dpclip/methods/ (or a plugin in the "
                          f"{ENTRY_POINT_GROUP!r} entry-point group) that registers a Method "
                          f"subclass with @register and name = {name!r}")
    return REGISTRY[name]


discover()

__all__ = ["Method", "StepRelease", "available_methods", "discover", "get_method"]
