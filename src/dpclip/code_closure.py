"""Which of the package's files a piece of code depends on: its import closure, read from the
source (no module is imported).

A module depends on every module it imports, at the top or inside a function, and on what
those import in turn; importing ``dpclip.a.b`` also runs the packages above it
(``dpclip/__init__.py``, ``dpclip/a/__init__.py``). The closure of a set of roots is the
smallest set of modules that holds them and is closed under both rules. A run's code inputs
(:mod:`dpclip.pipeline.provenance`) and the code dependencies of each DVC stage
(:mod:`dpclip.pipeline.dvc_yaml`) are these closures, so they cannot drift from the imports. Modules loaded by name at run time
by a function (``importlib``: the method and attack discovery) are not edges: a run depends
on its own method's module and the attacks it runs, which its stage adds as roots, not on
every method's (a stage that runs every method lists them all). A package that imports
all its modules when it is imported (``pkgutil.iter_modules`` at module level: the run kinds
of ``dpclip.train.runs``) has them all as dependencies.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent  # src/dpclip
ROOT_NAME = PACKAGE.name


@functools.lru_cache(maxsize=4)
def package_modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package: dotted name -> file (a package is its ``__init__.py``)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = [ROOT_NAME, *path.relative_to(package).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str | None:
    """The module an ``from X import ...`` names, relative imports resolved."""
    if node.level == 0:
        return node.module
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports_every_submodule(tree: ast.Module) -> bool:
    """Whether a package's ``__init__.py`` imports all its modules by name when it is imported
    (``pkgutil.iter_modules`` in its module-level code, not inside a function): then each of
    them is a dependency of whatever imports the package."""
    top = [node for node in tree.body
           if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    return any(isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
               and call.func.attr == "iter_modules"
               for node in top for call in ast.walk(node))


@functools.lru_cache(maxsize=4096)
def _imports_in_source(module: str, is_package: bool, source: str, filename: str
                       ) -> tuple[frozenset[str], bool]:
    """The names a module's source imports (relative ones resolved) and whether it imports
    all its submodules. Cached on the source text itself: a stage computes the closure of
    every run, the same files each time, and an edited file is parsed again."""
    found: set[str] = set()
    tree = ast.parse(source, filename)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(node, module, is_package)
            if target is None:
                continue
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)  # submodules
    return frozenset(found), is_package and _imports_every_submodule(tree)


def direct_imports(module: str, package: Path = PACKAGE) -> set[str]:
    """The package's modules that ``module`` imports itself (anywhere in the file), and the
    packages above each (importing ``a.b.c`` runs ``a`` and ``a.b`` first)."""
    modules = package_modules(package)
    path = modules[module]
    imported, every_submodule = _imports_in_source(module, path.name == "__init__.py",
                                                   path.read_text(), str(path))
    found = set(imported)
    if every_submodule:
        found.update(name for name in modules if name.rsplit(".", 1)[0] == module)
    with_parents = set()
    for name in found:
        parts = name.split(".")
        with_parents.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {name for name in with_parents if name in modules and name != module}


def closure(roots, package: Path = PACKAGE) -> set[str]:
    """The modules the ``roots`` (dotted names) need, the roots and their packages included."""
    modules = package_modules(package)
    pending = set()
    for root in roots:
        parts = root.split(".")
        pending.update(n for n in (".".join(parts[:i]) for i in range(1, len(parts) + 1))
                       if n in modules)
    done: set[str] = set()
    while pending:
        name = pending.pop()
        if name in done:
            continue
        done.add(name)
        pending |= direct_imports(name, package) - done
    return done


def closure_files(roots, package: Path = PACKAGE) -> list[str]:
    """:func:`closure` as file paths relative to the package folder, sorted
    (``stages/train.py``, ``__init__.py``)."""
    modules = package_modules(package)
    return sorted(modules[name].relative_to(package).as_posix()
                  for name in closure(roots, package))
