"""The package's shape: no import cycle (counting imports inside functions, the usual way to
hide one), and no private name imported across modules."""

from __future__ import annotations

import ast
from pathlib import Path

from dpclip.catalog import STAGES as DECLARED_STAGES

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / "dpclip").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(path: Path, modules: dict[str, Path]) -> list[tuple[str, list[str]]]:
    """(imported dpclip module, names taken from it) for every import statement in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names if alias.name in modules]
        elif isinstance(node, ast.ImportFrom) and node.module in modules and node.level == 0:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.append((child, []) if child in modules else (node.module, [alias.name]))
    return found


def test_no_import_cycle():
    modules = _modules()
    graph = {name: {target for target, _ in _imports(path, modules) if target != name}
             for name, path in modules.items()}
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph[name]):
            assert state.get(target) != 1, "import cycle: " + " -> ".join(
                path[path.index(target):] + [target]) if target in path else target
            if target not in state:
                visit(target, path + [target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_no_private_name_is_imported_from_another_module():
    modules = _modules()
    private = [(name, target, taken) for name, path in modules.items()
               for target, names in _imports(path, modules) for taken in names
               if taken.startswith("_")]
    assert private == []


def test_every_method_has_its_own_params_section_and_module():
    """A method's runs record its own ``methods.<method>`` section and ``methods/<method>.py``
    (dpclip.pipeline.provenance: editing one re-runs only that method's runs); every registered
    method has both."""
    import yaml

    from dpclip.methods import available_methods
    from dpclip.catalog import BY_NAME
    from dpclip.pipeline.provenance import code_files

    train = BY_NAME["train"]
    auto_s = code_files(train, "auto_s")  # its own module, no other method's
    assert "src/dpclip/methods/auto_s.py" in auto_s and "src/dpclip/methods/dp_psac.py" not in auto_s
    assert train.per_run.method_options and \
        not any(k.startswith("methods") for k in train.per_run.params)
    sections = yaml.safe_load((SRC.parent / "params.yaml").read_text())["methods"]
    for name in available_methods():
        assert name in sections, f"params.yaml has no methods.{name} section"
        assert (SRC / "dpclip" / "methods" / f"{name}.py").exists()


def test_dvc_draws_each_plot_table_once():
    """A table declared both as a stage's plot and under the top-level ``plots:`` is drawn
    twice by ``dvc plots show`` (30 duplicates for ten runs); the top level draws them."""
    import yaml

    spec = yaml.safe_load((SRC.parent / "dvc.yaml").read_text())
    top = {next(iter(p)).rstrip("/") for p in spec["plots"]}
    staged = {str(next(iter(p)) if isinstance(p, dict) else p).rstrip("/")
              for stage in spec["stages"].values() for p in stage.get("plots", [])}
    assert top and not top & staged


GIT_TRACKED_OUTPUTS = ("summary", "overlays")


def test_the_committed_dvc_lock_matches_the_code_and_parameters():
    """Git tracks dvc.lock with the default pipeline's summaries and overlay tables. A change
    to a stage's code, parameters or command committed without re-running the pipeline would
    make `make run` on a fresh clone rewrite dvc.lock (git status not clean), and `dvc exp
    show` would pair the commit's numbers with other code. Code, params and the outputs git
    tracks (summaries, overlays) count; the other outputs do not (a fresh clone has none until
    `make run`; a working copy may hold older ones). Run on a fresh clone, as CI does."""
    import json
    import subprocess
    import sys

    dvc = Path(sys.executable).parent / "dvc"
    done = subprocess.run([str(dvc), "status", "--json"], cwd=SRC.parent, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    import yaml

    spec = yaml.safe_load((SRC.parent / "dvc.yaml").read_text())
    # outputs, cut before any ${...} of a matrix stage (data/partitions/${item.alpha})
    produced = [str(next(iter(o)) if isinstance(o, dict) else o).split("${")[0].rstrip("/")
                for stage in spec["stages"].values()
                for o in stage.get("outs", []) + stage.get("metrics", [])]

    def source(path: str) -> bool:  # not (inside, or a folder of) another stage's output
        return not any(path == o or path.startswith(o + "/") or o.startswith(path + "/")
                       for o in produced)

    stale = {}
    for stage, changes in json.loads(done.stdout or "{}").items():
        for change in changes:
            if change == "always changed":  # the check stage: it runs on every repro
                continue
            if not isinstance(change, dict):
                stale.setdefault(stage, []).append(change)
                continue
            deps = {path: state for path, state in change.get("changed deps", {}).items()
                    if source(path)}
            # the outputs git tracks are there in a fresh clone: they must be dvc.lock's
            deps.update({path: state for path, state in change.get("changed outs", {}).items()
                         if path in GIT_TRACKED_OUTPUTS})
            other = {k: v for k, v in change.items() if k not in ("changed deps", "changed outs")}
            if deps or other:
                stale.setdefault(stage, []).append({**other, **({"changed deps": deps}
                                                                  if deps else {})})
    assert not stale, (f"dvc.lock is stale: {stale}; run `make run` (dvc repro) and commit "
                       "dvc.lock, summary/ and overlays/")


STAGES = [stage.name for stage in DECLARED_STAGES]


def test_no_import_runs_back_up_to_the_stages():
    """The stages sit on top of the library: apart from the stages themselves, only what runs
    them (the command, the presets) imports a module of dpclip.stages."""
    from dpclip.code_closure import direct_imports, package_modules

    runners = {"dpclip.tools.bench", "dpclip.runner"}
    back = {m: sorted(d for d in direct_imports(m) if d.startswith("dpclip.stages."))
            for m in package_modules() if not m.startswith("dpclip.stages") and m not in runners}
    assert {m: d for m, d in back.items() if d} == {}


# the package's layers, bottom up: a module imports its own layer's modules and those below,
# never above (the first part of the name after dpclip. decides; a new one must be placed)
LAYERS = (
    ("foundation", {"errors", "files", "hashing", "numerics", "threads", "randomness",
                    "registry", "param_types", "run_keys", "layout", "trace_columns", "summaries",
                    "code_closure", "catalog", "claim_checks"}),
    ("schema", {"config"}),  # knows no plugin family
    ("domain", {"privacy", "models", "data", "methods", "attacks", "train", "audit", "metrics",
                "pretraining"}),  # the training library reads no pipeline file
    ("outputs", {"stage_outputs", "retire", "reporting"}),
    ("pipeline", {"pipeline"}),  # declarations, params, a run's inputs, provenance
    ("stages", {"stages", "tracking", "runner"}),
    ("tools", {"cli", "tools", "api"}),  # the user commands that are no stage: dpclip.tools
)


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) == 1:
        return 0  # the package itself
    return next((i for i, (_, names) in enumerate(LAYERS) if parts[1] in names), None)


def test_every_import_stays_in_its_layer_or_goes_down():
    """The import graph sorted by layer: before, config imported every plugin family (and
    attacks.common.layerwise imported config back), train.inputs read artifacts and tuned
    values, and tuned imported the parameter validation."""
    from dpclip.code_closure import direct_imports, package_modules

    unplaced = sorted(m for m in package_modules() if _layer(m) is None)
    assert not unplaced, f"place these in a layer of tests/test_structure.py: {unplaced}"
    upward = [f"{m} ({LAYERS[_layer(m)][0]}) imports {d} ({LAYERS[_layer(d)][0]})"
              for m in sorted(package_modules()) for d in sorted(direct_imports(m))
              if _layer(d) > _layer(m)]
    assert not upward, upward


# the modules that import a module whose name is computed (not a literal), and what they load
BY_COMPUTED_NAME = {
    "dpclip.runner": "the declared stages (dpclip.stages.*, its own layer)",
    "dpclip.registry": "the modules of the family that owns the registry (it passes its own "
                       "package's name)",
    "dpclip.train.runs": "its own modules (pkgutil.iter_modules)",
    "dpclip.cli": "in _load, the literal names its callers pass (counted as imports above)",
    "dpclip.models": "the module of the user's own model that train.model names (not dpclip's)",
}


def _imports_by_name(module: str, path: Path) -> tuple[list[str], bool]:
    """The dpclip modules ``module`` imports by a literal name (``importlib.import_module``,
    the CLI's ``_load``), and whether it also imports one by a computed name."""
    literal, computed = [], False
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and node.args and (
                getattr(node.func, "attr", None) == "import_module"
                or getattr(node.func, "id", None) in ("import_module", "_load")):
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                literal += [arg.value] if arg.value.startswith("dpclip") else []
            else:
                computed = True
    return literal, computed


def test_every_import_by_name_stays_in_its_layer_or_goes_down():
    """``importlib`` hides an import from the AST's import statements: a literal name counts
    as an import; a computed one is allowed only where listed, with what it loads."""
    from dpclip.code_closure import package_modules

    upward, unlisted = [], []
    for module, path in sorted(package_modules().items()):
        literal, computed = _imports_by_name(module, path)
        upward += [f"{module} loads {name}" for name in literal
                   if _layer(name) > _layer(module)]
        if computed and module not in BY_COMPUTED_NAME:
            unlisted.append(module)
    assert not upward and not unlisted, (upward, unlisted)
    assert "dpclip.pipeline.provenance" in _imports_by_name(
        "dpclip.runner", package_modules()["dpclip.runner"])[0]


def test_the_schema_imports_no_plugin_family():
    from dpclip.code_closure import closure

    families = ("dpclip.methods", "dpclip.attacks", "dpclip.data", "dpclip.train")
    assert not [m for m in closure(["dpclip.config"]) if m.startswith(families)]


def test_no_stage_imports_another_stage():
    """What a stage wrote is read through dpclip.stage_outputs (and a run's inputs through
    dpclip.pipeline.inputs), so a stage's code does not include another stage's."""
    from dpclip.code_closure import direct_imports

    for stage in STAGES:
        others = {f"dpclip.stages.{s}" for s in STAGES if s != stage}
        imported = direct_imports(f"dpclip.stages.{stage}") & others
        assert not imported, f"dpclip.stages.{stage} imports {sorted(imported)}"
