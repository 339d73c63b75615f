"""Outputs of runs no longer configured wait outside DVC's outputs, and come back.

DVC hashes an output folder as a whole (``runs/``, ``traces/``, ``audits/``): it must hold the
configured runs only, or ``dvc.lock`` would depend on which runs were configured before (a
fresh clone's repro would then change it). What a run trained is not thrown away: it moves to
``.dpclip/retired/<run>/`` and moves back when the run is configured again, where its
provenance decides whether it is reused.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Callable

from dpclip.layout import Layout

log = logging.getLogger(__name__)


def set_aside(configured: set[str], folder: Path, parts: Callable[[str], dict[str, Path]],
              layout: Layout) -> dict[str, list[str]]:
    """For every run with an entry in ``folder`` (one sub-folder per run) that is not
    ``configured``, move its ``parts(run)`` ({name: path}) to ``.dpclip/retired/<run>/<name>``;
    for every configured run without an entry, move its waiting parts back."""
    moved: dict[str, list[str]] = {"retired": [], "restored": []}
    for entry in sorted(folder.iterdir()) if folder.exists() else []:
        if entry.is_dir() and entry.name not in configured:
            for name, path in parts(entry.name).items():
                if path.exists():
                    target = layout.retired(entry.name) / name
                    if target.is_dir():  # an older copy set aside before
                        shutil.rmtree(target)
                    target.unlink(missing_ok=True)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.move(str(path), str(target))
            moved["retired"].append(entry.name)
            log.info("set aside %s (no longer configured) in %s", entry.name,
                     layout.retired(entry.name))
    for run in sorted(configured):
        waiting = {name: layout.retired(run) / name for name in parts(run)}
        if (folder / run).exists() or not any(p.exists() for p in waiting.values()):
            continue
        for name, path in parts(run).items():
            if waiting[name].exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(waiting[name]), str(path))
        if not any(layout.retired(run).iterdir()):  # other stages' parts may still wait
            layout.retired(run).rmdir()
        moved["restored"].append(run)
    return moved
