"""Membership-inference attacks, one module each, found by being here.

:func:`discover` imports every module of this package (not ``base`` or ``common``, what the
attacks share) and of the ``dpclip.attacks`` entry-point group; each registers its
:class:`~dpclip.attacks.base.Attack` subclass. The ``attack`` parameters are validated here, at
the registry (:func:`read_sections`, :func:`params_problems`): the schema knows no attack.
"""

from __future__ import annotations

from pydantic import ValidationError

from dpclip.attacks.base import REGISTRY, Attack, AttackEvidence, ReferenceEvidence
from dpclip.errors import bad_value
from dpclip.param_types import problems_of


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


def read_sections(section: dict | None) -> tuple[dict, list[str]]:
    """The ``attack:`` section with each ``attack.<name>`` subsection moved into ``options``,
    validated by that attack's own ``Options`` model (every registered attack gets its
    defaults), and the problems: an unregistered attack's section."""
    data, problems = dict(section or {}), []
    written = dict(data.pop("options", None) or {})
    written.update({name: data.pop(name) for name in REGISTRY if name in data})
    problems += [bad_value(f"attack.{name}", value, f"is not a registered attack "
                           f"{REGISTRY.names()}") for name, value in written.items()
                 if name not in REGISTRY]
    options = {}
    for name, attack in sorted(REGISTRY.items()):
        try:
            options[name] = attack.Options.model_validate(written.get(name) or {}).model_dump()
        except ValidationError as exc:
            problems += problems_of(exc, ("attack", name), attack.Options)
    return {**data, "options": options}, problems


def params_problems(params) -> list[str]:
    """What is wrong with the ``attack`` parameters (:class:`dpclip.config.AttackParams`)
    across attacks: unregistered kinds, no baseline, reference models that do not fit, an
    attack's own checks against them, a headline that is not run or cannot be."""
    k, problems = params.references, []
    problems += [bad_value("attack.kinds", kind, f"is not one of {REGISTRY.names()}: an "
                           f"attack is a module in src/dpclip/attacks/")
                 for kind in params.kinds if kind not in REGISTRY]
    baseline = baseline_attack().name
    if baseline not in params.kinds:
        problems.append(bad_value("attack.kinds", params.kinds, f"must include {baseline!r}, "
                                  f"the baseline attack every run reports (mia_auc)"))
    if k % 2:
        problems.append(bad_value("attack.references", k, "is odd: reference models come "
                                  "in complementary pairs (each pool record IN for exactly "
                                  "half of them)"))
    elif params.mode == "online" and 0 < k < 4:
        problems.append(bad_value("attack.references", k, "is too few for attack.mode "
                                  "'online': each record needs two IN and two OUT models; "
                                  "use 4 or more"))
    for kind in (kind for kind in params.kinds if kind in REGISTRY):
        attack = REGISTRY[kind]
        options = attack.Options.model_validate(params.options.get(kind, {}))
        problems += attack.check_options(options, k, params.mode)
    if params.headline != "auto" and params.headline not in params.kinds:
        problems.append(bad_value("attack.headline", params.headline, f"is not one of "
                                  f"attack.kinds {params.kinds} (or auto)"))
    elif params.headline in REGISTRY and REGISTRY[params.headline].needs_references and k == 0:
        problems.append(bad_value("attack.headline", params.headline, "needs reference "
                                  "models: attack.references is 0"))
    return problems


def headline_attack(params) -> str:
    """The attack compared across methods and seeds, chosen before any run: ``attack.headline``,
    or with ``auto`` the first of ``attack.kinds`` that uses reference models when there are
    some, else the baseline."""
    if params.headline != "auto":
        return params.headline
    calibrated = [k for k in params.kinds if REGISTRY[k].needs_references]
    return calibrated[0] if params.references and calibrated else baseline_attack().name


def build(name: str, params) -> Attack:
    """The attack ``name`` with its options from the ``attack`` parameters."""
    attack = get_attack(name)
    return attack(attack.Options.model_validate(params.options.get(name, {})))


discover()

__all__ = ["Attack", "AttackEvidence", "ReferenceEvidence", "available_attacks",
           "baseline_attack", "build", "discover", "get_attack", "headline_attack",
           "params_problems", "read_sections"]
