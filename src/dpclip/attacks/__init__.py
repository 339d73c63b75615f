"""Membership-inference attacks, one module each, found by being here.

:func:`discover` imports every module of this package (not ``base`` or the ``common``
subpackage, which holds what the attacks share) and every module named by the
``dpclip.attacks`` entry-point group of an installed plugin; each registers its
:class:`~dpclip.attacks.base.Attack` subclass with :func:`~dpclip.attacks.base.register`
(:class:`dpclip.registry.Registry`). Adding an attack is adding its module and naming it in
``attack.kinds``: no list to edit.
"""

from __future__ import annotations

from dpclip.attacks.base import REGISTRY, Attack, AttackEvidence, ReferenceEvidence


def discover() -> dict[str, type[Attack]]:
    """Import every attack module (of this package, then of plugins); the registry after."""
    return REGISTRY.discover()


def available_attacks() -> list[str]:
    return REGISTRY.names()


def get_attack(name: str) -> type[Attack]:
    """The registered attack ``name``; an unknown name lists the known ones."""
    return REGISTRY.lookup(name)


def baseline_attack() -> type[Attack]:
    """The attack every run reports under the contract's unprefixed names (``mia_auc``)."""
    return next(cls for cls in REGISTRY.values() if cls.baseline)


discover()

__all__ = ["Attack", "AttackEvidence", "ReferenceEvidence", "available_attacks",
           "baseline_attack", "discover", "get_attack"]
