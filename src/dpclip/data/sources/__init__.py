"""Dataset sources, one module each, found by being here (``data.dataset`` names one).

:func:`discover` imports every module of this package but ``base``, and every module named by
the ``dpclip.datasets`` entry-point group of an installed plugin; each registers its
:class:`~dpclip.data.sources.base.DataSource` subclass. Adding a dataset is adding its module.
"""

from __future__ import annotations

import importlib
import pkgutil
from importlib.metadata import entry_points

from dpclip.data.sources.base import REGISTRY, DataSource
from dpclip.errors import DpclipError

ENTRY_POINT_GROUP = "dpclip.datasets"


def discover() -> dict[str, type[DataSource]]:
    """Import every source module (of this package, then of plugins); the registry after."""
    for module in pkgutil.iter_modules(__path__):
        if not module.ispkg and module.name != "base":
            importlib.import_module(f"{__name__}.{module.name}")
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        entry.load()
    return REGISTRY


def available_sources() -> list[str]:
    return sorted(REGISTRY)


def get_source(name: str) -> type[DataSource]:
    if name not in REGISTRY:
        raise DpclipError(f"dataset {name!r} is not one of {available_sources()}: a dataset "
                          f"source is a module in src/dpclip/data/sources/ that registers a "
                          f"DataSource subclass with @register and name = {name!r}")
    return REGISTRY[name]


discover()

__all__ = ["DataSource", "available_sources", "discover", "get_source"]
