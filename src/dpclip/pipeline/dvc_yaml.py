"""``dvc.yaml``, generated from the stage declarations (:mod:`dpclip.catalog`).

    python -m dpclip.pipeline.dvc_yaml            # print it
    python -m dpclip.pipeline.dvc_yaml --write    # write it (the committed file must equal it)
    python -m dpclip.pipeline.dvc_yaml --untracked  # the outputs `make clean` removes

Each stage's dependencies are its data inputs, ``requirements.lock`` (the exact versions
installed) and its code: every module of the package its command imports, ``cli.py``
included, and every module of the plugin families it runs (:func:`stage_code`). No line of the
file is written by hand; comments come from the declarations.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from dpclip.code_closure import PACKAGE, ROOT_NAME, closure_files, package_modules
from dpclip.catalog import PER_ALPHA, PLOTS, STAGES, Output, Stage, untracked_outputs

PROJECT = PACKAGE.parent.parent
LOCK_FILE = "requirements.lock"
HEADER = """\
# GENERATED from src/dpclip/catalog.py by `python -m dpclip.pipeline.dvc_yaml --write`
# (`make dvc.yaml`): edit the declarations, not this file.
# Stage logic lives in src/dpclip/stages; each command is the `dpclip` CLI. Methods, target
# epsilons, alphas and seeds are the axes of the runs: adding one value trains and evaluates
# only the new runs. Run names follow the metrics contract: <method>-eps<epsilon>-<alpha>-seed<seed>.
# A stage depends on every module its command imports (cli.py included), on every module of
# the plugin families it runs, and on requirements.lock."""
PLOTS_HEADER = """\
# `dvc plots show` / `dvc plots diff main`: every configured run in one plot (templates in
# .dvc/plots colour by run and give each revision its own point shape and line dash). `make
# install` makes the HTML page render offline (.dvc/plots/offline.html, set in
# .dvc/config.local)."""


def code_roots(stage: Stage, package: Path = PACKAGE) -> list[str]:
    """The modules a stage's command starts from: the CLI, the stage's module, and every
    module of each plugin family the stage runs (found by name at run time, so no import
    reaches them)."""
    roots = [f"{ROOT_NAME}.cli", f"{ROOT_NAME}.runner", stage.module]
    for family in stage.runs:
        roots += [name for name in package_modules(package)
                  if name.startswith(f"{ROOT_NAME}.{family}.")]
    return roots


def stage_code(stage: Stage, package: Path = PACKAGE) -> list[str]:
    """The stage's code dependencies (``src/dpclip/...``): a folder whole where the stage's
    code holds every module in it (a plugin family it runs: a new plugin file changes no line
    of dvc.yaml), the other files one by one."""
    code = set(closure_files(code_roots(stage, package), package))
    every = [modules.relative_to(package).as_posix()
             for modules in package_modules(package).values()]
    deps = set()
    for path in code:
        parts = path.split("/")[:-1]
        whole = next((folder for folder in ("/".join(parts[:i]) for i in range(1, len(parts) + 1))
                      if all(f in code for f in every if f.startswith(folder + "/"))), path)
        deps.add(whole)
    return [f"src/{ROOT_NAME}/{dep}" for dep in sorted(deps)]


def _scalar(value) -> str:
    """One YAML scalar, quoted only where YAML needs it."""
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip() \
        .removesuffix("\n...").removesuffix("...").strip()


def _comment(text: str, indent: str, width: int = 96) -> list[str]:
    """``text`` as comment lines of at most ``width`` characters."""
    lines, line = [], ""
    for word in text.split():
        if line and len(indent) + 2 + len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return [f"{indent}# {line}" for line in [*lines, line] if line]


def _note(text: str) -> str:
    return f"  # {text}" if text else ""


def _outputs(key: str, outputs: tuple[Output, ...]) -> list[str]:
    if not outputs:
        return []
    lines = [f"    {key}:"]
    for out in outputs:
        options = {k: v for k, v in (("cache", out.cache), ("persist", out.persist))
                   if v != {"cache": True, "persist": False}[k]}
        if not options:
            lines.append(f"      - {out.path}{_note(out.note)}")
            continue
        lines.append(f"      - {out.path}:{_note(out.note)}")
        lines += [f"          {k}: {_scalar(v)}" for k, v in options.items()]
    return lines


def render_stage(stage: Stage, package: Path = PACKAGE) -> list[str]:
    lines = _comment(f"{stage.name}: {stage.comment}", "  ") if stage.comment else []
    lines.append(f"  {stage.name}:")
    if stage.scope == PER_ALPHA:
        lines += ["    matrix:", "      alpha: ${partition.alphas}"]
    lines.append(f"    cmd: {stage.command}")
    if stage.always_changed:
        lines.append("    always_changed: true")
    lines.append("    deps:")
    lines += [f"      - {dep}{_note(stage.notes.get(dep, ''))}" for dep in stage.all_deps]
    lines.append(f"      - {LOCK_FILE}")
    lines += [f"      - {path}" for path in stage_code(stage, package)]
    if stage.all_params:
        lines.append("    params:")
        lines += [f"      - {p}{_note(stage.notes.get(p, ''))}" for p in stage.all_params]
    lines += _outputs("metrics", stage.metrics)
    lines += _outputs("outs", stage.outs)
    return lines


def render_plots() -> list[str]:
    lines = [PLOTS_HEADER, "plots:"]
    for path, options, comment in PLOTS:
        lines += _comment(comment, "  ")
        lines.append(f"  - {path}:")
        for key, value in options.items():
            if isinstance(value, dict):
                lines.append(f"      {key}:")
                lines += [f"        {k}: {_scalar(v)}" for k, v in value.items()]
            else:
                lines.append(f"      {key}: {_scalar(value)}")
    return lines


def render(package: Path = PACKAGE) -> str:
    """The whole of dvc.yaml."""
    lines = [HEADER, "stages:"]
    for i, stage in enumerate(STAGES):
        lines += ([""] if i else []) + render_stage(stage, package)
    return "\n".join([*lines, "", *render_plots()]) + "\n"


def write(target: Path = PROJECT / "dvc.yaml") -> bool:
    """Write dvc.yaml; True when it changed."""
    text = render()
    changed = not target.is_file() or target.read_text() != text
    if changed:
        target.write_text(text)
    return changed


if __name__ == "__main__":
    if sys.argv[1:] == ["--untracked"]:
        print(" ".join(untracked_outputs()))
    elif sys.argv[1:] == ["--write"]:
        target = PROJECT / "dvc.yaml"
        print(f"{target}: {'written' if write(target) else 'already current'}")
    else:
        print(render(), end="")
