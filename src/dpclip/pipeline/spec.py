"""Every stage of the pipeline, declared once: its command, the parameters it reads, its inputs
and outputs, and whether it runs once, per alpha or per run.

Everything that runs or describes the stages reads :data:`STAGES` (the declarations of
:data:`DECLARED` in the order their inputs and outputs give):

* ``dvc.yaml`` is generated from it (:mod:`dpclip.pipeline.dvc_yaml`), each stage's code
  dependencies from the import closure of its command (:mod:`dpclip.code_closure`);
* the ``dpclip`` command has one subcommand per stage, built from it;
* the Prefect flow and the presets run the stages in its order, with the edges its inputs and
  outputs give (a stage waits for every stage whose output it reads, :func:`upstream`).

A stage ``NAME`` is the module ``dpclip.stages.NAME``, which defines:

* ``NAME(params, layout, ...)`` (once), ``NAME(params, alpha, layout)`` (per alpha) or
  ``NAME(params, method, epsilon, alpha, seed, layout, ...)`` (per run), returning its result;
* ``describe(result, layout) -> str``: the line the command prints;
* per run also ``NAME_all(params, layout, ..., force)`` (every configured run that is not up
  to date, yielding (run, result or None)) and the functions named by :attr:`Stage.tidy` and
  :attr:`Stage.skipped`.

This module imports nothing from the package, so reading the declarations runs no stage code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ONCE, PER_ALPHA, PER_RUN = "once", "per_alpha", "per_run"
PLUGIN_FAMILIES = ("methods", "attacks", "data.sources")  # modules found at run time


@dataclass(frozen=True)
class Output:
    """One output path of a stage, with DVC's options: ``cache: false`` keeps it out of DVC's
    cache (git tracks it, or it is too large to copy); ``persist: true`` stops DVC from
    deleting it before the stage runs (the per-run stages keep the runs that are current)."""

    path: str
    cache: bool = True
    persist: bool = False
    note: str = ""  # a comment beside it in dvc.yaml


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
    deps: tuple[str, ...] = ()  # data inputs (the code ones come from the import closure)
    params: tuple[str, ...] = ()  # params.yaml sections or keys
    outs: tuple[Output, ...] = ()
    metrics: tuple[Output, ...] = ()
    runs: tuple[str, ...] = ()  # the plugin families it runs, every registered module of each
    progress: bool = False  # its functions take ``progress`` (a bar unless --quiet)
    quiet: bool = True  # dvc.yaml's command passes --quiet
    flags: tuple[Flag, ...] = ()
    comment: str = ""  # above the stage in dvc.yaml
    notes: dict[str, str] = field(default_factory=dict)  # dep or param -> comment beside it
    tidy: str = ""  # per run: sets aside the outputs of runs no longer configured
    skipped: str = ""  # per run: why nothing runs (None: it runs), from params
    provenance: str = ""  # per run: its dpclip.pipeline.provenance.RunStage
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

    def produces(self, path: str) -> bool:
        """Whether ``path`` is one of this stage's outputs, inside one, or a folder holding
        one (``data/partitions`` holds ``data/partitions/<alpha>``)."""
        return any(path == out or path.startswith(out + "/") or out.startswith(path + "/")
                   for out in (o.path.split("${")[0].rstrip("/")
                               for o in (*self.outs, *self.metrics)))


_TRAINED = ("train.model", "train.hidden", "train.epochs", "train.batch_size",
            "train.optimizer", "train.lr", "train.momentum", "train.clip_norm",
            "train.early_stopping", "train.threads", "train.public_init")
_RUN_AXES = ("train.methods", "train.seeds", "partition.alphas")
_RUN_INPUTS = ("data/prepared", "data/partitions", "tuned/tuned.json", "shadow/risk.json")
_RISK_NOTE = {"shadow/risk.json": "read by lm_dp_sgd only"}
_PER_RUN_CACHING = ("Per-run caching as in train.")

# every stage, in any order: STAGES below puts them in the order their inputs give
DECLARED: tuple[Stage, ...] = (
    Stage(
        name="check", scope=ONCE, always_changed=True,
        help="check params.yaml and fingerprint the data files it names",
        comment="runs on every dvc repro and goes first: a bad parameter stops the pipeline "
                "here, before DVC deletes any other stage's outputs, and the SHA-256 of the "
                "files data.path and data.shadow_path name (your CSV) go to data/sources.json, "
                "which prepare reads, so an edited file re-runs prepare and what follows",
        outs=(Output("data/sources.json", persist=True,
                     note="kept when a check fails: rewritten whole when it passes"),)),
    Stage(
        name="prepare", scope=ONCE, help="build the target and shadow splits",
        deps=("data/sources.json",), notes={"data/sources.json": "the files params.yaml names"},
        params=("data",), outs=(Output("data/prepared"),), runs=("data.sources",)),
    Stage(
        name="partition", scope=PER_ALPHA, help="Dirichlet label skew for one alpha",
        deps=("data/prepared",), params=("data.seed",),
        outs=(Output("data/partitions/${item.alpha}"),)),
    Stage(
        name="shadow", scope=ONCE, progress=True,
        help="per-layer MIA risk from a shadow model on public data",
        deps=("data/prepared",),
        params=("shadow", "attack.classifier", "attack.folds", "attack.max_features",
                "attack.max_records", "train.model", "train.hidden", "train.optimizer",
                "train.lr", "train.momentum", "train.threads", "train.methods"),
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
        deps=("data/prepared", "shadow/risk.json"), notes=_RISK_NOTE,
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
        deps=_RUN_INPUTS,
        notes={"shadow/risk.json": "read by lm_dp_sgd only (its runs record it; the others "
                                   "do not)",
               "train.device": "not a run's input: here so that a device that is not there "
                               "is refused"},
        params=("tune", "privacy", *_RUN_AXES[:2], *_TRAINED, "train.device", _RUN_AXES[2],
                "methods"),
        outs=(Output("runs", persist=True), Output("traces", persist=True)),
        runs=("methods",), tidy="set_aside_unconfigured_runs", provenance="TRAIN"),
    Stage(
        name="audit", scope=PER_RUN, quiet=False,
        help="one-run privacy audit (lower bound on epsilon) of one run, or of every run that "
             "is not up to date",
        comment="one extra model per run with a DP claim, trained with its configuration and "
                "canaries; the lower bound on epsilon they give. " + _PER_RUN_CACHING,
        deps=_RUN_INPUTS, notes=_RISK_NOTE,
        params=("tune", "audit", "privacy", *_RUN_AXES[:2], *_TRAINED, _RUN_AXES[2],
                "methods"),
        outs=(Output("audits", persist=True),),
        runs=("methods",), tidy="set_aside_unconfigured_audits", provenance="AUDIT"),
    Stage(
        name="reference", scope=PER_RUN, quiet=False,
        help="the reference models of LiRA and RMIA for one run, or for every run that is not "
             "up to date",
        comment="attack.references models per run, trained with its configuration on halves "
                "of the public population (attack.mode offline) or of its members and holdout "
                "(online); their logits are LiRA's and RMIA's calibration. " + _PER_RUN_CACHING,
        deps=_RUN_INPUTS, notes=_RISK_NOTE,
        params=("tune", "attack.references", "attack.mode", "attack.population", "data.seed",
                "privacy", *_RUN_AXES[:2], *_TRAINED, _RUN_AXES[2], "methods"),
        outs=(Output("references", persist=True),),
        runs=("methods",), tidy="set_aside_unconfigured_references", skipped="skipped",
        provenance="REFERENCE"),
    Stage(
        name="evaluate", scope=PER_RUN, quiet=False,
        help="evaluate one trained run, or every run that is not up to date",
        deps=("data/prepared", "data/partitions", "runs", "traces", "audits", "references"),
        params=("evaluate", "attack", "data.seed", "train.threads", "train.methods",
                "privacy.target_epsilons", "partition.alphas", "train.seeds"),
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
        runs=("methods", "attacks"), tidy="remove_unconfigured_evaluations",
        provenance="EVALUATE"),
    Stage(
        name="report", scope=ONCE, quiet=False,
        help="comparison table, figures, MLflow record",
        deps=("metrics", "summary", "traces", "plots/roc", "plots/reliability",
              "shadow/risk.json", "tuned/tuned.json"),
        notes={"tuned/tuned.json": "the Tuning section and the MLflow tuning run"},
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
    return other is not stage and any(other.produces(dep) for dep in stage.deps)


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
