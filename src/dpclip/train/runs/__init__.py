"""Run kinds: how a method's training runs. A method names its kind (``Method.run_kind``); every
module of this package defines one :class:`Run` subclass with a ``kind`` name and registers it
with :func:`~dpclip.train.runs.base.register_run_kind`, found by being here (or in an installed
plugin's ``dpclip.run_kinds`` entry point), so neither the loop nor this file names a method or
a kind.

The kinds shipped: ``plain`` (non-private minibatches), ``private`` (Poisson sampling, the
shared DP step, accounting), ``opacus_optimizer`` (a private run whose method brings an Opacus
DPOptimizer) and one for a method with a mechanism of its own on an activation layer.
"""

from __future__ import annotations

import importlib
import pkgutil

from dpclip.train.runs.base import RUN_KINDS, Run

# every kind of this folder is imported with the package, so every run's code includes them
# all (dpclip.code_closure reads this loop); discover() below adds installed plugins' kinds
for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

REGISTRY = RUN_KINDS  # the name every family's package gives its registry


def discover() -> dict[str, type[Run]]:
    """Import every run-kind module (of this package, then of installed plugins: the
    ``dpclip.run_kinds`` entry-point group); the registry after."""
    return RUN_KINDS.discover()


def run_class(kind: str) -> type[Run]:
    """The class of run kind ``kind``; an unknown kind names the known ones."""
    return RUN_KINDS.lookup(kind)


discover()

__all__ = ["REGISTRY", "RUN_KINDS", "Run", "discover", "run_class"]
