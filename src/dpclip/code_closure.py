"""Which of the package's files a piece of code depends on: its import closure, read from the
source (no module is imported).

A module depends on every module it imports, at the top or inside a function, and on what
those import in turn; importing ``dpclip.a.b`` also runs the packages above it
(``dpclip/__init__.py``, ``dpclip/a/__init__.py``). The closure of a set of roots is the
smallest set of modules that holds them and is closed under both rules. A run's code inputs
(:mod:`dpclip.provenance`) and the code dependencies of each DVC stage are these
closures, so they cannot drift from the imports. Modules loaded by name at run time
by a function (``importlib``: the method and attack discovery) are not edges: a run depends
on its own method's module and the attacks it runs, which its stage adds as roots, not on
every method's. A package that imports
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


def _imports_every_submodule(path: Path) -> bool:
    """Whether a package's ``__init__.py`` imports all its modules by name when it is imported
    (``pkgutil.iter_modules`` in its module-level code, not inside a function): then each of
    them is a dependency of whatever imports the package."""
    tree = ast.parse(path.read_text(), str(path))
    top = [node for node in tree.body
           if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    return any(isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
               and call.func.attr == "iter_modules"
               for node in top for call in ast.walk(node))


def direct_imports(module: str, package: Path = PACKAGE) -> set[str]:
    """The package's modules that ``module`` imports itself (anywhere in the file), and the
    packages above each (importing ``a.b.c`` runs ``a`` and ``a.b`` first)."""
    modules = package_modules(package)
    path = modules[module]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(node, module, path.name == "__init__.py")
            if target is None:
                continue
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)  # submodules
    if path.name == "__init__.py" and _imports_every_submodule(path):
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


def compact(files, package: Path = PACKAGE) -> list[str]:
    """``files`` (relative to the package) as the fewest paths under ``src/dpclip``: a folder
    whose every module is in ``files`` stands for them (how dvc.yaml lists code)."""
    wanted = set(files)
    every = {p.relative_to(package).as_posix() for p in package.rglob("*.py")}
    folders = sorted({str(Path(f).parent) for f in every if str(Path(f).parent) != "."},
                     key=lambda d: d.count("/"))
    chosen: list[str] = []
    for folder in folders:
        if any(folder.startswith(c + "/") for c in chosen):
            continue
        inside = {f for f in every if f.startswith(folder + "/")}
        if inside <= wanted:
            chosen.append(folder)
    covered = {f for f in wanted for c in chosen if f.startswith(c + "/")}
    prefix = f"src/{ROOT_NAME}/"
    return sorted(prefix + p for p in [*chosen, *(wanted - covered)])


# each DVC stage's code: the command that runs it (``dpclip.cli``: every stage's command
# executes it), its stage module, and for the stages that run every configured method (every
# chosen attack, the chosen dataset), every registered method's (attack's, dataset source's)
# module: "methods" ("attacks", "data.sources"), the modules the package's discovery imports
DVC_STAGE_ROOTS = {
    "prepare": ("dpclip.cli", "dpclip.stages.prepare", "data.sources"),
    "partition": ("dpclip.cli", "dpclip.stages.partition"),
    "shadow": ("dpclip.cli", "dpclip.stages.shadow", "methods"),
    "tune": ("dpclip.cli", "dpclip.stages.tune", "methods"),
    "train": ("dpclip.cli", "dpclip.stages.train", "methods"),
    "audit": ("dpclip.cli", "dpclip.stages.audit", "methods"),
    "reference": ("dpclip.cli", "dpclip.stages.reference", "methods"),
    "evaluate": ("dpclip.cli", "dpclip.stages.evaluate", "methods", "attacks"),
    "report": ("dpclip.cli", "dpclip.stages.report", "attacks"),
}
DISCOVERED = {"methods", "attacks", "data.sources"}  # modules found at run time


def stage_code(stage: str, package: Path = PACKAGE) -> list[str]:
    """The code dependencies dvc.yaml lists for ``stage`` (:func:`compact` of its closure)."""
    roots = []
    for root in DVC_STAGE_ROOTS[stage]:
        if root in DISCOVERED:  # the whole folder, so that dvc.yaml covers a module added to it
            roots += [name for name in package_modules(package)
                      if name.startswith(f"{ROOT_NAME}.{root}.")]
        else:
            roots.append(root)
    return compact(closure_files(roots, package), package)


def write_stage_code(dvc_yaml: Path) -> bool:
    """Rewrite every stage's code dependencies in ``dvc_yaml`` (the ``- src/dpclip...`` lines
    under its ``deps:``) as :func:`stage_code` gives them, keeping every other line; True when
    the file changed. DVC's own YAML round trip would drop the file's comments."""
    lines, out, stage, i = dvc_yaml.read_text().split("\n"), [], None, 0
    prefix = f"- src/{ROOT_NAME}"
    while i < len(lines):
        line = lines[i]
        if line.startswith("  ") and not line.startswith("   ") and line.rstrip().endswith(":"):
            stage = line.strip()[:-1]
        if line.strip().startswith(prefix) and stage in DVC_STAGE_ROOTS:
            indent = line[:line.index("-")]
            while i < len(lines) and lines[i].strip().startswith(prefix):
                i += 1
            out += [f"{indent}- {path}" for path in stage_code(stage)]
            continue
        out.append(line)
        i += 1
    text = "\n".join(out)
    changed = text != dvc_yaml.read_text()
    if changed:
        dvc_yaml.write_text(text)
    return changed


if __name__ == "__main__":
    # what dvc.yaml's stages must list: python -m dpclip.code_closure; --write rewrites them
    import sys

    if sys.argv[1:] == ["--write"]:
        target = PACKAGE.parent.parent / "dvc.yaml"
        print(f"{target}: {'rewritten' if write_stage_code(target) else 'already current'}")
    else:
        for name in DVC_STAGE_ROOTS:
            print(f"{name}:", *(f"  - {path}" for path in stage_code(name)), sep="\n")
