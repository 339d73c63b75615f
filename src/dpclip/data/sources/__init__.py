"""Dataset sources, one module each, found by being here (``data.dataset`` names one).

:func:`discover` imports every module of this package but ``base``, and every module named by
the ``dpclip.datasets`` entry-point group of an installed plugin; each registers its
:class:`~dpclip.data.sources.base.DataSource` subclass (:class:`dpclip.registry.Registry`).
Adding a dataset is adding its module. A source's own ``data.<key>`` are validated here by its
``Options`` model (:func:`read_sections`), and the sources named in ``data`` checked
(:func:`params_problems`): the schema knows no source.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ValidationError

from dpclip.data.sources.base import REGISTRY, DataSource
from dpclip.errors import bad_value
from dpclip.param_types import problems_of


def discover() -> dict[str, type[DataSource]]:
    """Import every source module (of this package, then of plugins); the registry after."""
    return REGISTRY.discover()


def available_sources() -> list[str]:
    return REGISTRY.names()


def get_source(name: str) -> type[DataSource]:
    """The registered source ``name``; an unknown name lists the known ones."""
    return REGISTRY.lookup(name)


def read_sections(section: dict | None) -> tuple[dict, list[str]]:
    """The ``data:`` section with every registered source's own keys moved into ``options``
    (source -> its validated values; every source gets its defaults), and the problems, each
    naming ``data.<key>``. A key that no source declares stays, for the schema to refuse."""
    if not isinstance(section, dict):
        return section, []
    data, problems = dict(section), []
    written = {name: dict(values) for name, values in (data.pop("options", None) or {}).items()
               if isinstance(values, dict)}
    own = {key for cls in REGISTRY.values() for key in cls.Options.model_fields}
    flat = {key: data.pop(key) for key in list(data) if key in own}
    options = {}
    for name, cls in sorted(REGISTRY.items()):
        mine = {**written.get(name, {}),
                **{k: v for k, v in flat.items() if k in cls.Options.model_fields}}
        try:
            options[name] = cls.Options.model_validate(mine).model_dump()
        except ValidationError as exc:
            problems += problems_of(exc, ("data",), cls.Options)
    return {**data, "options": options}, list(dict.fromkeys(problems))


def options_of(data, name: str) -> BaseModel:
    """The typed options of source ``name`` from the ``data`` parameters."""
    cls = REGISTRY.lookup(name)
    return cls.Options.model_validate(data.options.get(name) or {})


def open_source(name: str, data) -> DataSource:
    """Source ``name`` with its options from the ``data`` parameters."""
    return REGISTRY.lookup(name)(options_of(data, name))


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


def dataset_label(data) -> str:
    """The data's name as results and MLflow carry it: the source's, and for a table of your
    own its file's stem too (``csv-heart``), in letters, digits, ``.``, ``_`` and ``-``."""
    name = data.dataset
    if data.path is not None and get_source(name).kind == "table":
        name += f"-{Path(data.path).stem}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


discover()

__all__ = ["DataSource", "available_sources", "dataset_label", "discover", "get_source",
           "open_source", "options_of", "params_problems", "read_sections"]

