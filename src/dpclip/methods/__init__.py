"""Training methods, one module each, found by being here.

:func:`discover` imports every module of this package (not ``base`` or the ``common``
subpackage) and every module named by the ``dpclip.methods`` entry-point group of an
installed plugin; each registers its :class:`Method` subclass with
:func:`~dpclip.methods.base.register` (:class:`dpclip.registry.Registry`). Adding a method is
adding its module: no list to edit. ``train.methods`` and the ``methods`` section are
validated here (:func:`read_params`): the schema knows no method.
"""

from __future__ import annotations

from dpclip.errors import bad_value
from dpclip.methods.base import REGISTRY, Method, StepRelease, read_method_options
from dpclip.models import layer_names


def discover() -> dict[str, type[Method]]:
    """Import every method module (of this package, then of plugins); the registry after."""
    return REGISTRY.discover()


def available_methods() -> list[str]:
    return REGISTRY.names()


def get_method(name: str) -> type[Method]:
    """The registered method ``name``; an unknown name lists the known ones."""
    return REGISTRY.lookup(name)


def unknown_names(names: list[str]) -> list[str]:
    """A problem line for each of ``names`` (``train.methods``) that is no registered method."""
    return [bad_value("train.methods", m, f"is not one of {available_methods()}")
            for m in names if m not in REGISTRY]


def read_params(raw: object, params) -> tuple[dict, list[str]]:
    """``methods.<name>`` for every registered method, each validated by the method's own
    model against the model's layers (:func:`~dpclip.methods.base.read_method_options`), and
    the problems: unregistered ``train.methods``, bad options, and each configured method's
    rules across sections (:meth:`Method.params_problems`)."""
    problems = unknown_names(params.train.methods)
    options = read_method_options(raw, layer_names(params.train.model, params.train.hidden),
                                  problems)
    for name in params.train.methods:
        if name in REGISTRY and name in options:
            problems += REGISTRY[name].params_problems(options[name], params)
    return options, problems


discover()

__all__ = ["Method", "StepRelease", "available_methods", "discover", "get_method",
           "read_params", "unknown_names"]
