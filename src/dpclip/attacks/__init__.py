"""Membership-inference attacks, one module each, found by being here.

:func:`discover` imports every module of this package (not ``base`` or the ``common``
subpackage, which holds what the attacks share) and every module named by the
``dpclip.attacks`` entry-point group of an installed plugin; each registers its
:class:`~dpclip.attacks.base.Attack` subclass with :func:`~dpclip.attacks.base.register`.
Adding an attack is adding its module and naming it in ``attack.kinds``: no list to edit.
"""

from __future__ import annotations

import importlib
import pkgutil
from importlib.metadata import entry_points

from dpclip.attacks.base import REGISTRY, Attack, AttackEvidence, ReferenceEvidence
from dpclip.errors import DpclipError

NOT_ATTACKS = {"base"}
ENTRY_POINT_GROUP = "dpclip.attacks"


def discover() -> dict[str, type[Attack]]:
    """Import every attack module (of this package, then of plugins); the registry after."""
    for module in pkgutil.iter_modules(__path__):
        if not module.ispkg and module.name not in NOT_ATTACKS:
            importlib.import_module(f"{__name__}.{module.name}")
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        entry.load()  # importing the module registers its attack
    return REGISTRY


def available_attacks() -> list[str]:
    return sorted(REGISTRY)


def get_attack(name: str) -> type[Attack]:
    """The registered attack ``name``; an unknown name lists the known ones."""
    if name not in REGISTRY:
        raise DpclipError(f"attack {name!r} is not one of {available_attacks()}: an attack is "
                          f"a module in src/dpclip/attacks/ (or a plugin in the "
                          f"{ENTRY_POINT_GROUP!r} entry-point group) that registers an Attack "
                          f"subclass with @register and name = {name!r}")
    return REGISTRY[name]


def baseline_attack() -> type[Attack]:
    """The attack every run reports under the contract's unprefixed names (``mia_auc``)."""
    return next(cls for cls in REGISTRY.values() if cls.baseline)


discover()

__all__ = ["Attack", "AttackEvidence", "ReferenceEvidence", "available_attacks",
           "baseline_attack", "discover", "get_attack"]
