"""tune: the same hyperparameter search for every method, on public data only.

Optuna's TPE sampler runs ``tune.trials`` trials per method and target epsilon over the
method's tuning space, trial 0 being params.yaml's values; each trial trains with the real DP
mechanism on the public ``shadow_train`` split and is scored on a quarter of ``shadow_holdout``,
the gain on another quarter the search never sees. No private record is read, so the search
costs no privacy. Writes ``tuned/tuned.json`` and ``tuned/trials.csv``. docs/tuning.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from dpclip.stage_outputs import load_split
from dpclip.config import Params
from dpclip.errors import ConfigError, DpclipError
from dpclip.hashing import file_hash
from dpclip.models import model_file
from dpclip.files import read_json, write_csv_frame, write_json
from dpclip.layout import Layout
from dpclip.methods import REGISTRY, get_method
from dpclip.methods.base import Tunable
from dpclip.models import logits_of
from dpclip.run_keys import epsilon_tag
from dpclip.code_closure import PACKAGE, closure_files
from dpclip.privacy import epsilon_of, noise_for_epsilon
from dpclip.threads import use_threads
from dpclip.train import PublicData, TrainConfig, train_model
from dpclip.train.runs import run_class
from dpclip.pipeline.inputs import checkpoint_of, evaluation_model, needs_public, train_config
from dpclip.pipeline.tuned import fingerprint, value_at, with_values

OBJECTIVE = "accuracy on the selection quarter of the public shadow_holdout split"
BASELINE = "dp_sgd"
# tune.shared: what the baseline's search chooses for every private method
SHARED = ("train.lr", "train.clip_norm")


@dataclass
class TuningData:
    """Public records only: stand-in members, validation records, and the public data a
    method may read without noise (disjoint from both)."""

    x: np.ndarray
    y: np.ndarray
    val_x: np.ndarray  # selection: the search maximises accuracy here
    val_y: np.ndarray
    test_x: np.ndarray  # held out from the search: the gain is scored here
    test_y: np.ndarray
    public: PublicData
    feature_shape: tuple[int, ...]
    n_classes: int

    def sizes(self) -> dict:
        return {"members (shadow_train)": int(len(self.x)),
                "selection (shadow_holdout quarter)": int(len(self.val_x)),
                "gain scoring (shadow_holdout quarter)": int(len(self.test_x)),
                "method's public data (other half)": int(len(self.public.x)),
                "its held-out check": int(len(self.public.held_out[0]))}


def _halves(y: np.ndarray, rng: np.random.Generator, fraction: float) -> tuple:
    """Positions split per class: about ``fraction`` of each class first, the rest second."""
    first, second = [], []
    for label in np.unique(y):
        where = rng.permutation(np.flatnonzero(y == label))
        cut = int(round(fraction * len(where)))
        first.append(where[:cut])
        second.append(where[cut:])
    return np.sort(np.concatenate(first)), np.sort(np.concatenate(second))


def tuning_data(params: Params, layout: Layout) -> TuningData:
    """The public splits, divided by ``tune.seed`` (stratified): shadow_train as members;
    shadow_holdout half validation (a quarter for selection, a quarter to score the gain), half
    the method's public data (3/4 train, 1/4 check)."""
    x, y, _ = load_split(layout, "shadow_train")
    hx, hy, _ = load_split(layout, "shadow_holdout")
    rng = np.random.default_rng(params.tune.seed)
    val, rest = _halves(hy, rng, 0.5)
    pub, check = _halves(hy[rest], rng, 0.75)
    pub, check = rest[pub], rest[check]
    select, score = _halves(hy[val], rng, 0.5)
    select, score = val[select], val[score]
    meta = read_json(layout.prepared_meta)
    return TuningData(x, y, hx[select], hy[select], hx[score], hy[score],
                      PublicData(hx[pub], hy[pub], (hx[check], hy[check])),
                      tuple(meta["feature_shape"]), int(meta["n_classes"]))


def trial_accuracy(params: Params, method: str, epsilon, data: TuningData,
                   layout: Layout) -> tuple[float, float]:
    """Train ``method`` under ``params`` on the stand-in members at the target epsilon; its
    accuracy on the selection records and on the held-out scoring records."""
    cfg = train_config(params, method, epsilon, params.tune.seed, layout, tuned=False)
    if params.tune.match == "steps":  # the run's steps and noise, from its own epochs
        members = params.tune.members or \
            int(read_json(layout.prepared_meta)["sizes"]["target_train"])
        cfg = with_the_runs_steps(cfg, len(data.x), members, params.tune.epochs)
    elif params.tune.epochs is not None:
        cfg = cfg.with_train(epochs=params.tune.epochs)
    result = train_model(data.x, data.y, data.feature_shape, data.n_classes, cfg,
                         progress=False, public=data.public if needs_public(cfg) else None)
    meta = {"feature_shape": list(data.feature_shape), "n_classes": data.n_classes}
    model = evaluation_model(checkpoint_of(result, cfg, meta), method)
    selection = logits_of(model, data.val_x).argmax(axis=1)
    held_out = logits_of(model, data.test_x).argmax(axis=1)
    return float(np.mean(selection == data.val_y)), float(np.mean(held_out == data.test_y))


def with_the_runs_steps(cfg: TrainConfig, n_public: int, members: int,
                        trial_epochs: int | None = None) -> TrainConfig:
    """A trial on ``n_public`` public records that takes the steps of the run on ``members``
    records (``tune.match: steps``): the run's plan (its kind's: q and T; for Poisson batches
    of B, q = B / members) and noise multiplier sigma, at the epsilon for which the noise search
    finds sigma again at the trial's own plan. ``trial_epochs`` (``tune.epochs``) shortens it
    to T * trial_epochs / epochs steps at the same sigma; a run kind whose noise is not the
    search's for its plan (no noise, or a mechanism of its own) gets the steps only. The
    derivation: docs/tuning.md, "How a trial is scored"."""
    method = get_method(cfg.method)
    kind, options = run_class(method.run_kind), method.typed_options(cfg.method_options)
    try:
        q, _, steps = kind.plan(members, cfg, options)
    except DpclipError as exc:
        raise ConfigError([f"tune.members: {members} records cannot take the run's plan "
                           f"({exc})"]) from exc
    _, per_epoch, _ = kind.plan(n_public, cfg.with_train(epochs=1), options)
    trial_steps = steps * (trial_epochs or cfg.train.epochs) / cfg.train.epochs
    trial = cfg.with_train(epochs=max(1, round(trial_steps / per_epoch)))
    if cfg.target_epsilon is None or not kind.noise_for_target:
        return trial
    privacy = cfg.privacy
    sigma = noise_for_epsilon(cfg.target_epsilon, privacy.delta, q, steps, privacy.accountant,
                              privacy.epsilon_tolerance)
    trial_q, _, trial_steps = kind.plan(n_public, trial, options)
    epsilon = epsilon_of(privacy.accountant, [(sigma, trial_q, trial_steps)], privacy.delta)
    return replace(trial, target_epsilon=epsilon)


def _suggest(trial, key: str, t: Tunable):
    if t.integer:
        return trial.suggest_int(key, int(t.low), int(t.high), log=t.log)
    return trial.suggest_float(key, t.low, t.high, log=t.log)


def tuning_space(params: Params, method: str) -> dict[str, Tunable]:
    """What a search for ``method`` varies (:meth:`dpclip.methods.base.Method.tuning_space`)."""
    cls = get_method(method)
    return cls.tuning_space(cls.typed_options(params.method_options(method)),
                            Tunable(*params.tune.lr, log=True),
                            Tunable(*params.tune.clip_norm, log=True))


def search(params: Params, method: str, epsilon, data: TuningData, layout: Layout,
           progress: bool = True, given: dict | None = None) -> tuple[dict, list[dict]]:
    """``tune.trials`` TPE trials for (method, epsilon), the first at params.yaml's values;
    (the tuned entry, one row per trial). ``given``: values chosen elsewhere (the baseline's
    learning rate and C under ``tune.shared``), set and left out of the search; with nothing
    left to search, one trial scores them."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tune = params.tune
    space = tuning_space(params, method)
    given = {key: value for key, value in (given or {}).items() if key in space}
    searched_under = fingerprint(params, method)  # params.yaml's, as a run checks it
    if given:
        params = with_values(params, given)
        space = {key: t for key, t in space.items() if key not in given}
    trials = tune.trials if space else 1
    defaults = {key: value_at(params.to_dict(), key) for key in space}
    sampler = optuna.samplers.TPESampler(seed=tune.seed,
                                         n_startup_trials=min(10, max(2, tune.trials // 2)))
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial(defaults, skip_if_exists=False)
    rows: list[dict] = []
    bar = tqdm(total=trials, desc=f"tune {method} {epsilon_tag(epsilon)}",
               disable=not progress, leave=False)

    def objective(trial) -> float:
        values = {key: _suggest(trial, key, t) for key, t in space.items()}
        try:
            trial_params = with_values(params, values)
        except ConfigError as exc:  # a combination the method refuses (e.g. c_min > C)
            rows.append({**given, **values, "trial": trial.number, "state": "refused",
                         "accuracy": None, "reason": str(exc)})
            raise optuna.TrialPruned(str(exc)) from exc
        accuracy, held_out = trial_accuracy(trial_params, method, epsilon, data, layout)
        rows.append({**given, **values, "trial": trial.number, "state": "complete",
                     "accuracy": accuracy, "heldout_accuracy": held_out, "reason": ""})
        return accuracy  # the search sees the selection records only

    def advance(study, trial) -> None:
        bar.update(1)
        best = [t.value for t in study.trials if t.value is not None]
        if best:
            bar.set_postfix(best=f"{max(best):.4f}")

    study.optimize(objective, n_trials=trials, callbacks=[advance])
    bar.close()
    complete = [r for r in rows if r["state"] == "complete"]
    if not complete:
        raise ConfigError([f"tune: every trial of {method} at {epsilon_tag(epsilon)} was "
                           f"refused; first reason: {rows[0]['reason']}"])
    best = max(complete, key=lambda r: (r["accuracy"], -r["trial"]))  # ties: the earlier
    default = rows[0]
    entry = {"values": {**given, **{key: best[key] for key in space}},
             "accuracy": best["accuracy"], "trial": best["trial"],
             "default_values": {**given, **defaults}, "shared": given,
             "default_accuracy": default["accuracy"], "trials": trials,
             "heldout_accuracy": best.get("heldout_accuracy"),
             "default_heldout_accuracy": default.get("heldout_accuracy"),
             "fingerprint": searched_under}
    return entry, [{"method": method, "epsilon": epsilon_tag(epsilon), **r} for r in rows]


def search_inputs(params: Params, layout: Layout) -> dict:
    """What the tuned record depends on: each configured method's fingerprint, the target
    epsilons, the public data, the shadow risks, a model file of the user's own and the code."""
    model = model_file(params.train.model)
    # the code a search runs: the package files of this stage, of training and of every method
    code = closure_files(["dpclip.stages.tune", "dpclip.stages.train",
                          *(cls.__module__ for cls in REGISTRY.values())])
    return {"fingerprints": {m: fingerprint(params, m) for m in params.train.methods},
            "target_epsilons": [epsilon_tag(e) for e in params.privacy.target_epsilons],
            "files": {"data/prepared": file_hash(layout.prepared),
                      "shadow/risk.json": file_hash(layout.shadow_risk),
                      **({"train.model": file_hash(model)} if model else {}),
                      **{f"src/dpclip/{p}": file_hash(PACKAGE / p) for p in code}}}


def tune(params: Params, layout: Layout = Layout(), progress: bool = True,
         force: bool = False) -> dict:
    """Search every configured (method, target epsilon); write ``tuned/tuned.json`` and
    ``tuned/trials.csv``; return the tuned record. A method without noise is searched once and
    its values serve every epsilon. A (method, epsilon) the record on disk searched under the
    same fingerprint, data, risks and code (:func:`search_inputs`) keeps its entry and trials
    (adding a method or a seed searches nothing again), unless ``force``."""
    tune_params = params.tune
    inputs = search_inputs(params, layout) if tune_params.trials else None
    kept, kept_rows = _reusable(layout, inputs) if inputs and not force else ({}, None)
    record = {"trials": tune_params.trials, "seed": tune_params.seed, "sampler": "optuna TPE",
              "objective": OBJECTIVE, "inputs": inputs, "runs": {}}
    rows: list[dict] = []
    seconds: dict[str, float] = {}
    if tune_params.trials:
        use_threads(params.train.threads)
        data = tuning_data(params, layout)
        record["data"] = data.sizes()
        for method in _search_order(params):
            record["runs"][method] = {}
            searched = None
            for epsilon in params.privacy.target_epsilons:
                tag = epsilon_tag(epsilon)
                given = _shared_values(params, method, record["runs"].get(BASELINE, {}).get(tag))
                entry = kept.get(method, {}).get(tag)
                if entry is not None and entry.get("shared", {}) == given:
                    trial_rows = kept_rows[(kept_rows["method"] == method) &
                                           (kept_rows["epsilon"] == tag)].to_dict("records")
                elif searched is not None:  # non-private: the same search at every epsilon
                    record["runs"][method][tag] = searched[0]
                    rows += [{**r, "epsilon": tag} for r in searched[1]]
                    continue
                else:
                    started = time.perf_counter()
                    entry, trial_rows = search(params, method, epsilon, data, layout, progress,
                                               given)
                    seconds[f"{method}-{tag}"] = round(time.perf_counter() - started, 3)
                record["runs"][method][tag] = entry
                rows += trial_rows
                if not get_method(method).private:
                    searched = entry, trial_rows
    columns = ["method", "epsilon", "trial", "state", "accuracy", "heldout_accuracy", "reason"]
    rows = [{k: v for k, v in r.items() if not (isinstance(v, float) and np.isnan(v))}
            for r in rows]  # a kept row has empty cells for other methods' knobs
    frame = pd.DataFrame(rows)
    frame = frame.reindex(columns=columns + sorted(set(frame.columns) - set(columns)))
    write_csv_frame(layout.tuning_trials, frame)
    write_json(layout.tuned, record)
    write_json(layout.root / "timings" / "tune.json", {"seconds": seconds})
    return record


def _search_order(params: Params) -> list[str]:
    """The configured methods, the baseline first under ``tune.shared`` (the others take its
    learning rate and C)."""
    methods = list(params.train.methods)
    if not params.tune.shared:
        return methods
    # shared: the parameters' check made sure dp_sgd is configured (dpclip.pipeline.params)
    return [BASELINE, *(m for m in methods if m != BASELINE)]


def _shared_values(params: Params, method: str, baseline_entry: dict | None) -> dict:
    """Under ``tune.shared``, the learning rate and C the baseline's search chose at this
    epsilon, for every other private method; nothing otherwise."""
    if not params.tune.shared or method == BASELINE or not get_method(method).private:
        return {}
    values = (baseline_entry or {}).get("values", {})
    space = tuning_space(params, method)  # sanitize never reads train.lr nor C
    return {key: values[key] for key in SHARED if key in values and key in space}


def _reusable(layout: Layout, inputs: dict) -> tuple[dict, pd.DataFrame | None]:
    """The entries of the record on disk still valid under ``inputs`` (same data, risks and
    code; each entry's own fingerprint), by method and epsilon tag, and its trial rows."""
    if not (layout.tuned.is_file() and layout.tuning_trials.is_file()):
        return {}, None
    previous = read_json(layout.tuned)
    if (previous.get("inputs") or {}).get("files") != inputs["files"]:
        return {}, None
    kept = {method: {tag: e for tag, e in by_eps.items()
                     if e["fingerprint"] == inputs["fingerprints"].get(method)}
            for method, by_eps in previous.get("runs", {}).items()}
    return kept, pd.read_csv(layout.tuning_trials, keep_default_na=True)


def describe(record: dict, layout: Layout) -> str:
    """One line per tuned (method, epsilon): the default's and the tuned accuracy, the values."""
    if not record["trials"]:
        return "tune.trials is 0: no search; training uses the values in params.yaml"
    lines = [f"{record['trials']} trials each ({record['sampler']}, seed {record['seed']}), "
             f"objective: {record['objective']}"]
    for method, by_eps in record["runs"].items():
        for tag, e in by_eps.items():
            values = ", ".join(f"{k.split('.')[-1]}={v:.4g}" for k, v in e["values"].items())
            default = "refused" if e["default_accuracy"] is None else \
                f"{e['default_accuracy']:.4f}"
            lines.append(f"{method} {tag}: accuracy {e['accuracy']:.4f} (params.yaml's "
                         f"values: {default}) with {values}")
    return "\n".join(lines)
