"""Dataset sources, one module each, found by being here (``data.dataset`` names one).

:func:`discover` imports every module of this package but ``base``, and every module named by
the ``dpclip.datasets`` entry-point group of an installed plugin; each registers its
:class:`~dpclip.data.sources.base.DataSource` subclass (:class:`dpclip.registry.Registry`).
Adding a dataset is adding its module.
"""

from __future__ import annotations

from dpclip.data.sources.base import REGISTRY, DataSource


def discover() -> dict[str, type[DataSource]]:
    """Import every source module (of this package, then of plugins); the registry after."""
    return REGISTRY.discover()


def available_sources() -> list[str]:
    return REGISTRY.names()


def get_source(name: str) -> type[DataSource]:
    """The registered source ``name``; an unknown name lists the known ones."""
    return REGISTRY.lookup(name)


discover()

__all__ = ["DataSource", "available_sources", "discover", "get_source"]
