"""Classes found by being in a package: the methods, the attacks and the dataset sources.

A :class:`Registry` maps names to the classes that modules of one package register with it
(``@register``, the registry's :meth:`Registry.register`). :meth:`Registry.discover` imports
every module of the package (not ``base``, not a subpackage: shared helpers live there) and
every module of the package's entry-point group (an installed plugin), so adding a class is
adding its module: no list to edit.
"""

from __future__ import annotations

import importlib
import pkgutil
from importlib.metadata import entry_points
from typing import Callable

from dpclip.errors import DpclipError


class Registry(dict):
    """name -> registered class, for the package ``package`` (dotted) whose modules define
    subclasses of ``base`` (its name, for messages), each known by its attribute ``key``
    (``name``; a run kind's ``kind``). ``check`` returns what is wrong with a
    class's declaration (empty when nothing), so a class that would confuse the records is
    refused when its module is imported."""

    def __init__(self, noun: str, package: str, base: str, entry_point_group: str,
                 check: Callable[[type], list[str]] = lambda cls: [], key: str = "name"):
        super().__init__()
        self.noun, self.package, self.base = noun, package, base
        self.entry_point_group, self.check, self.key = entry_point_group, check, key

    def register(self, cls: type) -> type:
        """Class decorator: make ``cls`` known by ``cls.name``. A name used by another class
        (another module, or another class) is an error: a plugin cannot silently replace a
        registered one; registering the same class again (a re-imported module) is not."""
        problems = self.check(cls)
        if problems:
            raise ValueError(f"{self.noun} {cls.__name__}: " + "; ".join(problems))
        name = getattr(cls, self.key)
        known = super().get(name)
        same = known is not None and (known.__module__, known.__qualname__) == \
            (cls.__module__, cls.__qualname__)
        if not name or (known is not None and not same):
            raise ValueError(f"{self.noun} name {name!r} is empty or already registered by "
                             f"{known.__module__ if known else None}")
        self[name] = cls
        return cls

    def discover(self) -> Registry:
        """Import every module of the package (its current search path), then every plugin
        module of the entry-point group; the registry after."""
        package = importlib.import_module(self.package)
        for module in pkgutil.iter_modules(package.__path__):
            if not module.ispkg and module.name != "base":
                importlib.import_module(f"{self.package}.{module.name}")
        for entry in entry_points(group=self.entry_point_group):
            entry.load()  # "package.module" or "package.module:Class": importing registers it
        return self

    def names(self) -> list[str]:
        return sorted(self)

    def lookup(self, name: str) -> type:
        """The class registered as ``name``; an unknown name lists the known ones."""
        if name not in self:
            folder = "src/" + self.package.replace(".", "/") + "/"
            raise DpclipError(f"{self.noun} {name!r} is not one of {self.names()}: "
                              f"{_article(self.noun)} {self.noun} is a module in {folder} (or "
                              f"a plugin in the {self.entry_point_group!r} entry-point group) "
                              f"that registers {_article(self.base)} {self.base} subclass with "
                              f"@register and {self.key} = {name!r}")
        return self[name]


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"
