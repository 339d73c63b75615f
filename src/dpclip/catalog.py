"""The catalog: every stage of the pipeline declared once, with its command, the parameters it
reads, its inputs and outputs, and whether it runs once, per alpha or per run.

Everything that runs or describes the stages (``dvc.yaml``, the ``dpclip`` subcommands, the
runner, the presets and the Prefect flow, provenance, :class:`~dpclip.layout.Layout`,
``make clean``) reads :data:`STAGES`; who reads what, and what a stage module defines:
docs/api/pipeline.md. This module imports nothing from the package, so reading the
declarations runs no stage code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ONCE, PER_ALPHA, PER_RUN = "once", "per_alpha", "per_run"
PLUGIN_FAMILIES = ("methods", "attacks", "data.sources")  # modules found at run time
# the axes of the runs: a per-run stage reads them all (dvc.yaml lists them)
RUN_AXES = ("train.methods", "privacy.target_epsilons", "partition.alphas", "train.seeds")
SHADOW_RISK = "shadow/risk.json"  # read by the methods that use the shadow stage's risk
TUNED = "tuned/tuned.json"
# written by the stages outside DVC's outputs: the wall times of training (they differ on
# every run)
UNTRACKED = ("timings",)


@dataclass(frozen=True)
class Output:
    """One output path of a stage, with DVC's options: ``cache: false`` keeps it out of DVC's
    cache (git tracks it); ``persist: true`` stops DVC from deleting it before the stage runs
    (the per-run stages keep the runs that are current)."""

    path: str
    cache: bool = True
    persist: bool = False
    note: str = ""  # a comment beside it in dvc.yaml


@dataclass(frozen=True)
class PerRun:
    """What one run of a stage reads and writes, recorded in its provenance file: the run is
    redone only when one of them changed (:mod:`dpclip.pipeline.provenance`). Paths are
    patterns: ``{run}`` is the run's name, ``{alpha}`` its partition's tag."""

    params: tuple[str, ...]  # params.yaml keys each run reads
    reads: tuple[str, ...]  # input files or folders
    writes: dict[str, str]  # name -> output file or folder: Layout.<name>(run)
    record: str  # its provenance file
    result: str  # the name of the output its function returns (JSON)
    method_options: bool = True  # reads its own method's methods.<method> section
    tuned_values: bool = True  # reads its entry of tuned/tuned.json (dpclip.pipeline.tuned)
    shadow_risk: bool = True  # reads shadow/risk.json when its method uses the risk
    chosen_attacks: bool = False  # the attacks attack.kinds names are its code too
    optional: tuple[str, ...] = ()  # names of writes recorded only when written

    def parts(self) -> dict[str, str]:
        """Each write's entry directly under its folder (``runs/{run}`` for
        ``runs/{run}/model.pt``), named by that folder: what leaves with a run no longer
        configured."""
        out = {}
        for pattern in self.writes.values():
            folder, rest = pattern.split("{run}", 1)
            out[folder.rstrip("/").replace("/", "_")] = folder + "{run}" + rest.split("/")[0]
        return out


@dataclass(frozen=True)
class Flag:
    """A command-line switch of one stage: given, the stage function gets ``keyword=value``."""

    option: str
    keyword: str
    value: object
    help: str


@dataclass(frozen=True)
class Stage:
    name: str
    help: str  # the subcommand's help line
    scope: str  # ONCE, PER_ALPHA (a DVC matrix over partition.alphas) or PER_RUN
    deps: tuple[str, ...] = ()  # data inputs besides its runs' (code: the import closure)
    params: tuple[str, ...] = ()  # params.yaml sections or keys besides its runs'
    outs: tuple[Output, ...] = ()
    metrics: tuple[Output, ...] = ()
    runs: tuple[str, ...] = ()  # the plugin families it runs, every registered module of each
    per_run: PerRun | None = None  # per run: what each run reads and writes
    progress: bool = False  # its functions take ``progress`` (a bar unless --quiet)
    quiet: bool = True  # dvc.yaml's command passes --quiet
    flags: tuple[Flag, ...] = ()
    comment: str = ""  # above the stage in dvc.yaml
    notes: dict[str, str] = field(default_factory=dict)  # dep or param -> comment beside it
    # per run: what happens to the outputs of runs no longer configured: "set aside" in
    # .dpclip/retired (trained models, restored when configured again) or "remove"
    tidy: str = "set aside"
    skipped: str = ""  # per run: why nothing runs (None: it runs), from params
    # DVC runs it on every `dvc repro`: it reads what DVC cannot list (files params.yaml names)
    always_changed: bool = False
    # what its worker processes (dpclip.pipeline.side_by_side) import first: a stage run once
    # that hands work to workers names them (per run: the stage's module, always)
    worker_imports: tuple[str, ...] = ()

    @property
    def workers(self) -> tuple[str, ...]:
        """The modules its workers import first; () when it has none."""
        return (self.module,) if self.scope == PER_RUN else self.worker_imports

    @property
    def module(self) -> str:
        return f"dpclip.stages.{self.name}"

    @property
    def command(self) -> str:
        """What dvc.yaml runs."""
        alpha = " --alpha ${item.alpha}" if self.scope == PER_ALPHA else ""
        return f"dpclip{' --quiet' if self.quiet else ''} {self.name}{alpha}"

    @property
    def all_deps(self) -> tuple[str, ...]:
        """dvc.yaml's deps: its own, and the folders its runs read."""
        runs = self.per_run
        if runs is None:
            return self.deps
        read = [_folder(p) for p in runs.reads]
        read += [TUNED] * runs.tuned_values + [SHADOW_RISK] * runs.shadow_risk
        return tuple(dict.fromkeys([*read, *self.deps]))

    @property
    def all_params(self) -> tuple[str, ...]:
        """dvc.yaml's params: its runs' keys (and the tune and methods sections they read),
        the axes of the runs (per run), and its own."""
        runs = self.per_run
        if runs is None:
            return self.params
        read = [*(["tune"] if runs.tuned_values else []), *runs.params,
                *(RUN_AXES if self.scope == PER_RUN else ()),
                *(["methods"] if runs.method_options else []), *self.params]
        return tuple(dict.fromkeys(read))

    def produces(self, path: str) -> bool:
        """Whether ``path`` is one of this stage's outputs, inside one, or a folder holding
        one (``data/partitions`` holds ``data/partitions/<alpha>``)."""
        return any(path == out or path.startswith(out + "/") or out.startswith(path + "/")
                   for out in (_folder(o.path) for o in (*self.outs, *self.metrics)))


def _folder(pattern: str) -> str:
    """The part of a path pattern before its first field (``runs`` of ``runs/{run}``)."""
    return pattern.split("{")[0].removesuffix("$").rstrip("/")


_TRAINED = ("privacy.delta", "privacy.accountant", "privacy.epsilon_tolerance",
            "privacy.secure_noise", "train.model", "train.hidden", "train.epochs",
            "train.batch_size", "train.optimizer", "train.lr", "train.momentum",
            "train.clip_norm", "train.early_stopping", "train.threads", "train.public_init")
_RUN_DATA = ("data/prepared", "data/partitions/{alpha}")
SOURCES = "data/sources.json"
# what a stage that builds the model reads besides: the fingerprint of a model file of the
# user's own (train.model), which the check stage writes beside the data files'
MODEL_SOURCE = "data/model_file.json"
_BUILDS_MODEL = (*_RUN_DATA, MODEL_SOURCE)
_PER_RUN_CACHING = ("Per-run caching as in train.")

# every stage, in any order: STAGES below puts them in the order their inputs give
DECLARED: tuple[Stage, ...] = (
    Stage(
        name="check", scope=ONCE, always_changed=True,
        help="check params.yaml and fingerprint the data files it names",
        comment="runs on every dvc repro and goes first: a bad parameter stops the pipeline "
                "here, before DVC deletes any other stage's outputs, and the SHA-256 of the "
                "files data.path and data.shadow_path name (your CSV) go to data/sources.json, "
                "which prepare reads, so an edited file re-runs prepare and what follows; a "
                "model file of your own (train.model) goes to data/model_file.json, which the "
                "stages that build the model read",
        outs=(Output(SOURCES, persist=True,
                     note="kept when a check fails: rewritten whole when it passes"),
              Output(MODEL_SOURCE, persist=True, note="likewise"))),
    Stage(
        name="prepare", scope=ONCE, help="build the target and shadow splits",
        deps=(SOURCES,), notes={SOURCES: "the files params.yaml names"},
        params=("data",), runs=("data.sources",),
        # kept while prepare runs: a data error leaves the last good splits in place (prepare
        # replaces the folder whole, and only when every split is written)
        outs=(Output("data/prepared", persist=True, note="replaced whole when prepare "
                     "succeeds; kept when it fails"),)),
    Stage(
        name="partition", scope=PER_ALPHA, help="Dirichlet label skew for one alpha",
        deps=("data/prepared",), params=("data.seed",),
        outs=(Output("data/partitions/${item.alpha}"),)),
    Stage(
        # the shadow model is one run (dpclip.pipeline.provenance.shadow_key): kept while
        # its inputs are unchanged
        name="shadow", scope=ONCE, progress=True,
        help="per-layer MIA risk from a shadow model on public data",
        per_run=PerRun(
            params=("shadow", "attack.classifier", "attack.folds", "attack.max_features",
                    "attack.max_records", "train.model", "train.hidden", "train.optimizer",
                    "train.lr", "train.momentum", "train.threads"),
            reads=("data/prepared", MODEL_SOURCE),
            writes={"shadow_risk": SHADOW_RISK, "shadow_model": "shadow/model.pt",
                    "shadow_figure": "shadow/risk.png"},
            record="shadow/provenance.json", result="shadow_risk",
            method_options=False, tuned_values=False, shadow_risk=False),
        params=("train.methods",),
        notes={"train.methods": "whether a method reads the risk (lm_dp_sgd); else nothing "
                                "is trained"},
        outs=(Output("shadow", persist=True, note="kept between runs: the stage keeps a "
                     "shadow model made from the same inputs"),),
        runs=("methods",)),
    Stage(
        name="tune", scope=ONCE, progress=True,
        help="the same number of hyperparameter trials for every method and target epsilon, "
             "on public data (tune.trials)",
        comment="tune.trials Optuna (TPE) trials per method and target epsilon on the public "
                "splits only; the values chosen go to tuned/tuned.json, which train, audit and "
                "reference read. With tune.trials 0 it writes that nothing was searched.",
        deps=("data/prepared", SHADOW_RISK, MODEL_SOURCE),
        notes={SHADOW_RISK: "read by lm_dp_sgd only", MODEL_SOURCE: "a model file of your own"},
        params=("tune", "privacy", "train", "methods"),
        outs=(Output("tuned"),), runs=("methods",)),
    Stage(
        name="train", scope=PER_RUN, progress=True, quiet=False,
        help="train one run, or every run that is not up to date",
        comment="one command for every configured run (imports cost more than a digits run), "
                "the runs side by side in worker processes (dpclip.pipeline.side_by_side). "
                "Each run records its inputs in a provenance.json and is skipped while they "
                "are unchanged (dpclip.pipeline.provenance), so a change re-runs only the runs it "
                "touches; the lists below are the union of every run's inputs, so DVC starts "
                "the stage when any run may be stale. Outputs persist: DVC must not delete the "
                "runs that are up to date.",
        per_run=PerRun(
            params=_TRAINED, reads=_BUILDS_MODEL,
            writes={"model": "runs/{run}/model.pt", "record": "runs/{run}/record.json",
                    "trace": "traces/{run}.csv"},
            record="runs/{run}/provenance.json", result="record"),
        params=("train.device",),
        notes={SHADOW_RISK: "read by lm_dp_sgd only (its runs record it; the others do not)",
               "train.device": "not a run's input: here so that a device that is not there "
                               "is refused"},
        outs=(Output("runs", persist=True), Output("traces", persist=True)),
        runs=("methods",)),
    Stage(
        name="audit", scope=PER_RUN, quiet=False,
        help="one-run privacy audit (lower bound on epsilon) of one run, or of every run that "
             "is not up to date",
        comment="one extra model per run with a DP claim, trained with its configuration and "
                "canaries; the lower bound on epsilon they give. " + _PER_RUN_CACHING,
        per_run=PerRun(  # it trains the run's configuration again, with canaries
            params=(*_TRAINED, "audit"), reads=_BUILDS_MODEL,
            writes={"audit": "audits/{run}/audit.json"},
            record="audits/{run}/provenance.json", result="audit"),
        notes={SHADOW_RISK: "read by lm_dp_sgd only"},
        outs=(Output("audits", persist=True),), runs=("methods",)),
    Stage(
        name="reference", scope=PER_RUN, quiet=False,
        help="the reference models of LiRA and RMIA for one run, or for every run that is not "
             "up to date",
        comment="attack.references models per run, trained with its configuration on halves "
                "of the public population (attack.mode offline) or of its members and holdout "
                "(online); their logits are LiRA's and RMIA's calibration. " + _PER_RUN_CACHING,
        per_run=PerRun(  # it trains the run's configuration on other data
            params=(*_TRAINED, "attack.references", "attack.mode", "attack.population",
                    "data.seed"),
            reads=_BUILDS_MODEL,
            writes={"signals": "references/{run}/signals.npz",
                    "reference": "references/{run}/reference.json"},
            record="references/{run}/provenance.json", result="reference"),
        notes={SHADOW_RISK: "read by lm_dp_sgd only"},
        outs=(Output("references", persist=True),), runs=("methods",), skipped="skipped"),
    Stage(
        name="evaluate", scope=PER_RUN, quiet=False,
        help="evaluate one trained run, or every run that is not up to date",
        per_run=PerRun(
            params=("evaluate", "attack", "data.seed", "train.threads"),
            reads=(*_RUN_DATA, "runs/{run}", "traces/{run}.csv",
                   "audits/{run}/audit.json",  # merged into the metrics
                   "references/{run}/signals.npz"),  # LiRA and RMIA
            writes={"metrics": "metrics/{run}.json", "summary": "summary/{run}.json",
                    "roc": "plots/roc/{run}.csv", "reliability": "plots/reliability/{run}.csv",
                    "figures": "figures/{run}", "attack_scores": "scores/{run}.csv",
                    "ir_attack": "plots/ir_mia/{run}.csv"},
            optional=("ir_attack",),  # written when evaluate.ir_attack is on
            record="figures/{run}/provenance.json", result="metrics",
            method_options=False, tuned_values=False, shadow_risk=False, chosen_attacks=True),
        metrics=(Output("summary", cache=False, persist=True,
                        note="git tracks the summaries: `dvc exp show`, `dvc metrics diff "
                             "main`"),),
        outs=(Output("metrics", persist=True,
                     note="the full records (the metrics contract)"),
              Output("plots/roc", persist=True),
              Output("plots/reliability", persist=True),
              Output("plots/ir_mia", persist=True),
              Output("scores", persist=True,
                     note="every attack's score of every attacked record"),
              Output("figures", persist=True)),
        runs=("methods", "attacks"), tidy="remove"),
    Stage(
        name="report", scope=ONCE, quiet=False,
        help="comparison table, figures, MLflow record",
        deps=("metrics", "summary", "traces", "plots/roc", "plots/reliability",
              SHADOW_RISK, TUNED),
        notes={TUNED: "the Tuning section and the MLflow tuning run"},
        params=("train.methods", "privacy.target_epsilons", "partition.alphas",
                "train.seeds", "tracking"),
        outs=(Output("reports"),
              Output("overlays", cache=False, note="git tracks these plot tables: `dvc plots "
                                                   "diff main` reads main's from git")),
        # the workers draw the figures and log the MLflow children (dpclip.tracking.log_child)
        runs=("attacks",), worker_imports=("dpclip.stages.report", "matplotlib.pyplot",
                                           "mlflow.pytorch"),
        flags=(Flag("--no-track", "track", False, "skip MLflow logging"),)),
)


def reads_from(stage: Stage, other: Stage) -> bool:
    """Whether ``stage`` reads an output of ``other`` (an edge of the DAG)."""
    return other is not stage and any(other.produces(dep) for dep in stage.all_deps)


def in_pipeline_order(stages: tuple[Stage, ...]) -> tuple[Stage, ...]:
    """``stages`` sorted so that each comes after every stage whose output it reads (Kahn's
    algorithm, ties kept in declaration order); a cycle or a name used twice is refused."""
    names = [stage.name for stage in stages]
    if len(set(names)) != len(names):
        raise ValueError(f"a stage name is declared twice: {names}")
    ordered: list[Stage] = []
    pending = list(stages)
    while pending:
        ready = next((s for s in pending if all(o in ordered for o in pending + ordered
                                                if o is not s and reads_from(s, o))), None)
        if ready is None:
            raise ValueError(f"the stages {[s.name for s in pending]} read each other's "
                             f"outputs in a cycle")
        ordered.append(ready)
        pending.remove(ready)
    return tuple(ordered)


STAGES = in_pipeline_order(DECLARED)
BY_NAME = {stage.name: stage for stage in STAGES}


def upstream(stage: Stage) -> list[Stage]:
    """The stages whose outputs ``stage`` reads (its edges in the DAG), in pipeline order."""
    return [other for other in STAGES if reads_from(stage, other)]


def _run_files() -> dict[str, str]:
    files: dict[str, str] = {}
    for stage in STAGES:
        for name, pattern in (stage.per_run.writes.items() if stage.per_run else ()):
            if name in files:
                raise ValueError(f"two outputs are named {name!r}: {files[name]}, {pattern}")
            files[name] = pattern
    return files


RUN_FILES = _run_files()  # the name of each output of a run -> its path pattern


def untracked_outputs() -> list[str]:
    """The outputs git does not track (DVC caches them) and what the stages write outside
    DVC: what ``make clean`` removes."""
    return [*(_folder(out.path) for stage in STAGES for out in (*stage.outs, *stage.metrics)
              if out.cache), *UNTRACKED]



# the top-level plots of dvc.yaml (`dvc plots show` / `dvc plots diff main`): every configured
# run in one plot; the templates in .dvc/plots colour by run and give each revision its own
# point shape and line dash. A comment, if any, goes above its entry.
PLOTS: tuple[tuple[str, dict, str], ...] = (
    ("overlays/clip_threshold.csv", dict(
        template="dpclip_steps", x="step", y="clip_threshold",
        title="Clip threshold C_t by run", y_label="clip threshold C_t"), ""),
    ("overlays/roc", dict(
        template="dpclip_roc", x="fpr", y="tpr",
        title="Membership-attack ROC by run, one plot per attack (log axes; dotted = chance)",
        x_label="false positive rate", y_label="true positive rate"),
     "one plot per attack (roc/<attack>.csv): a new attack needs no entry"),
    ("overlays/reliability.csv", dict(
        template="dpclip_reliability", x="confidence", y="accuracy",
        title="Reliability by run (holdout; dotted = perfect calibration)",
        x_label="mean confidence in the bin", y_label="accuracy in the bin"), ""),
    ("overlays/privacy_utility.csv", dict(
        template="dpclip_epsilon", x="epsilon", y="accuracy",
        title="Privacy-utility (accuracy against epsilon spent, private runs)",
        x_label="epsilon (log axis)", y_label="holdout accuracy"), ""),
    ("claimed_vs_audited_epsilon", dict(
        template="dpclip_audit", x="epsilon",
        y={"overlays/privacy_utility.csv": "audit_epsilon_lower_bound"},
        title="Claimed vs audited epsilon (one-run audit lower bound; sound runs stay below "
              "the diagonal)",
        x_label="claimed epsilon (spent)", y_label="audited lower bound on epsilon"), ""),
    ("privacy_utility_accuracy", dict(
        template="dpclip_band", x="epsilon", y={"overlays/privacy_utility_seeds.csv": "accuracy"},
        title="Accuracy against epsilon over seeds (mean; 95% band from two seeds)",
        x_label="epsilon (log axis)", y_label="holdout accuracy"),
     "over seeds: the mean per method and target epsilon, with its 95% band (two or more "
     "seeds)"),
    ("privacy_utility_ece", dict(
        template="dpclip_band", x="epsilon", y={"overlays/privacy_utility_seeds.csv": "ece"},
        title="ECE against epsilon over seeds (mean; 95% band from two seeds)",
        x_label="epsilon (log axis)", y_label="ECE"), ""),
    ("privacy_utility_attack", dict(
        template="dpclip_band", x="epsilon",
        y={"overlays/privacy_utility_seeds.csv": "attack_tpr_at_low_fpr"},
        title="The headline attack's TPR at its low FPR (10 false positives) against epsilon "
              "over seeds (mean; 95% band from two seeds)",
        x_label="epsilon (log axis)", y_label="TPR at the low FPR"), ""),
)
