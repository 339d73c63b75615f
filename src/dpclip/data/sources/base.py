"""What a dataset source is.

A source is one module of :mod:`dpclip.data.sources`: a subclass of :class:`DataSource`
decorated with :func:`register`, named by ``data.dataset`` (or ``data.shadow_dataset``), with
its files at ``data.path`` (``data.shadow_path``) and its own settings as ``data.<key>`` (its
``Options`` model). Its kind decides the encoding: ``arrays`` (a
:class:`~dpclip.data.dataset.Dataset` scaled by fixed constants) or ``table`` (a
:class:`~dpclip.data.tabular.CsvTable` encoded on public rows). See docs/adding-a-dataset.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Literal

from pydantic import BaseModel

from dpclip.errors import bad_value
from dpclip.param_types import Section
from dpclip.registry import Registry

KINDS = ("arrays", "table")


class NoOptions(Section):
    """A source without settings of its own."""


class DataSource(ABC):
    """Base class. A subclass sets ``name``, ``kind`` and ``description`` and implements
    :meth:`read`; ``needs_path`` (with ``path_help``, what the path must name) when it cannot
    find its files by itself; ``Options`` (a :class:`~dpclip.param_types.Section`) for keys of
    its own. A ``table`` source's options name the label column (``target``) and may give the
    public schema (``categories``: {column: [levels]}), which the prepare stage encodes with."""

    name: ClassVar[str] = ""  # data.dataset's value
    kind: ClassVar[Literal["arrays", "table"]] = "arrays"
    description: ClassVar[str] = ""
    needs_path: ClassVar[bool] = False
    path_help: ClassVar[str] = ""  # "the folder of python pickle batches"
    Options: ClassVar[type[BaseModel]] = NoOptions  # data.<key> of this source's own

    def __init__(self, options: BaseModel | None = None):
        self.options = self.Options() if options is None else options

    @classmethod
    def check(cls, data, role: str) -> list[str]:
        """Problems of the ``data`` parameters for this source in ``role`` (``data.dataset`` or
        ``data.shadow_dataset``), one line each naming the key; by default the path when
        ``needs_path``. Its own options are valid already (``data.options[name]``)."""
        path_key = "data.path" if role == "data.dataset" else "data.shadow_path"
        if cls.needs_path and getattr(data, path_key.split(".")[1]) is None:
            return [bad_value(path_key, None, f"is required when {role} is {cls.name!r} "
                                              f"({cls.path_help})")]
        return []

    @abstractmethod
    def read(self, path: str | None, data, key: str):
        """The dataset at ``path`` (None: the source's own default), read with the ``data``
        parameters; errors name ``key``, the parameter that gave the path."""


def declaration_problems(cls: type) -> list[str]:
    if cls.kind not in KINDS or not cls.description:
        return [f"needs a description and a kind of {KINDS}, not {cls.kind!r}"]
    if not (isinstance(cls.Options, type) and issubclass(cls.Options, BaseModel)):
        return [f"Options must be a pydantic model, not {cls.Options!r}"]
    return []


REGISTRY = Registry("dataset source", "dpclip.data.sources", "DataSource", "dpclip.datasets",
                    check=declaration_problems)
register = REGISTRY.register  # the class decorator of every source module
