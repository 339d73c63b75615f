"""Outputs of runs no longer configured leave the folders DVC hashes, and trained ones come
back.

DVC hashes an output folder as a whole (``runs/``, ``traces/``, ``audits/``): it must hold the
configured runs only, or ``dvc.lock`` would depend on which runs were configured before (a
fresh clone's repro would then change it). What a run trained is not thrown away: it moves to
``.dpclip/retired/<run>/`` and moves back when the run is configured again, where its
provenance decides whether it is reused. Measurements (an evaluation) are removed instead:
they are recomputed in about a second if the run comes back.

A run's parts are path patterns (``runs/{run}``, ``traces/{run}.csv``) named by their folder
(:meth:`dpclip.catalog.PerRun.parts`).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from dpclip.layout import Layout

log = logging.getLogger(__name__)


def _path(layout: Layout, pattern: str, run: str) -> Path:
    return layout.root / pattern.format(run=run)


def present(parts: dict[str, str], layout: Layout) -> set[str]:
    """The runs with an entry in any part's folder."""
    found = set()
    for pattern in parts.values():
        folder, suffix = pattern.split("{run}")
        found |= {entry.name.removesuffix(suffix)
                  for entry in (layout.root / folder).glob(f"*{suffix}")}
    return found


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def set_aside(configured: set[str], parts: dict[str, str], layout: Layout
              ) -> dict[str, list[str]]:
    """Move each part of every run present and not ``configured`` to
    ``.dpclip/retired/<run>/<part>``; move the waiting parts of configured runs back."""
    moved: dict[str, list[str]] = {"retired": [], "restored": []}
    for run in sorted(present(parts, layout) - configured):
        for name, pattern in parts.items():
            path, target = _path(layout, pattern, run), layout.retired(run) / name
            if path.exists():
                _remove(target)  # an older copy set aside before
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(path), str(target))
        moved["retired"].append(run)
    for run in sorted(configured):
        back = [(layout.retired(run) / name, _path(layout, pattern, run))
                for name, pattern in parts.items()]
        back = [(waiting, path) for waiting, path in back if waiting.exists()
                and not path.exists()]
        for waiting, path in back:
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(waiting), str(path))
        if back:
            moved["restored"].append(run)
            if not any(layout.retired(run).iterdir()):  # other stages' parts may still wait
                layout.retired(run).rmdir()
    if moved["retired"]:
        log.info("set aside %d runs no longer configured in %s", len(moved["retired"]),
                 layout.retired("").parent)
    return moved


def remove(configured: set[str], parts: dict[str, str], layout: Layout) -> list[str]:
    """Delete every part of each run present and not ``configured``."""
    gone = sorted(present(parts, layout) - configured)
    for run in gone:
        for pattern in parts.values():
            _remove(_path(layout, pattern, run))
    if gone:
        log.info("removed the outputs of %d runs no longer configured", len(gone))
    return gone
