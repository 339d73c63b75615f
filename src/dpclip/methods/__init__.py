"""Training methods, one module each, found by being here.

:func:`discover` imports every module of this package (not ``base`` or the ``common``
subpackage) and every module named by the ``dpclip.methods`` entry-point group of an
installed plugin; each registers its :class:`Method` subclass with
:func:`~dpclip.methods.base.register` (:class:`dpclip.registry.Registry`). Adding a method is
adding its module: no list to edit.
"""

from __future__ import annotations

from dpclip.methods.base import REGISTRY, Method, StepRelease


def discover() -> dict[str, type[Method]]:
    """Import every method module (of this package, then of plugins); the registry after."""
    return REGISTRY.discover()


def available_methods() -> list[str]:
    return REGISTRY.names()


def get_method(name: str) -> type[Method]:
    """The registered method ``name``; an unknown name lists the known ones."""
    return REGISTRY.lookup(name)


discover()

__all__ = ["Method", "StepRelease", "available_methods", "discover", "get_method"]
