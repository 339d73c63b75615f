"""check: the parameters checked and the data files they name fingerprinted, before any other
stage runs.

DVC cannot list a file that params.yaml names (``data.path``, ``data.shadow_path``: a CSV of
your own, a folder of MNIST files) as a dependency, since its path is a parameter. This stage
runs on every ``dvc repro`` (``always_changed``) and writes ``data/sources.json``: the SHA-256
of each named file or folder (:func:`dpclip.hashing.file_hash`, as DVC hashes its own
dependencies). The prepare stage depends on that file, so an edited CSV re-runs prepare and
everything after it, and an unchanged one leaves them up to date.

A model of the user's own (``train.model: path/to/file.py:factory``) is fingerprinted the
same way, with the Python files beside it (which it may import), in ``data/model_file.json`` (empty for a built-in model): the stages that build the
model (shadow, tune, and each run of train, audit and reference) read it, so an edited model
file re-runs them, while prepare and partition stay up to date.

It also goes first for bad parameters: the ``dpclip`` command refuses them before the stage
function runs, so DVC stops here, before it deletes any other stage's outputs.
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
    path = model_file(params.train.model)
    if path is not None:
        if not path.is_file():
            raise DpclipError(bad_value("train.model", params.train.model,
                                        f"names no file ({path}; paths are relative to the "
                                        f"project root)"))
        model = {"train.model": {"path": str(path), "sha256": file_hash(path),
                                 "beside": beside(path)}}
    else:
        model = {}
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
