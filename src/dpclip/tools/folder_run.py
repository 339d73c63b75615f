"""The whole pipeline in a project folder of its own, from a parameters mapping: a preset's
variant (:mod:`dpclip.tools.presets`) and ``dpclip advise``'s project stand on it side by side."""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from dpclip.catalog import BY_NAME
from dpclip.tools.cost import cost_text, training_cost
from dpclip.files import write_text
from dpclip.layout import Layout
from dpclip.pipeline.params import load_params
from dpclip.pipeline.provenance import is_current
from dpclip.run_keys import configured_runs
from dpclip.runner import run_stages


def expected_cost(params, layout: Layout) -> dict:
    """The expected training time of the runs that are not up to date (:mod:`dpclip.tools.bench`)."""
    stale = [key for key in configured_runs(params)
             if not is_current(BY_NAME["train"], params, key, layout)]
    return training_cost(params, layout, stale) if stale else {
        "runs": 0, "seconds": 0.0, "seconds_all": 0.0, "methods": {}}


def run_in_folder(raw: dict, root: Path, track: bool = False, progress: bool = True,
                jobs: int = 1) -> float:
    """Write ``root/params.yaml`` and run every stage into ``root``, ``jobs`` runs side by side
    in the per-run stages; the wall time in s. Before training, the expected training time of
    the runs to train is printed."""
    params_path = root / "params.yaml"
    root.mkdir(parents=True, exist_ok=True)
    write_text(params_path, yaml.safe_dump(raw, sort_keys=False))
    params = load_params(params_path)  # validated before any work
    layout = Layout(root)
    started = time.perf_counter()

    def before(stage) -> None:  # the expected training time, before the first per-run stage
        if progress and stage.name == "train":
            print(cost_text(expected_cost(params, layout)), flush=True)

    run_stages(params, layout, progress=progress, before=before, track=track, jobs=jobs)
    return time.perf_counter() - started
