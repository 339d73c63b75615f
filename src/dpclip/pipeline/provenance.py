"""Per-run caching inside the stages DVC starts once for all configured runs (``train``,
``audit``, ``reference``, ``evaluate``) and the shadow model. Every run records its
``provenance.json`` once its outputs are complete: the parameters and hashes of what it read
(what its stage declares of each run, :class:`dpclip.catalog.PerRun`) and the hashes of what it
wrote. A run is up to date when its recorded inputs equal the current ones and its outputs are
unchanged: ``dvc status``'s rule, per run. Why: docs/pipeline.md, "What re-runs when something
changes".
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Iterator

from dpclip.attacks import get_attack
from dpclip.catalog import SHADOW_RISK, Stage
from dpclip.code_closure import PACKAGE, closure_files, package_modules
from dpclip.config import option_values
from dpclip.hashing import file_hash
from dpclip.files import read_json, write_json
from dpclip.layout import Layout
from dpclip.methods import get_method
from dpclip.run_keys import RunKey, alpha_tag, configured_runs
from dpclip.pipeline.side_by_side import run_side_by_side
from dpclip.pipeline.tuned import tuned_values, value_at
from dpclip.threads import thread_count

READ = object()  # inputs(): read the run's tuned values (none were given)


def shadow_key(params):
    """The shadow model as a run: trained by the ``non_private`` method (no privacy: public
    data) with ``shadow.seed`` on the ``shadow.alpha`` skew of the public split."""
    return SimpleNamespace(name="shadow", method="non_private", epsilon=None,
                           alpha=params.shadow.alpha, seed=params.shadow.seed)


def _files(layout: Layout, patterns, key) -> dict[str, Path]:
    """label (the pattern filled in) -> path, for the run ``key``."""
    labels = [p.format(run=key.name, alpha=alpha_tag(key.alpha)) for p in patterns]
    return {label: layout.root / label for label in labels}


def reads(stage: Stage, layout: Layout, key) -> dict[str, Path]:
    """The run's input files (labels relative to the project root)."""
    runs = stage.per_run
    patterns = list(runs.reads)
    if runs.shadow_risk and get_method(key.method).needs_shadow_risk:
        patterns.append(SHADOW_RISK)
    return _files(layout, patterns, key)


def writes(stage: Stage, layout: Layout, key) -> dict[str, Path]:
    """The run's output files; an optional one only when it was written."""
    runs = stage.per_run
    files = {name: _files(layout, [pattern], key) for name, pattern in runs.writes.items()}
    return {label: path for name, found in files.items() for label, path in found.items()
            if name not in runs.optional or path.exists()}


def code_files(stage: Stage, method: str, params=None) -> dict[str, Path]:
    """label -> file of the run's code: the import closure (:mod:`dpclip.code_closure`) of
    the stage's module, the run's method's module and the attacks ``params`` chooses; a
    plugin's module outside the package counts as its own file."""
    modules = [get_method(method).__module__]
    if stage.per_run.chosen_attacks and params is not None:
        modules += [get_attack(kind).__module__ for kind in params.attack.kinds]
    # a module the package's folder holds (a plugin folder added to a package's search
    # path gives its modules the package's names, but not a file there)
    inside = [m for m in modules if m in package_modules(PACKAGE)]
    files = {f"src/dpclip/{f}": PACKAGE / f
             for f in closure_files([stage.module, *inside], PACKAGE)}
    files.update({f"plugin:{m}": Path(sys.modules[m].__file__)
                  for m in modules if m not in inside})
    return files


def inputs(stage: Stage, params, key, layout: Layout, tuned=READ) -> dict:
    """The run's inputs: parameter values and file hashes (``key``: a
    :class:`~dpclip.run_keys.RunKey`). ``tuned``: the run's tuned values when the caller has
    resolved the run already (:func:`dpclip.pipeline.inputs.run_inputs`); read otherwise."""
    runs = stage.per_run
    tree = params.to_dict()
    values = {k: value_at(tree, k) for k in runs.params}
    if "train.threads" in values:  # results depend on the count, not on the setting
        values["train.threads"] = thread_count(values["train.threads"])
    if runs.method_options:
        values[f"methods.{key.method}"] = option_values(params.method_options(key.method))
    files = {label: file_hash(path)
             for label, path in code_files(stage, key.method, params).items()}
    files.update({label: file_hash(path) for label, path in reads(stage, layout, key).items()})
    run = {"method": key.method, "epsilon": key.epsilon, "alpha": key.alpha, "seed": key.seed}
    found = {"run": run, "params": values, "files": files}
    if runs.tuned_values:  # the run's own entry of tuned/tuned.json (dpclip.pipeline.tuned)
        found["tuned"] = tuned_values(params, layout, key.method, key.epsilon) \
            if tuned is READ else tuned
    # JSON round trip: the values compare equal to what a provenance file holds
    return json.loads(json.dumps(found, default=str))


def record_path(stage: Stage, layout: Layout, key) -> Path:
    return layout.root / stage.per_run.record.format(run=key.name)


def record(stage: Stage, layout: Layout, key, found: dict) -> Path:
    """Write the run's provenance: its inputs ``found`` before it ran, and its outputs' hashes."""
    outputs = {label: file_hash(path) for label, path in writes(stage, layout, key).items()}
    missing = [label for label, digest in outputs.items() if digest is None]
    if missing:
        raise RuntimeError(f"{stage.name} of {key.name} did not write {missing}")
    return write_json(record_path(stage, layout, key),
                      {"stage": stage.name, "inputs": found, "outputs": outputs})


def is_current(stage: Stage, params, key, layout: Layout) -> bool:
    """Whether the run's recorded inputs equal the current ones and its outputs are as
    recorded (a missing or edited output makes the run stale, as in DVC)."""
    path = record_path(stage, layout, key)
    if not path.is_file():
        return False
    try:
        recorded = read_json(path)
    except ValueError:
        return False
    if recorded.get("inputs") != inputs(stage, params, key, layout):
        return False
    outputs = writes(stage, layout, key)
    return recorded.get("outputs", {}).keys() == outputs.keys() and all(
        file_hash(path) == recorded["outputs"][label] for label, path in outputs.items())


def reuse(stage: Stage, params, key, layout: Layout) -> dict | None:
    """The run's result when it is up to date; None when it must run."""
    if not is_current(stage, params, key, layout):
        return None
    result = stage.per_run.writes[stage.per_run.result].format(run=key.name)
    return read_json(layout.root / result)


def each_run(stage: Stage, params, layout: Layout, run: Callable[[RunKey], dict],
             force: bool = False, jobs: int = 1) -> Iterator[tuple[RunKey, dict | None]]:
    """Call ``run`` on every configured run that is not up to date (every run with
    ``force``); yield (run, its result, or None when it was up to date), in the configured
    order. With ``jobs`` > 1 the runs to do go ``jobs`` at a time in worker processes
    (:mod:`dpclip.pipeline.side_by_side`; ``run`` must pickle: :func:`for_key`)."""
    keys = configured_runs(params)
    stale = [key for key in keys if force or not is_current(stage, params, key, layout)]
    if jobs > 1 and len(stale) > 1:
        done = run_side_by_side(run, stale, jobs, stage.name)
    else:
        done = ((key, run(key)) for key in stale)
    for key in keys:
        yield next(done) if key in stale else (key, None)


def for_key(function: Callable, params, layout: Layout, **options) -> Callable[[RunKey], dict]:
    """A stage's run function ``function(params, method, epsilon, alpha, seed, layout,
    **options)`` as a function of the run's key that pickles (by reference to ``function``),
    so side-by-side runs can send it to their workers."""
    return functools.partial(_call_for_key, function, params, layout, options)


def _call_for_key(function: Callable, params, layout: Layout, options: dict, key: RunKey
                  ) -> dict:
    return function(params, key.method, key.epsilon, key.alpha, key.seed, layout, **options)
