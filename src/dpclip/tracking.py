"""MLflow logging (the only module that imports mlflow), per the tracking contract.

One experiment per dataset (``dpclip-<dataset>``), a parent run per pipeline execution and one
child run per trained configuration, which describes itself (its parameters, model, splits as
dataset inputs and source tags); a configuration already logged with the same weights is linked
to the new parent instead of logged again. The store defaults to the project's ``mlflow.db``.
What each run holds, the saved view and what MLflow's UI does with it: docs/mlflow.md.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import subprocess
import tempfile
import urllib.parse
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from dpclip.pipeline.inputs import load_model
from dpclip.stage_outputs import load_split
from dpclip.attacks import available_attacks, get_attack
from dpclip.config import Params
from dpclip.data.sources import dataset_label
from dpclip.errors import DpclipError
from dpclip.hashing import file_hash
from dpclip.files import read_json
from dpclip.layout import Layout
from dpclip.methods import get_method
from dpclip.run_keys import RunKey
from dpclip.catalog import BY_NAME
from dpclip.pipeline.provenance import record_path
from dpclip.trace_columns import PRIVATE_DIAGNOSTICS

log = logging.getLogger(__name__)

SUMMARY_METRICS = {  # MLflow name -> path in the metrics file
    "epsilon": ("privacy", "epsilon"),
    "accuracy": ("utility", "accuracy"),
    "ece": ("utility", "ece"),
    "mce": ("utility", "mce"),
    "brier": ("utility", "brier"),
    "nll": ("utility", "nll"),
    "mia_auc": ("mia", "loss", "auc"),
    "mia_balanced_accuracy": ("mia", "loss", "balanced_accuracy"),
    "mia_tpr_at_fpr_1pct": ("mia", "loss", "tpr_at_fpr_1pct"),
    "ir_mia_peak_accuracy": ("mia", "ir", "peak_accuracy"),
    "ir_mia_peak_auc": ("mia", "ir", "peak_auc"),
    "ir_mia_train_peak_accuracy": ("mia", "ir_train", "peak_accuracy"),
    "mia_label_only_auc": ("mia", "label_only", "auc"),
    "mia_label_only_auc_unmatched": ("mia", "label_only", "auc_unmatched"),
    "mia_n_members": ("mia", "matching", "n_members"),
    "mia_dp_bound_margin": ("mia", "loss", "dp_bound", "worst_margin"),
    "ir_mia_dp_bound_margin": ("mia", "ir", "dp_bound", "worst_margin"),
    # results of the accounting (the parameters that produced them are params)
    "noise_multiplier": ("privacy", "noise_multiplier"),
    "sample_rate": ("privacy", "sample_rate"),
    "steps": ("privacy", "steps"),
    "epsilon_saved": ("privacy", "epsilon_saved"),  # only when early stopping ended the run
    "stopped_epoch": ("training", "stopped_epoch"),
    # the one-run audit's lower bounds on epsilon (absent when not applicable)
    "audit_whitebox_epsilon_lower_bound": ("audit", "whitebox", "epsilon_lower_bound"),
    "audit_blackbox_epsilon_lower_bound": ("audit", "blackbox", "epsilon_lower_bound"),
    "mia_tpr_at_fpr_0.1pct": ("mia", "loss", "tpr_at_fpr_0.1pct"),
    # the attack chosen in advance (attack.headline) at its honest low FPR
    "attack_auc": ("mia", "headline", "auc"),
    "attack_tpr_at_low_fpr": ("mia", "headline", "tpr_at_low_fpr"),
    "attack_low_fpr": ("mia", "headline", "low_fpr"),
}
ATTACK_METRICS = {"auc": ("auc",), "tpr_at_fpr_1pct": ("tpr_at_fpr_1pct",),
                  "tpr_at_fpr_0.1pct": ("tpr_at_fpr_0.1pct",),
                  "dp_bound_margin": ("dp_bound", "worst_margin")}


def summary_metrics() -> dict[str, tuple]:
    """:data:`SUMMARY_METRICS`, and every other registered attack's (:mod:`dpclip.attacks`;
    the baseline's are the unprefixed ``mia_*`` above) as ``mia_<attack>_<value>``, absent
    where it did not run."""
    return {**SUMMARY_METRICS, **{
        f"mia_{attack.prefix()}_{name}": ("mia", attack.name, *path)
        for attack in map(get_attack, available_attacks()) if attack.prefix()
        for name, path in ATTACK_METRICS.items()}}
# wall-clock measurements of training, from timings/<run>.json (not in the metrics file)
TIMING_METRICS = ("train_s", "step_s_median", "probe_s", "public_pretrain_s")
STEP_METRICS = ("clip_threshold", "train_loss", "epsilon_spent")
# a run without a DP guarantee logs its epsilons under these names: never in the epsilon
# columns and charts of runs whose epsilon is a bound (its tag dp_guarantee says false too)
NO_GUARANTEE_NAMES = {"epsilon": "epsilon_without_guarantee",
                      "epsilon_spent": "epsilon_spent_without_guarantee",
                      "epsilon_saved": "epsilon_saved_without_guarantee"}
# method signals logged per step when a trace has them (WW-DP-SGD's controller)
# written by the run itself for every method that early-stops (the method adds its own:
# Method.step_metrics)
RUN_STEP_METRICS = ("monitored_std", "early_stop_signal")
# what the experiment is (the kind selector of MLflow's experiment page reads it; the 3.17 UI
# picks its GenAI or model-training view from the browser's switch or the address instead)
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
# the comparison's headline, logged first: the compare page plots each run's first metric
HEADLINE_METRICS = ("accuracy", "ece", "epsilon", "attack_auc", "attack_tpr_at_low_fpr")
HEADLINE_PARAMS = ("method", "target_epsilon")
VIEW_ID = "dpclip-headline"  # the saved view (experiment tag) describe() links to
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_ID}"
VIEW_VERSION = 3  # a view this module wrote carries it; one a user saved over it is kept
NOTE_TAG = "mlflow.note.content"
# parent-level tables: reports/<name>.csv -> <name>.json (an MLflow table)
PARENT_TABLES = ("summary", "comparison")
# characters MLflow refuses in a logged model's name
_MODEL_NAME_BAD = str.maketrans({c: "_" for c in "/:.%\"'"})
PIPELINES_TAG = "dpclip.pipelines"  # every parent a child belongs to (it may be reused)
SPLIT_CONTEXTS = {"target_train": "training", "target_holdout": "evaluation",
                  "shadow_train": "public", "shadow_holdout": "public"}


def project_home(root: Path) -> Path:
    """The project folder, also when running inside a DVC temporary experiment copy."""
    root = root.resolve()
    parts = root.parts
    for i in range(len(parts) - 3):
        if parts[i:i + 3] == (".dvc", "tmp", "exps"):
            return Path(*parts[:i])
    return root


# the URIs this process gave mlflow.set_tracking_uri, which also exports them as
# MLFLOW_TRACKING_URI: that variable names the user's store only when it holds none of these
_SET_HERE: set[str] = set()


def tracking_uri(root: Path) -> str:
    """The user's MLFLOW_TRACKING_URI, else ``mlflow.db`` in the project folder (MLflow's own
    default location, relative to where ``mlflow ui`` starts)."""
    chosen = os.environ.get("MLFLOW_TRACKING_URI")
    if chosen and chosen not in _SET_HERE:
        return chosen
    home = project_home(root)
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'mlflow.db'}"


def artifact_root(uri: str) -> Path | None:
    """Where new experiments keep artifacts: beside a SQLite database (``<db folder>/mlartifacts``,
    MLflow's own name) rather than in ``./mlruns`` of whatever folder the stage ran in; a
    tracking server or a file store decides for itself (None)."""
    if uri.startswith("sqlite:///"):
        return Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts"
    return None


def git_commit(root: Path) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _get(d: dict, path: tuple):
    for key in path:
        d = d.get(key) if isinstance(d, dict) else None
    return d


def _flatten(prefix: str, value, out: dict) -> dict:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else k, v, out)
    else:
        out[prefix] = str(value)[:500]
    return out


def experiment_name(params: Params) -> str:
    """``dpclip-<dataset>``; a table of your own (a ``table`` source: the csv one) also names
    its file (``dpclip-csv-heart``), so that CSVs of different names never share an
    experiment."""
    return f"dpclip-{dataset_label(params.data)}"


def _stored_elsewhere(experiment, artifact_root: Path | None) -> bool:
    """Whether ``experiment`` keeps its artifacts outside ``artifact_root``: the project's
    database was copied or moved with the project, and MLflow stores an experiment's artifact
    folder as an absolute path that it never changes."""
    if artifact_root is None:
        return False
    location = experiment.artifact_location
    if location.startswith("file://"):
        location = urllib.parse.unquote(urllib.parse.urlparse(location).path)
    elif "://" in location:  # a store of another kind: not this project's folder
        return False
    return not Path(location).resolve().is_relative_to(artifact_root.resolve())


def _experiment_id(mlflow, name: str, artifact_root: Path | None) -> str:
    """The experiment's id, created when missing, with the tags the UI reads (the kind, a
    description, the headline view) set where missing or different; tags a user set stay. An
    experiment whose artifacts live outside ``artifact_root`` (a copied or moved project) is
    renamed ``<name> (artifacts in <its folder>)`` and a new one made here (docs/mlflow.md)."""
    found = mlflow.get_experiment_by_name(name)
    client = mlflow.tracking.MlflowClient()
    if found is not None and _stored_elsewhere(found, artifact_root):
        moved = f"{name} (artifacts in {found.artifact_location})"
        if mlflow.get_experiment_by_name(moved) is not None:
            moved = f"{moved} #{found.experiment_id}"
        client.rename_experiment(found.experiment_id, moved)
        found = None
    if found is None:
        location = (artifact_root / name).as_uri() if artifact_root else None
        return mlflow.create_experiment(name, artifact_location=location,
                                        tags=_experiment_tags({}))
    for key, value in _experiment_tags(found.tags).items():
        client.set_experiment_tag(found.experiment_id, key, value)
    return found.experiment_id


def _experiment_tags(current: dict) -> dict:
    """The experiment tags to set, given the ones it has."""
    tags = {k: v for k, v in EXPERIMENT_KIND.items() if current.get(k) is None}
    if not current.get(NOTE_TAG):
        tags[NOTE_TAG] = NOTE
    if _view_version(current.get(VIEW_TAG)) not in (None, VIEW_VERSION):
        tags[VIEW_TAG] = headline_view()
    return tags


NOTE = ("**Model training, not GenAI**: switch the sidebar to *Model training* (the browser "
        "remembers it) or add `?workflowType=machine_learning` to the address. "
        f"*Views* > *dpclip: headline comparison* (`{VIEW_ID}`) lists the trained "
        "configurations with accuracy, ECE, epsilon and the headline attack's AUC and TPR at "
        "low FPR, and charts them. One parent run per pipeline execution (its artifacts hold "
        "the tables summary.json and comparison.json), one child per trained configuration, "
        "named `<DVC experiment or input hash> · <method>-eps<target>-<alpha>-seed<seed>`, "
        "its model named alike.")


def _view_version(stored: str | None) -> int | None:
    """The module version that wrote a stored view; 0 when absent (write it), None when a user
    saved over it (keep it)."""
    if stored is None:
        return 0
    try:
        return json.loads(json.loads(stored)["state"]).get("dpclipView")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def headline_view(now_ms: int | None = None) -> str:
    """The saved view ``dpclip-headline`` as the experiment tag's value: the envelope MLflow's
    "Views" menu reads (name, times, the page state as a JSON string). Its rows, columns and
    charts: docs/mlflow.md, "Opening the UI"."""
    now_ms = now_ms if now_ms is not None else int(dt.datetime.now().timestamp() * 1000)
    section = "dpclip-headline-section"
    card = {"isGenerated": False, "deleted": False, "metricSectionId": section,
            "runsCountToCompare": 100}
    charts = [
        {**card, "uuid": "dpclip-parallel", "type": "PARALLEL", "showAllRuns": False,
         "selectedParams": list(HEADLINE_PARAMS), "selectedMetrics": list(HEADLINE_METRICS)},
        {**card, "uuid": "dpclip-privacy-utility", "type": "SCATTER",
         "xaxis": {"key": "epsilon", "type": "METRIC"},
         "yaxis": {"key": "accuracy", "type": "METRIC"}},
        *({**card, "uuid": f"dpclip-bar-{m}", "type": "BAR", "metricKey": m, "displayName": m}
          for m in HEADLINE_METRICS)]
    columns = ([f"params.`{p}`" for p in (*HEADLINE_PARAMS, "alpha", "seed")]
               + ["tags.`dp_guarantee`", "tags.`adjacency`"]
               + [f"metrics.`{m}`" for m in (*HEADLINE_METRICS,
                                            "audit_whitebox_epsilon_lower_bound")])
    # no Models column: at 1400 px it took the width of two metrics, and a child's model is
    # named like the child (its page links it)
    # sorted by a metric: sorted by start time, the page would fetch each child's parent and
    # nest the children under collapsed pipeline rows
    state = {"searchFilter": "tags.`dpclip.kind` = 'configuration'",
             "orderByKey": "metrics.`accuracy`", "orderByAsc": False,
             "selectedColumns": columns, "compareRunCharts": charts,
             "compareRunSections": [{"uuid": section, "name": "Headline (dpclip)",
                                     "display": True, "isReordered": False, "deleted": False,
                                     "isGenerated": False}],
             "runsHiddenMode": "SHOW_ALL", "isAccordionReordered": False,
             "dpclipView": VIEW_VERSION}
    return json.dumps({"name": "dpclip: headline comparison", "createdAt": now_ms,
                       "updatedAt": now_ms, "state": json.dumps(state)})


def source_tags(commit: str) -> dict:
    """MLflow's standard source tags, and the DVC experiment's name when ``dvc exp run`` runs
    the pipeline (DVC sets ``DVC_EXP_NAME``)."""
    tags = {"mlflow.source.git.commit": commit, "mlflow.source.type": "PROJECT",
            "mlflow.source.name": "dpclip", "git_commit": commit}
    if os.environ.get("DVC_EXP_NAME"):
        tags["dvc.exp_name"] = os.environ["DVC_EXP_NAME"]
    return tags


def log_pipeline(params: Params, layout: Layout, runs: list[RunKey], jobs: int = 1,
                 figures: Callable[[], object] = lambda: None) -> dict:
    """Log one pipeline execution; returns the parent run id and what was new or reused. The
    children are logged ``jobs`` at a time in worker processes (:func:`log_children`).
    ``figures()`` returns once the report's figures are drawn (they may be drawn meanwhile);
    it is called once the store exists, before the pipeline's run starts.
    ``MLFLOW_TRACKING_URI`` is put back as it was after (mlflow.set_tracking_uri exports it),
    so a process this one starts later does not log into this project's store."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    try:
        return _log_pipeline(params, layout, runs, jobs, figures)
    finally:
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before


def _log_pipeline(params: Params, layout: Layout, runs: list[RunKey], jobs: int,
                  figures: Callable[[], object]) -> dict:
    import mlflow

    root = layout.root.resolve()
    uri = tracking_uri(root)
    if os.environ.get("MLFLOW_TRACKING_URI") != uri:  # exported by us, not chosen by the user
        _SET_HERE.add(uri)
    mlflow.set_tracking_uri(uri)
    experiment_id = _experiment_id(mlflow, experiment_name(params), artifact_root(uri))
    commit = git_commit(root)
    # drawn meanwhile (the report's worker, while the store was created): a drawing that
    # failed stops here, before this execution has a run in the store
    figures()
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    exp_name = os.environ.get("DVC_EXP_NAME")
    with mlflow.start_run(experiment_id=experiment_id,
                          run_name=f"pipeline-{stamp}" + (f"@{exp_name}" if exp_name else ""),
                         tags={"dpclip.kind": "pipeline", "dataset": params.data.dataset,
                               "dpclip.dataset_id": read_json(layout.prepared_meta).get(
                                   "dataset_id", ""),
                               **source_tags(commit)}) as parent:
        mlflow.log_params(_flatten("", {**params.to_dict(), "data": params.data.as_written()}, {}))
        roc_figures = sorted(path.name for path in layout.reports.glob("roc*.png"))
        for name in ("summary.csv", "comparison.md", "comparison.csv", "comparison.png",
                     "clip_thresholds.png", *roc_figures,
                     "claimed_vs_audited_epsilon.png", "privacy_utility.png", "seeds.csv",
                     "paired_vs_dp_sgd.csv", "tuning.csv",
                     "data_use.md"):
            if (layout.reports / name).exists():
                mlflow.log_artifact(str(layout.reports / name), artifact_path="report")
        tables = _log_tables(mlflow, layout)
        _log_shadow(mlflow, layout)
        log_model_file(mlflow, layout)
        _log_tuning(mlflow, experiment_id, layout)
        parent_id = parent.info.run_id
        reused, new = [], []
        for key in runs:  # a model logged before is linked to this parent, not logged again
            logged = _logged_child(mlflow, experiment_id, key.name, _fingerprint(layout, key))
            if logged is not None:
                _link(mlflow, logged, parent_id)
                reused.append(key.name)
            else:
                new.append(key)
        if new:
            # the prepared splits are the parent's inputs too (the pipeline read them): so
            # each dataset is in the store before the children log it as theirs (MLflow looks
            # a dataset up, then inserts it: two workers creating one at once failed a UNIQUE
            # constraint), and the children get its name and digest, not its records
            splits = _Splits(layout)
            for name, context in SPLIT_CONTEXTS.items():
                mlflow.log_input(splits[name], context=context)
            children = Children(
                uri=uri, experiment_id=experiment_id, parent_id=parent_id, layout=layout,
                private_diagnostics=params.tracking.private_diagnostics,
                model_format=params.tracking.model_format, dvc_experiment=exp_name,
                source_tags=source_tags(commit), inputs=splits.metadata(),
                example=splits.example())
            for _ in log_children(children, new, jobs):
                pass
        # the search (UI or search_runs) that lists every configuration of this execution,
        # the reused ones included
        mlflow.set_tags({"dpclip.reused_runs": ",".join(reused)[:5000],
                         "dpclip.children_filter": f"tags.`{PIPELINES_TAG}` LIKE '%{parent_id}%'"})
        summary = {"parent_run_id": parent_id, "experiment": experiment_name(params),
                   "experiment_id": experiment_id,
                   "tracking_uri": mlflow.get_tracking_uri(),
                   "new": [k.name for k in runs if k.name not in reused], "reused": reused,
                   "tables": tables, "view": VIEW_ID}
        log.debug("%s", describe(summary))
        return summary


def _log_tables(mlflow, layout: Layout) -> list[str]:
    """``reports/summary.csv`` and ``reports/comparison.csv`` as MLflow tables on the parent run
    (``summary.json``, ``comparison.json``: the run's artifact view shows them as tables); a
    missing or unreadable file is left out and said so in the log. Returns what was logged."""
    logged, missing = [], []
    for stem in PARENT_TABLES:
        path = layout.reports / f"{stem}.csv"
        if not path.is_file():
            missing.append(path.name)
            continue
        try:
            table = pd.read_csv(path)
        except (ValueError, OSError, UnicodeDecodeError) as err:  # pandas' errors are ValueErrors
            log.warning("MLflow: %s not logged as a table (%s)", path, err)
            continue
        mlflow.log_table(table, artifact_file=f"{stem}.json")
        logged.append(f"{stem}.json")
    if missing:
        log.warning("MLflow: %s not in %s; the pipeline run has %s", ", ".join(missing),
                    layout.reports, ", ".join(logged) or "no table")
    return logged


def _log_tuning(mlflow, experiment_id: str, layout: Layout) -> str | None:
    """A ``tuning`` child of the pipeline run, with one child per ``dpclip tune`` trial
    (method, epsilon, its values as params, its public validation accuracy), when tuning is
    on; an identical search already logged is reused (tagged with the tuned file's SHA-256)."""
    from mlflow.entities import Metric, Param

    if not layout.tuned.is_file():
        return None
    record = read_json(layout.tuned)
    if not record.get("trials"):
        return None
    digest = file_hash(layout.tuned)
    found = mlflow.search_runs(experiment_ids=[experiment_id], output_format="list",
                               max_results=1,
                               filter_string=f"tags.`dpclip.tuning_sha256` = '{digest}'")
    if found:
        mlflow.set_tag("dpclip.tuning_run", found[0].info.run_id)
        return found[0].info.run_id
    client = mlflow.tracking.MlflowClient()
    with mlflow.start_run(experiment_id=experiment_id, run_name="tuning", nested=True,
                          tags={"dpclip.kind": "tuning", "dpclip.tuning_sha256": digest}) as run:
        mlflow.log_params({"trials": record["trials"], "seed": record["seed"],
                           "sampler": record["sampler"], "objective": record["objective"]})
        for method, by_eps in record["runs"].items():
            for tag, entry in by_eps.items():  # held out: the gain's
                values = {"tuned_accuracy": entry["accuracy"], **{key: entry.get(key) for key in (
                    "default_accuracy", "heldout_accuracy", "default_heldout_accuracy")}}
                mlflow.log_metrics({f"{method}_{tag}_{name}": value
                                    for name, value in values.items() if value is not None})
        mlflow.log_artifact(str(layout.tuned), artifact_path="tuning")
        mlflow.log_artifact(str(layout.tuning_trials), artifact_path="tuning")
        trials = pd.read_csv(layout.tuning_trials)
        knobs = [c for c in trials.columns if "." in c]
        for row in trials.to_dict("records"):
            child = client.create_run(
                experiment_id, run_name=f"{row['method']}-{row['epsilon']}-trial{row['trial']}",
                tags={"mlflow.parentRunId": run.info.run_id, "dpclip.kind": "tuning_trial",
                      "method": row["method"], "epsilon": row["epsilon"],
                      "state": row["state"]})
            stamp = int(dt.datetime.now(dt.timezone.utc).timestamp() * 1000)
            metrics = [] if pd.isna(row["accuracy"]) else \
                [Metric("validation_accuracy", float(row["accuracy"]), stamp, 0)]
            client.log_batch(child.info.run_id, metrics=metrics,
                             params=[Param(k, str(row[k])) for k in knobs if not pd.isna(row[k])])
            client.set_terminated(child.info.run_id)
    mlflow.set_tag("dpclip.tuning_run", run.info.run_id)  # on the pipeline run
    return run.info.run_id


def log_model_file(mlflow, layout: Layout) -> None:
    """A model of the user's own (train.model names a file): the file and the Python files
    beside it (the check stage's fingerprints) under ``model_file/``, and its SHA-256 as a
    tag, so that a run in the UI says which code built its model."""
    record = (read_json(layout.model_source) if layout.model_source.exists() else {}).get(
        "train.model")
    if not record:
        return
    path = Path(record["path"])
    for file in [path, *(path.parent / name for name in record.get("beside", {}))]:
        if file.is_file():
            mlflow.log_artifact(str(file), artifact_path="model_file")
    mlflow.set_tag("dpclip.model_file_sha256", record["sha256"])


def _log_shadow(mlflow, layout: Layout) -> None:
    """The shadow stage's per-layer risk on the pipeline's parent run (it serves every
    configuration): ``shadow_er_<layer>`` metrics, the risk file and its plot."""
    risk = read_json(layout.shadow_risk) if layout.shadow_risk.exists() else {}
    if not risk.get("layers"):  # no shadow stage, or no method needed it
        return
    mlflow.log_metrics({f"shadow_er_{name}": v["error_rate"]
                        for name, v in risk["layers"].items()})
    mlflow.log_metric("shadow_accuracy", risk["shadow_accuracy"])
    for name in ("risk.json", "risk.png"):
        if (layout.shadow / name).exists():
            mlflow.log_artifact(str(layout.shadow / name), artifact_path="shadow")


def describe(summary: dict) -> str:
    """Two lines: what was logged, and where the UI shows it as model training with the
    headline view (MLflow 3.17's UI opens every experiment in its GenAI view unless the
    browser's switch or the address asks for the other)."""
    view = f"&viewStateShareKey={summary['view']}" if summary.get("view") else ""
    uri = summary["tracking_uri"]
    # a tracking server is its own UI; a local store is shown by `mlflow ui` (port 5000)
    served = uri.startswith(("http://", "https://"))
    where = uri.rstrip("/") if served else "http://127.0.0.1:5000"
    return (f"MLflow: experiment {summary['experiment']!r}, parent run "
            f"{summary['parent_run_id']}, {len(summary['new'])} new configuration(s), "
            f"{len(summary['reused'])} already logged ({uri})\n"
            f"MLflow UI{'' if served else ' (after `mlflow ui` in the project folder)'}: "
            f"{where}/#/experiments/"
            f"{summary['experiment_id']}/runs?workflowType=machine_learning{view}")


def child_run_name(layout: Layout, key: RunKey, fingerprint: str,
                   dvc_experiment: str | None = None) -> str:
    """A child's name: what tells it from the same run's other children first (the MLflow UI
    cuts names after about 25 characters), then the run's name. That is the DVC experiment
    that trained it (``dvc_experiment``, the command's ``DVC_EXP_NAME``), or, outside ``dvc exp
    run``, a short hash of the run's recorded inputs (parameters and the hashes of the files it
    read; the weights' hash when it recorded none)."""
    if dvc_experiment:
        return f"{dvc_experiment} · {key.name}"
    path = record_path(BY_NAME["train"], layout, key)
    if path.exists():
        inputs = json.dumps(read_json(path)["inputs"], sort_keys=True, default=str)
        return f"{hashlib.sha256(inputs.encode()).hexdigest()[:7]} · {key.name}"
    return f"{fingerprint[:7]} · {key.name}"


def _unique_name(mlflow, experiment_id: str, run: str, name: str, fingerprint: str) -> str:
    """``name``, or with the weights' short hash added when another child of the same run
    already has it (e.g. the same DVC experiment name reused, or training that is not
    reproducible from its inputs)."""
    taken = {r.info.run_name for r in mlflow.search_runs(
        experiment_ids=[experiment_id], output_format="list",
        filter_string=f"tags.`dpclip.run` = '{run}'")}
    return name if name not in taken else f"{name}-{fingerprint[:7]}"


def model_name(run_name: str) -> str:
    """A logged model's name for a child run (MLflow refuses ``/ : . % " '`` in it)."""
    return run_name.translate(_MODEL_NAME_BAD)


def run_params(layout: Layout, key: RunKey, metrics: dict) -> dict:
    """The parameters that produced one run, under short names for the compare view: its axes
    (dataset, method, target epsilon, alpha, seed) and the training inputs its provenance
    recorded (``lr``, ``epochs``, ..., the method's options as ``option.<name>``, the tune
    section as ``tune.<key>``), with the values ``dpclip tune`` chose where it chose them:
    what the run trained with."""
    out = {"dataset": metrics["dataset"], "method": key.method, "target_epsilon": key.epsilon,
           "alpha": key.alpha, "seed": key.seed}
    path = record_path(BY_NAME["train"], layout, key)
    for name, value in read_json(path)["inputs"]["params"].items():
        section, _, rest = name.partition(".")  # train.lr -> lr, tune -> tune.trials
        _flatten("option" if section == "methods" else rest or section, value, out)
    tuned = read_json(layout.run_dir(key.name) / "record.json").get("tuned")
    for name, value in (tuned or {}).items():  # train.lr -> lr, methods.m.p -> option.p
        out[("option." if name.startswith("methods.") else "") + name.rsplit(".", 1)[-1]] = str(value)
    out["tuned"] = tuned is not None
    return out


@dataclass(frozen=True)
class Children:
    """What logging a configuration as a new child of one pipeline execution's parent run
    needs, in this process or in a worker (it pickles; nothing a worker reads from its own
    environment, which is its fork server's): the store, the parent, and how to log."""

    uri: str
    experiment_id: str
    parent_id: str
    layout: Layout
    private_diagnostics: bool
    model_format: str
    dvc_experiment: str | None  # DVC_EXP_NAME of the command, which names the children
    source_tags: dict  # source_tags() of the command
    inputs: tuple  # (name, digest, file, context) of each split, as _Splits.metadata()
    example: np.ndarray  # two public records: the logged model's input example


def log_children(children: Children, runs: list[RunKey], jobs: int = 1):
    """Log each of ``runs`` as a new child, yielding (key, its run id) in order: ``jobs`` > 1
    logs them side by side in worker processes (:mod:`dpclip.pipeline.side_by_side`; a SQLite
    store takes one writer at a time, the others wait), else in this process. Each child's
    records are the same either way; only their wall-clock order in the store differs. Why:
    exporting a model (``torch.export``) and validating its input example take a core's time
    per child (docs/measurements.md)."""
    if jobs <= 1 or len(runs) <= 1:
        for key in runs:
            yield key, log_child(children, key)
        return
    from dpclip.pipeline.side_by_side import run_side_by_side

    yield from run_side_by_side(partial(log_child, children), runs, jobs, "report")


def log_child(children: Children, key: RunKey) -> str:
    """Log one configuration as a new child (here or in a worker); its run id. A failure
    names the run (an error that would not pickle back from a worker would else read as a
    worker that died)."""
    import mlflow

    if mlflow.get_tracking_uri() != children.uri:
        mlflow.set_tracking_uri(children.uri)
    try:
        return _log_configuration(children, key)
    except Exception as exc:
        raise DpclipError(f"MLflow: logging {key.name} failed ({type(exc).__name__}: "
                          f"{exc})") from exc


def _fingerprint(layout: Layout, key: RunKey) -> str:
    """The SHA-256 of the run's trained weights (its record)."""
    return read_json(layout.run_dir(key.name) / "record.json")["weights_sha256"]


def _logged_child(mlflow, experiment_id: str, run: str, fingerprint: str):
    """The child that logged this run's model already (same run name and weights), or None."""
    found = mlflow.search_runs(
        experiment_ids=[experiment_id], output_format="list", max_results=1,
        filter_string=f"tags.`dpclip.fingerprint` = '{fingerprint}' and "
                      f"tags.`dpclip.run` = '{run}'")
    return found[0] if found else None


def _link(mlflow, child, parent_id: str) -> None:
    """Add ``parent_id`` to a logged child's pipelines (tag ``dpclip.pipelines``)."""
    pipelines = child.data.tags.get(PIPELINES_TAG, child.data.tags.get(
        "mlflow.parentRunId", ""))
    ids = [i for i in pipelines.split(",") if i] + [parent_id]
    while len(",".join(ids)) > 5000:  # MLflow's tag limit: the oldest parents go first
        ids.pop(0)
    mlflow.tracking.MlflowClient().set_tag(child.info.run_id, PIPELINES_TAG, ",".join(ids))


class _Splits:
    """The prepared splits as MLflow datasets (name, digest, size), each loaded once."""

    def __init__(self, layout: Layout) -> None:
        self.layout, self._datasets = layout, {}

    def __getitem__(self, name: str):
        if name not in self._datasets:
            import mlflow.data

            x, y, _ = load_split(self.layout, name)
            with warnings.catch_warnings():  # MLflow registers two sources for local paths
                warnings.filterwarnings("ignore", "The specified dataset source can be")
                self._datasets[name] = mlflow.data.from_numpy(
                    x, targets=y, name=name, source=str(self.layout.split(name).resolve()))
        return self._datasets[name]

    def example(self):
        """Two public records: the logged model's input example (no private record leaves
        the data owner's store)."""
        return load_split(self.layout, "shadow_holdout")[0][:2].astype("float32")

    def metadata(self) -> tuple:
        """(name, digest, file, context) of each split: what a child logs of a split that the
        store holds already (:func:`_split_dataset`), without its records."""
        return tuple((name, self[name].digest, str(self.layout.split(name).resolve()), context)
                     for name, context in SPLIT_CONTEXTS.items())


def _split_dataset(name: str, digest: str, path: str):
    """An MLflow dataset of a split's name, digest and file, with no records (MLflow's
    ``MetaDataset``): logged as an input, it names the stored dataset of that name and
    digest."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    with warnings.catch_warnings():  # MLflow registers two sources for local paths
        warnings.filterwarnings("ignore", "The specified dataset source can be")
        return MetaDataset(resolve_dataset_source(path), name=name, digest=digest)


def _log_configuration(children: Children, key: RunKey) -> str:
    """Log one configuration as a new child run; its run id. The trace's private diagnostics
    go along only when ``private_diagnostics`` asks for them."""
    import mlflow

    experiment_id, layout = children.experiment_id, children.layout
    private_diagnostics, model_format = children.private_diagnostics, children.model_format
    run, parent_id = key.name, children.parent_id
    fingerprint = _fingerprint(layout, key)
    metrics = read_json(layout.metrics(run))
    privacy = metrics["privacy"]
    tags = {"dpclip.kind": "configuration", "dpclip.run": run, "dpclip.fingerprint": fingerprint,
            "dataset": metrics["dataset"], "method": metrics["method"],
            **({"dpclip.dataset_id": metrics["dataset_id"]} if "dataset_id" in metrics else {}),
            "alpha": "iid" if metrics["alpha"] is None else str(metrics["alpha"]),
            "seed": str(metrics["seed"]), **children.source_tags,
            "dp_guarantee": str(privacy["dp_guarantee"]).lower(),
            "adjacency": str(privacy.get("adjacency")),
            "secure_noise": str(bool(privacy.get("secure_noise"))).lower(),
            # common random numbers: never release this model together with another run's
            "noise_shared_across_runs": str(bool(privacy.get("noise_shared_across_runs"))).lower(),
            "dpclip.private_diagnostics": str(private_diagnostics).lower(),
            PIPELINES_TAG: parent_id}
    timing = _Timing(layout.timing(run))
    client = mlflow.tracking.MlflowClient()
    child_name = _unique_name(mlflow, experiment_id, run,
                              child_run_name(layout, key, fingerprint,
                                             children.dvc_experiment), fingerprint)
    child = client.create_run(experiment_id, run_name=child_name, start_time=timing.started_ms,
                              tags={**tags, "mlflow.parentRunId": parent_id})
    with mlflow.start_run(run_id=child.info.run_id, nested=True):
        mlflow.log_params(run_params(layout, key, metrics))
        summary = {name: float(_get(metrics, path)) for name, path in summary_metrics().items()
                   if _get(metrics, path) is not None}
        trace = pd.read_csv(layout.trace(run))
        if not privacy["dp_guarantee"]:
            # an epsilon that is no bound stays out of the epsilon columns and charts
            summary = {NO_GUARANTEE_NAMES.get(k, k): v for k, v in summary.items()}
            trace = trace.rename(columns=NO_GUARANTEE_NAMES)
        # the headline first (the compare page's default metric is a run's first), then the
        # rest, the timings last
        mlflow.log_metrics({**{m: summary[m] for m in HEADLINE_METRICS if m in summary},
                            **summary})
        for layer, values in (_get(metrics, ("mia", "ir", "layers")) or {}).items():
            mlflow.log_metrics({f"ir_mia_accuracy_{layer}": values["accuracy"],
                                f"ir_mia_auc_{layer}": values["auc"]})
        mlflow.log_metrics(timing.metrics)
        for name, digest, path, context in children.inputs:
            mlflow.log_input(_split_dataset(name, digest, path), context=context)
        # before the step metrics: the logged model copies the run's metrics so far (the
        # summary, shown in the UI's model list), and thousands of step values took a second
        _log_model(mlflow, layout, run, children.example, model_format,
                   model_name(child_name))
        if not private_diagnostics:
            trace = trace.drop(columns=[c for c in PRIVATE_DIAGNOSTICS if c in trace])
        _log_trace(mlflow, trace, metrics["method"], timing.step_ms)
        with tempfile.TemporaryDirectory() as folder:
            released = Path(folder) / layout.trace(run).name
            trace.to_csv(released, index=False)
            mlflow.log_artifact(str(released), artifact_path="trace")
        mlflow.log_artifact(str(layout.metrics(run)), artifact_path="metrics")
        figures = layout.figures(run)
        for png in sorted(figures.glob("*.png")):
            mlflow.log_artifact(str(png), artifact_path="plots")
    if timing.ended_ms is not None:  # the child lasts as long as its training did
        client.set_terminated(child.info.run_id, "FINISHED", end_time=timing.ended_ms)
    return child.info.run_id


class _Timing:
    """A run's wall-clock times from ``timings/<run>.json`` (the train stage's measurement, kept
    outside DVC's outputs): the child's start and end, and each step's timestamp. A run trained
    elsewhere without the file gets the logging time."""

    def __init__(self, path: Path) -> None:
        times = read_json(path) if path.exists() else {}
        now = int(dt.datetime.now().timestamp() * 1000)
        ended = [int(t * 1000) for t in times.get("step_ended_at") or []]
        started = times.get("started_at")
        self.started_ms = int(started * 1000) if started is not None else now
        self.ended_ms = (self.started_ms + int(times["train_s"] * 1000)
                         if started is not None and "train_s" in times else None)
        self.step_ms = ended or None
        self.metrics = {name: float(times[name]) for name in TIMING_METRICS if name in times}


def _log_model(mlflow, layout: Layout, run: str, example, model_format: str = "pt2",
               name: str = "model") -> None:
    """The trained model as an MLflow PyTorch model called ``name`` (the child's name:
    ``mlflow.pyfunc.load_model`` on the child's tag ``dpclip.model_uri``, or on
    ``runs:/<child id>/<name>``, predicts class scores from float32 records) in
    ``tracking.model_format``, and the checkpoint file as it is."""
    import mlflow.pytorch
    import torch
    from mlflow.models import infer_signature

    model = load_model(layout, run)
    with torch.no_grad():
        scores = model(torch.as_tensor(example)).numpy()
    info = mlflow.pytorch.log_model(model, name=name,
                                    signature=infer_signature(example, scores),
                                    input_example=example, serialization_format=model_format,
                                    pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"])
    mlflow.set_tag("dpclip.model_uri", info.model_uri)
    mlflow.log_artifact(str(layout.run_dir(run) / "model.pt"), artifact_path="checkpoint")


def _log_trace(mlflow, trace: pd.DataFrame, method: str, step_ms: list[int] | None = None,
               chunk: int = 900) -> None:
    """Per-step metrics (clip_threshold, epsilon_spent, the method's signals, and train_loss
    when the trace still has it) in batches, each at the time its step ended (``step_ms``, one
    per trace row; the logging time when the run's timings are missing)."""
    from mlflow.entities import Metric

    client = mlflow.tracking.MlflowClient()
    run_id = mlflow.active_run().info.run_id
    now = int(dt.datetime.now().timestamp() * 1000)
    stamps = step_ms if step_ms is not None and len(step_ms) == len(trace) else \
        [now] * len(trace)
    names = [n for n in STEP_METRICS + RUN_STEP_METRICS +
             tuple(NO_GUARANTEE_NAMES.values()) if n in trace] + \
        get_method(method).step_metrics(list(trace.columns))
    entries = [Metric(name, float(row[name]), stamp, int(row["step"]))
               for stamp, (_, row) in zip(stamps, trace.iterrows())
               for name in names if pd.notna(row[name])]
    for i in range(0, len(entries), chunk):
        client.log_batch(run_id, metrics=entries[i:i + chunk])
