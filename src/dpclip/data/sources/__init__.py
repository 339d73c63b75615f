"""Dataset sources, one module each, found by being here (``data.dataset`` names one).

:func:`discover` imports every module of this package but ``base``, and every module named by
the ``dpclip.datasets`` entry-point group of an installed plugin; each registers its
:class:`~dpclip.data.sources.base.DataSource` subclass (:class:`dpclip.registry.Registry`).
Adding a dataset is adding its module. The sources named in ``data`` are checked here
(:func:`params_problems`): the schema knows no source.
"""

from __future__ import annotations

from dpclip.data.sources.base import REGISTRY, DataSource
from dpclip.errors import bad_value


def discover() -> dict[str, type[DataSource]]:
    """Import every source module (of this package, then of plugins); the registry after."""
    return REGISTRY.discover()


def available_sources() -> list[str]:
    return REGISTRY.names()


def get_source(name: str) -> type[DataSource]:
    """The registered source ``name``; an unknown name lists the known ones."""
    return REGISTRY.lookup(name)


def params_problems(data) -> list[str]:
    """What is wrong with the ``data`` parameters for the sources they name: each named dataset
    is a registered source, with what that source needs (its path; a CSV's label column)."""
    problems = []
    for role, name in (("data.dataset", data.dataset),
                       ("data.shadow_dataset", data.shadow_dataset)):
        if name is None:
            continue
        if name not in REGISTRY:
            problems.append(bad_value(role, name, f"is not one of {REGISTRY.names()}: a "
                                      f"dataset source is a module in src/dpclip/data/sources/"))
        else:
            problems += REGISTRY[name].check(data, role)
    return problems


discover()

__all__ = ["DataSource", "available_sources", "discover", "get_source", "params_problems"]
