"""check: the parameters checked and the data files they name fingerprinted, before any other
stage runs.

DVC cannot depend on a path that is a parameter, so this stage runs on every ``dvc repro`` and
writes the SHA-256 of ``data.path`` and ``data.shadow_path`` (``data/sources.json``, read by
prepare) and of a model file of your own with the Python files beside it
(``data/model_file.json``, read by the stages that build the model). It goes first, so bad
parameters stop DVC before it deletes any outputs. See docs/pipeline.md, "Stages and the files
they write".
"""

from __future__ import annotations

import logging
from pathlib import Path

from dpclip.config import Params
from dpclip.errors import DpclipError, bad_value
from dpclip.hashing import file_hash
from dpclip.files import read_json, write_json
from dpclip.layout import Layout
from dpclip.models import model_file

log = logging.getLogger(__name__)
# what an edit of each named file makes DVC run again (``dvc status`` cannot tell: the file is
# named by a parameter, so only this stage sees it)
RE_RUNS = {"data.path": "prepare and every stage after it run again",
           "data.shadow_path": "prepare and every stage after it run again",
           "train.model": "the stages that build the model run again (shadow, tune, train, "
                          "audit, reference, evaluate, report)"}

NAMED_FILES = ("data.path", "data.shadow_path")


def check(params: Params, layout: Layout = Layout()) -> dict:
    """{key: {"path": as written, "sha256": of the file or folder}} for each key of
    :data:`NAMED_FILES` that params.yaml sets, and for ``train.model`` when it names a file; a
    path that names nothing is refused. The data files go to ``data/sources.json``, the model
    file to ``data/model_file.json``."""
    record = {}
    for key in NAMED_FILES:
        path = getattr(params.data, key.split(".")[1])
        if path is None:
            continue
        digest = file_hash(Path(path))
        if digest is None:
            raise DpclipError(bad_value(key, path, "names no file or folder"))
        record[key] = {"path": path, "sha256": digest}
    model, path = {}, model_file(params.train.model)
    if path is not None:
        if not path.is_file():
            raise DpclipError(bad_value("train.model", params.train.model,
                                        f"names no file ({path}; paths are relative to the "
                                        f"project root)"))
        model = {"train.model": {"path": str(path), "sha256": file_hash(path),
                                 "beside": beside(path)}}
    _say_what_changed(layout, {**record, **model})
    write_json(layout.sources, record)
    write_json(layout.model_source, model)
    return {**record, **model}


def _say_what_changed(layout: Layout, now: dict) -> None:
    """One line per named file whose content changed since the last check, with what that
    re-runs (nothing on the first check)."""
    if not layout.sources.is_file():
        return
    before = {**read_json(layout.sources),
              **(read_json(layout.model_source) if layout.model_source.is_file() else {})}
    for key in sorted({*before, *now}):
        if before.get(key) != now.get(key):
            log.info("%s changed since the last check: %s", key,
                     RE_RUNS.get(key, "the stages that read it run again"))


def beside(path: Path) -> dict:
    """{name: SHA-256} of the other Python files in a model file's folder, which it may
    import (an edit of one re-runs the stages that build the model)."""
    return {other.name: file_hash(other) for other in sorted(path.parent.glob("*.py"))
            if other.resolve() != path.resolve()}


def describe(record: dict, layout: Layout) -> str:
    """The line ``dpclip check`` prints."""
    if not record:
        return "parameters valid; no data file named (the source finds its own)"
    return "parameters valid; " + ", ".join(f"{key} {entry['path']} sha256 "
                                            f"{entry['sha256'][:12]}"
                                            for key, entry in record.items())
