"""Per-run caching inside the per-run stages (``train``, ``audit``, ``reference``,
``evaluate``), which DVC starts once for all configured runs.

Why one command for all runs: starting Python with torch, Opacus and scikit-learn costs about
5 s on a 2-core machine, while a default run trains in about 1 s, so one DVC stage per run
spent most of the pipeline importing (the command's runs go side by side in worker processes:
:mod:`dpclip.pipeline.side_by_side`). Merging the runs into
one stage must not lose what the per-run stages gave: adding a method, or changing one method's
options or module, re-runs only that method's runs.

So every run records its ``provenance.json`` after its outputs are complete: the parameters and
the hashes of the files it read (the keys and paths a per-run DVC stage would list) and the
hashes of what it wrote. A run is up to date when its recorded inputs equal the current ones and
its outputs are unchanged, the rule ``dvc status`` applies to a stage, applied per run.
``dvc.yaml`` lists the union of every run's inputs, so DVC starts the stage whenever any run may
be stale, and the stage recomputes only the stale runs.
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from types import SimpleNamespace
from pathlib import Path
from typing import Callable, Iterator

from dpclip.attacks import get_attack
from dpclip.code_closure import PACKAGE, closure_files, package_modules
from dpclip.config import option_values
from dpclip.hashing import file_hash
from dpclip.io import read_json, write_json
from dpclip.layout import Layout
from dpclip.methods import get_method
from dpclip.naming import RunKey, alpha_tag, configured_runs
from dpclip.threads import thread_count
from dpclip.pipeline.side_by_side import run_side_by_side
from dpclip.pipeline.tuned import tuned_values


def _lookup(tree: dict, dotted: str):
    for part in dotted.split("."):
        tree = tree[part]
    return tree


READ = object()  # RunStage.inputs: read the run's tuned values (none were given)


@dataclass(frozen=True)
class RunStage:
    """What one run of a stage reads and writes.

    ``params``: keys of params.yaml every run reads, dotted; each run also reads its own method's
    ``methods.<method>`` section when ``reads_method_options``. ``code``: the stage's modules;
    a run's code inputs are every file they and its method's module import, transitively
    (:func:`code_files`). ``data``: the run's input files under the project
    root, ``outputs``: its output files, ``provenance``: where its record goes, ``result``: the
    output that the stage function returns (as JSON).
    """

    name: str
    params: tuple[str, ...]
    code: tuple[str, ...]
    reads_method_options: bool
    data: Callable[[Layout, object], dict[str, Path]]
    outputs: Callable[[Layout, object], dict[str, Path]]
    provenance: Callable[[Layout, object], Path]
    result: Callable[[Layout, object], Path]
    reads_tuned_values: bool = False  # trains the run's configuration (dpclip.pipeline.tuned)
    # the modules of the parts params.yaml chooses that every run uses (the attacks of
    # attack.kinds); they are code roots like the stage's own
    chosen_code: Callable[[object], tuple[str, ...]] = lambda params: ()

    def code_files(self, method: str, params=None) -> dict[str, Path]:
        """label -> file of the run's code: the import closure (:mod:`dpclip.code_closure`) of
        the stage's modules, the run's method's module and the modules ``params`` chooses
        (``chosen_code``); a plugin's module outside the package counts as its own file."""
        modules = [get_method(method).__module__,
                   *(self.chosen_code(params) if params is not None else ())]
        # a module the package's folder holds (a plugin folder added to a package's search
        # path gives its modules the package's names, but not a file there)
        inside = [m for m in modules if m in package_modules(PACKAGE)]
        files = {f"src/dpclip/{f}": PACKAGE / f
                 for f in closure_files([*self.code, *inside], PACKAGE)}
        files.update({f"plugin:{m}": Path(sys.modules[m].__file__)
                      for m in modules if m not in inside})
        return files

    def inputs(self, params, key, layout: Layout, tuned=READ) -> dict:
        """The run's inputs: parameter values and file hashes (``key``: a
        :class:`~dpclip.naming.RunKey`). ``tuned``: the run's tuned values when the caller has
        resolved the run already (:func:`dpclip.pipeline.inputs.run_inputs`); read otherwise."""
        tree = params.to_dict()
        values = {k: _lookup(tree, k) for k in self.params}
        if "train.threads" in values:  # results depend on the count, not on the setting
            values["train.threads"] = thread_count(values["train.threads"])
        if self.reads_method_options:
            values[f"methods.{key.method}"] = option_values(params.method_options(key.method))
        files = {label: file_hash(path)
                 for label, path in self.code_files(key.method, params).items()}
        files.update({label: file_hash(path) for label, path in self.data(layout, key).items()})
        run = {"method": key.method, "epsilon": key.epsilon, "alpha": key.alpha,
               "seed": key.seed}
        inputs = {"run": run, "params": values, "files": files}
        if self.reads_tuned_values:  # the run's own entry of tuned/tuned.json (dpclip.pipeline.tuned):
            inputs["tuned"] = tuned_values(params, layout, key.method, key.epsilon) \
                if tuned is READ else tuned
        # JSON round trip: the values compare equal to what a provenance file holds
        return json.loads(json.dumps(inputs, default=str))

    def record(self, layout: Layout, key, inputs: dict) -> Path:
        """Write the run's provenance: ``inputs`` (taken before it ran) and its outputs' hashes."""
        outputs = {label: file_hash(path) for label, path in self.outputs(layout, key).items()}
        missing = [label for label, digest in outputs.items() if digest is None]
        if missing:
            raise RuntimeError(f"{self.name} of {key.name} did not write {missing}")
        return write_json(self.provenance(layout, key),
                          {"stage": self.name, "inputs": inputs, "outputs": outputs})

    def is_current(self, params, key, layout: Layout) -> bool:
        """Whether the run's recorded inputs equal the current ones and its outputs are as
        recorded (a missing or edited output makes the run stale, as in DVC)."""
        path = self.provenance(layout, key)
        if not path.is_file():
            return False
        try:
            recorded = read_json(path)
        except ValueError:
            return False
        if recorded.get("inputs") != self.inputs(params, key, layout):
            return False
        outputs = self.outputs(layout, key)
        return recorded.get("outputs", {}).keys() == outputs.keys() and all(
            file_hash(path) == recorded["outputs"][label] for label, path in outputs.items())

    def reuse(self, params, key, layout: Layout) -> dict | None:
        """The run's result when it is up to date; None when it must run."""
        if not self.is_current(params, key, layout):
            return None
        return read_json(self.result(layout, key))

    def each_run(self, params, layout: Layout, run: Callable[[RunKey], dict],
                 force: bool = False, jobs: int = 1) -> Iterator[tuple[RunKey, dict | None]]:
        """Call ``run`` on every configured run that is not up to date (every run with
        ``force``); yield (run, its result, or None when it was up to date), in the configured
        order. With ``jobs`` > 1 the runs to do go ``jobs`` at a time in worker processes
        (:mod:`dpclip.pipeline.side_by_side`; ``run`` must pickle: :func:`for_key`)."""
        keys = configured_runs(params)
        stale = [key for key in keys if force or not self.is_current(params, key, layout)]
        if jobs > 1 and len(stale) > 1:
            done = run_side_by_side(run, stale, jobs, self.name)
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


def _train_data(layout: Layout, key) -> dict[str, Path]:
    tag = alpha_tag(key.alpha)
    data = {"data/prepared": layout.prepared, f"data/partitions/{tag}": layout.partition(tag)}
    if get_method(key.method).needs_shadow_risk:
        data["shadow/risk.json"] = layout.shadow_risk
    return data


def _train_outputs(layout: Layout, key) -> dict[str, Path]:
    return {f"runs/{key.name}/model.pt": layout.run_dir(key.name) / "model.pt",
            f"runs/{key.name}/record.json": layout.run_dir(key.name) / "record.json",
            f"traces/{key.name}.csv": layout.trace(key.name)}


TRAIN = RunStage(
    name="train",
    params=("privacy.delta", "privacy.accountant", "privacy.epsilon_tolerance",
            "privacy.secure_noise", "train.model", "train.hidden", "train.epochs",
            "train.batch_size", "train.optimizer", "train.lr", "train.momentum",
            "train.clip_norm", "train.early_stopping", "train.threads", "train.public_init"),
    code=("dpclip.stages.train",),
    reads_method_options=True,
    data=_train_data,
    outputs=_train_outputs,
    provenance=lambda layout, key: layout.run_dir(key.name) / "provenance.json",
    result=lambda layout, key: layout.run_dir(key.name) / "record.json",
    reads_tuned_values=True,
)


AUDIT = RunStage(
    name="audit",
    params=TRAIN.params + ("audit",),
    code=("dpclip.stages.audit",),
    reads_method_options=True,
    data=_train_data,  # it trains the run's configuration again, with canaries
    outputs=lambda layout, key: {f"audits/{key.name}/audit.json": layout.audit(key.name)},
    provenance=lambda layout, key: layout.audit(key.name).parent / "provenance.json",
    result=lambda layout, key: layout.audit(key.name),
    reads_tuned_values=True,
)


REFERENCE = RunStage(
    name="reference",
    params=TRAIN.params + ("attack.references", "attack.mode", "attack.population", "data.seed"),
    code=("dpclip.stages.reference",),
    reads_method_options=True,
    data=_train_data,  # it trains the run's configuration on other data
    outputs=lambda layout, key: {
        f"references/{key.name}/{name}": layout.references(key.name) / name
        for name in ("signals.npz", "reference.json")},
    provenance=lambda layout, key: layout.references(key.name) / "provenance.json",
    result=lambda layout, key: layout.references(key.name) / "reference.json",
    reads_tuned_values=True,
)


def _evaluate_data(layout: Layout, key) -> dict[str, Path]:
    tag = alpha_tag(key.alpha)
    return {"data/prepared": layout.prepared, f"data/partitions/{tag}": layout.partition(tag),
            f"runs/{key.name}": layout.run_dir(key.name),
            f"traces/{key.name}.csv": layout.trace(key.name),
            f"audits/{key.name}/audit.json": layout.audit(key.name),  # merged into the metrics
            f"references/{key.name}/signals.npz":  # LiRA and RMIA
                layout.references(key.name) / "signals.npz"}


def _evaluate_outputs(layout: Layout, key) -> dict[str, Path]:
    outputs = {f"metrics/{key.name}.json": layout.metrics(key.name),
               f"summary/{key.name}.json": layout.summary(key.name),
               f"plots/roc/{key.name}.csv": layout.roc(key.name),
               f"plots/reliability/{key.name}.csv": layout.reliability(key.name),
               f"figures/{key.name}": layout.figures(key.name),
               f"scores/{key.name}.csv": layout.attack_scores(key.name)}
    if layout.ir_attack(key.name).exists():  # written when evaluate.ir_attack is on
        outputs[f"plots/ir_mia/{key.name}.csv"] = layout.ir_attack(key.name)
    return outputs


EVALUATE = RunStage(
    name="evaluate",
    params=("evaluate", "attack", "data.seed", "train.threads"),
    code=("dpclip.stages.evaluate",),
    chosen_code=lambda params: tuple(get_attack(kind).__module__
                                     for kind in params.attack.kinds),
    reads_method_options=False,
    data=_evaluate_data,
    outputs=_evaluate_outputs,
    provenance=lambda layout, key: layout.figures(key.name) / "provenance.json",
    result=lambda layout, key: layout.metrics(key.name),
)


def shadow_key(params):
    """The shadow model as a run: trained by the ``non_private`` method (no privacy: public
    data) with ``shadow.seed`` on the ``shadow.alpha`` skew of the public split."""
    return SimpleNamespace(name="shadow", method="non_private", epsilon=None,
                           alpha=params.shadow.alpha, seed=params.shadow.seed)


SHADOW = RunStage(
    name="shadow",
    # what dvc.yaml's shadow stage lists but train.methods, which decides whether it runs
    params=("shadow", "attack.classifier", "attack.folds", "attack.max_features",
            "attack.max_records", "train.model", "train.hidden", "train.optimizer", "train.lr",
            "train.momentum", "train.threads"),
    code=("dpclip.stages.shadow",),
    reads_method_options=False,
    data=lambda layout, key: {"data/prepared": layout.prepared},
    outputs=lambda layout, key: {f"shadow/{name}": layout.shadow / name
                                 for name in ("risk.json", "model.pt", "risk.png")},
    provenance=lambda layout, key: layout.shadow / "provenance.json",
    result=lambda layout, key: layout.shadow_risk,
)
