"""The tune stage: the same trial budget for every method, public data only, seeded (the same
search twice gives the same values), params.yaml's values as the first trial, and the train
stage training with what it chose (and refusing values searched under other parameters)."""

from __future__ import annotations

import importlib

import numpy as np
import pandas as pd
import pytest

from conftest import prepared_project
from dpclip.cli import main
from dpclip.errors import ConfigError
from dpclip.pipeline.params import parse_params
from dpclip.files import read_json
from dpclip.layout import Layout
from dpclip.stages.tune import tuning_data

# the module (dpclip.stages.tune is also the name of the stage function the package exports)
tune_module = importlib.import_module("dpclip.stages.tune")

TUNE = {"trials": 3, "epochs": 1}


def _tuned_project(tmp_path, tiny_raw, write_params, methods, **sections):
    raw = tiny_raw(train={"methods": methods, "epochs": 1}, tune=TUNE, **sections)
    base = prepared_project(tmp_path, raw, write_params)
    assert main([*base, "tune"]) == 0
    return base, Layout(tmp_path)


def test_every_method_gets_the_same_trials_from_params_yaml_first(tmp_path, tiny_raw,
                                                                  write_params):
    methods = ["non_private", "dp_sgd", "dc_sgd_p"]
    _, layout = _tuned_project(tmp_path, tiny_raw, write_params, methods,
                               privacy={"target_epsilons": [1, 8]})
    record = read_json(layout.tuned)
    trials = pd.read_csv(layout.tuning_trials)
    assert set(record["runs"]) == set(methods)
    for method in methods:
        for tag in ("eps1", "eps8"):
            entry = record["runs"][method][tag]
            rows = trials[(trials["method"] == method) & (trials["epsilon"] == tag)]
            assert len(rows) == entry["trials"] == TUNE["trials"]  # the same budget
            first = rows[rows["trial"] == 0].iloc[0]
            assert first["train.lr"] == 0.5  # params.yaml's values are trial 0
            assert entry["default_accuracy"] == pytest.approx(first["accuracy"])
            assert entry["accuracy"] == pytest.approx(rows["accuracy"].max())
            assert entry["accuracy"] >= entry["default_accuracy"]
            # the gain is scored on records the search never saw: the chosen trial's
            assert entry["heldout_accuracy"] == pytest.approx(
                rows[rows["trial"] == entry["trial"]]["heldout_accuracy"].iloc[0])
            assert entry["default_heldout_accuracy"] == pytest.approx(first["heldout_accuracy"])
    assert "methods.dc_sgd_p.p" in trials and "train.clip_norm" in trials
    # no noise: the values do not depend on epsilon, one search serves both
    assert record["runs"]["non_private"]["eps1"] == record["runs"]["non_private"]["eps8"]


def test_the_search_is_seeded_and_kept_when_only_the_run_matrix_grows(tmp_path, tiny_raw,
                                                                      write_params,
                                                                      monkeypatch):
    base, layout = _tuned_project(tmp_path, tiny_raw, write_params, ["dp_sgd"])
    first = read_json(layout.tuned)
    assert main([*base, "tune"]) == 0
    assert read_json(layout.tuned) == first  # kept, not searched again
    searched = []
    real_search = tune_module.search
    monkeypatch.setattr(tune_module, "search",
                        lambda params, method, *a, **k: searched.append(method) or
                        real_search(params, method, *a, **k))
    raw = tiny_raw(train={"methods": ["dp_sgd", "auto_s"], "epochs": 1, "seeds": [0, 1]},
                   tune=TUNE)
    tune_module.tune(parse_params(raw), layout, progress=False)
    assert searched == ["auto_s"]  # dp_sgd's entry is still valid: a new seed changes nothing
    assert read_json(layout.tuned)["runs"]["dp_sgd"] == first["runs"]["dp_sgd"]
    tune_module.tune(parse_params(raw), layout, progress=False, force=True)
    assert searched == ["auto_s", "dp_sgd", "auto_s"]
    assert read_json(layout.tuned)["runs"]["dp_sgd"] == first["runs"]["dp_sgd"]  # seeded


def test_tuning_reads_public_splits_only_and_keeps_validation_apart(tmp_path, tiny_raw,
                                                                    write_params, monkeypatch):
    raw = tiny_raw(tune=TUNE)
    prepared_project(tmp_path, raw, write_params)
    read = []
    real = tune_module.load_split
    monkeypatch.setattr(tune_module, "load_split",
                        lambda layout, name: read.append(name) or real(layout, name))
    data = tuning_data(parse_params(raw), Layout(tmp_path))
    assert sorted(read) == ["shadow_holdout", "shadow_train"]
    rows = lambda x: {r.tobytes() for r in x}  # noqa: E731
    validation, scoring, public, check = rows(data.val_x), rows(data.test_x), \
        rows(data.public.x), rows(data.public.held_out[0])
    parts = [validation, scoring, public, check]
    assert all(not a & b for i, a in enumerate(parts) for b in parts[i + 1:])  # disjoint
    holdout = real(Layout(tmp_path), "shadow_holdout")[0]
    assert sum(len(part) for part in parts) == len(rows(holdout))
    # stratified: every class in the validation half
    assert set(np.unique(data.val_y)) == set(np.unique(data.y))


def test_train_uses_the_tuned_values_and_refuses_stale_ones(tmp_path, tiny_raw, write_params,
                                                            capsys):
    base, layout = _tuned_project(tmp_path, tiny_raw, write_params, ["dp_sgd"])
    chosen = read_json(layout.tuned)["runs"]["dp_sgd"]["eps8"]["values"]
    assert main([*base, "train"]) == 0
    record = read_json(layout.run_dir("dp_sgd-eps8-iid-seed0") / "record.json")
    assert record["tuned"] == chosen
    assert "public shadow splits only" in record["privacy"]["data_use"]["hyperparameters"]
    assert record["privacy"]["epsilon"] <= 8.0
    # a training parameter changed since the search: the values are refused, not used
    raw = tiny_raw(train={"methods": ["dp_sgd"], "epochs": 2}, tune=TUNE)
    params = write_params(raw)
    assert main(["--params", str(params), "--root", str(tmp_path), "--quiet", "train"]) == 2
    assert "searched under other" in capsys.readouterr().err


def test_tuning_off_searches_nothing_and_trains_with_params_yaml(tmp_path, tiny_raw,
                                                                write_params, capsys):
    raw = tiny_raw(train={"methods": ["dp_sgd"], "epochs": 1})
    base = prepared_project(tmp_path, raw, write_params)
    assert main([*base, "tune"]) == 0
    assert "no search" in capsys.readouterr().out
    layout = Layout(tmp_path)
    assert read_json(layout.tuned)["trials"] == 0
    assert main([*base, "train"]) == 0
    record = read_json(layout.run_dir("dp_sgd-eps8-iid-seed0") / "record.json")
    assert record["tuned"] is None
    assert record["privacy"]["data_use"]["hyperparameters"] == "params.yaml's values (not tuned)"


def test_a_range_must_increase(tiny_raw):
    with pytest.raises(ConfigError, match=r"tune\.lr: \[2\.0, 1\.0\]"):
        parse_params(tiny_raw(tune={"lr": [2.0, 1.0]}))


def test_the_report_shows_the_untuned_contrast(tmp_path):
    from dpclip.files import write_json
    from dpclip.stages.report import tuning_section

    layout = Layout(tmp_path)
    out = tmp_path / "reports"
    out.mkdir()
    assert "Not tuned" in "\n".join(tuning_section(layout, out))
    # selected at 0.9 over 0.8 on the selection records; on records the search never saw,
    # 0.84 against 0.8: the gain is 0.04, not the selection's 0.1
    entry = {"values": {"train.lr": 0.25, "train.clip_norm": 2.0}, "accuracy": 0.9,
             "default_accuracy": 0.8, "heldout_accuracy": 0.84,
             "default_heldout_accuracy": 0.8, "trials": 5}
    write_json(layout.tuned, {"trials": 5, "seed": 0, "sampler": "optuna TPE",
                              "objective": "accuracy", "runs": {"dp_sgd": {"eps8": entry}}})
    text = "\n".join(tuning_section(layout, out))
    assert "| dp_sgd | 8 | 5 | 0.8 | 0.84 | 0.04 | 0.9 | train.lr = 0.25, train.clip_norm = 2 |" \
        in text
    assert pd.read_csv(out / "tuning.csv")["gain"].iloc[0] == pytest.approx(0.04)


def test_mlflow_shows_the_values_a_tuned_run_trained_with(tmp_path, tiny_raw, write_params):
    from dpclip.run_keys import RunKey
    from dpclip.tracking import run_params

    base, layout = _tuned_project(tmp_path, tiny_raw, write_params, ["dp_sgd"])
    assert main([*base, "train"]) == 0
    chosen = read_json(layout.tuned)["runs"]["dp_sgd"]["eps8"]["values"]
    params = run_params(layout, RunKey("dp_sgd", 8, "iid", 0), {"dataset": "digits"})
    assert params["lr"] == str(chosen["train.lr"]) != "0.5"  # not params.yaml's value
    assert params["clip_norm"] == str(chosen["train.clip_norm"])
    assert params["tuned"] is True and "tuned.train.lr" not in params


def test_values_searched_on_other_data_are_refused(tmp_path, tiny_raw, write_params, capsys):
    base, layout = _tuned_project(tmp_path, tiny_raw, write_params, ["dp_sgd"])
    raw = tiny_raw(train={"methods": ["dp_sgd"], "epochs": 1}, tune=TUNE,
                   data={"max_records": 1500})  # the fingerprint ignores data.*; the hash not
    params = write_params(raw)
    args = ["--params", str(params), "--root", str(tmp_path), "--quiet"]
    assert main([*args, "prepare"]) == 0 and main([*args, "partition", "--alpha", "iid"]) == 0
    assert main([*args, "train"]) == 2
    assert "another data/prepared" in capsys.readouterr().err


def test_tuning_another_method_leaves_a_trained_run_current(tmp_path, tiny_raw, write_params):
    from dpclip.run_keys import RunKey
    from dpclip.catalog import BY_NAME
    from dpclip.pipeline.provenance import is_current

    base, layout = _tuned_project(tmp_path, tiny_raw, write_params, ["dp_sgd"])
    assert main([*base, "train"]) == 0
    raw = tiny_raw(train={"methods": ["dp_sgd", "auto_s"], "epochs": 1}, tune=TUNE)
    params = parse_params(raw)
    tune_module.tune(params, layout, progress=False)  # adds auto_s, rewrites tuned.json
    assert is_current(BY_NAME["train"], params, RunKey("dp_sgd", 8, "iid", 0), layout)
    assert not is_current(BY_NAME["train"], params, RunKey("auto_s", 8, "iid", 0), layout)


def test_a_run_reads_its_tuned_values_once(tmp_path, tiny_raw, write_params, monkeypatch):
    """One resolution of a run: training, its record and its provenance take the same values,
    read from tuned/tuned.json once (three reads of the file, twice each, before)."""
    import dpclip.pipeline.tuned as tuned_module
    from dpclip.stages.train import train

    base, layout = _tuned_project(tmp_path, tiny_raw, write_params, ["dp_sgd"])
    params = parse_params(tiny_raw(train={"methods": ["dp_sgd"], "epochs": 1}, tune=TUNE))
    reads = []
    real = tuned_module.read_json
    monkeypatch.setattr(tuned_module, "read_json",
                        lambda path: reads.append(path) or real(path))
    record = train(params, "dp_sgd", 8, "iid", 0, layout, progress=False)
    assert reads == [layout.tuned]
    assert record["tuned"] == read_json(layout.tuned)["runs"]["dp_sgd"]["eps8"]["values"]
    provenance = read_json(layout.run_dir("dp_sgd-eps8-iid-seed0") / "provenance.json")
    assert provenance["inputs"]["tuned"] == record["tuned"]


def test_shared_tuning_gives_every_method_the_baselines_learning_rate_and_c(
        tmp_path, tiny_raw, write_params, capsys):
    """tune.shared: one schedule for every method (a paper's protocol): dp_sgd is searched
    first, the others train with the learning rate and C it chose and search only their own
    knobs, so a difference between methods is not one of tuning."""
    raw = tiny_raw(train={"methods": ["non_private", "dc_sgd_p", "dp_sgd", "auto_s"],
                          "epochs": 1}, tune={**TUNE, "shared": True})
    base = prepared_project(tmp_path, raw, write_params)
    assert main([*base, "tune"]) == 0
    layout = Layout(tmp_path)
    runs = read_json(layout.tuned)["runs"]
    chosen = runs["dp_sgd"]["eps8"]["values"]
    assert set(chosen) >= {"train.lr", "train.clip_norm"}
    shared = {k: chosen[k] for k in ("train.lr", "train.clip_norm")}
    for method in ("dc_sgd_p", "auto_s"):
        entry = runs[method]["eps8"]
        assert entry["shared"] == shared
        assert {k: entry["values"][k] for k in shared} == shared
    assert "methods.dc_sgd_p.p" in runs["dc_sgd_p"]["eps8"]["values"]  # its own knob
    trials = pd.read_csv(layout.tuning_trials)
    dc = trials[trials["method"] == "dc_sgd_p"]
    assert len(dc) == TUNE["trials"] and set(dc["train.lr"]) == {shared["train.lr"]}
    assert "shared" not in runs["non_private"]["eps8"] or \
        runs["non_private"]["eps8"]["shared"] == {}  # no privacy: its own search
    assert main([*base, "train"]) == 0  # the runs take the values (fingerprints match)
    record = read_json(layout.run_dir("auto_s-eps8-iid-seed0") / "record.json")
    assert {k: record["tuned"][k] for k in shared} == shared
    with pytest.raises(ConfigError, match=r"tune\.shared: True gives every method dp_sgd's"):
        parse_params(tiny_raw(train={"methods": ["auto_s"]}, tune={**TUNE, "shared": True}))


def test_a_trial_can_take_the_runs_batch_steps_and_noise():
    """tune.match: steps. A run on 60,000 members with B = 256 for 15 epochs takes
    T = 15 * floor(60000 / 256) = 15 * 234 = 3510 steps; on 10,500 public records a batch of
    256 gives floor(10500 / 256) = 41 steps an epoch, so the trial takes round(3510 / 41) = 86
    epochs, 3526 steps, at the epsilon for which the noise search finds the run's sigma."""
    from dpclip.privacy import epsilon_of, noise_for_epsilon
    from dpclip.train import TrainConfig

    run = TrainConfig.of("dp_sgd", 0.5, batch_size=256, epochs=15)
    trial = tune_module.with_the_runs_steps(run, 10_500, 60_000)
    assert trial.train.epochs == 86 and trial.train.batch_size == 256
    sigma = noise_for_epsilon(0.5, 1e-5, 256 / 60_000, 3510, "rdp", 0.01)
    assert trial.target_epsilon == pytest.approx(
        epsilon_of("rdp", [(sigma, 256 / 10_500, 3526)], 1e-5))
    assert trial.target_epsilon > 2 * 0.5  # q' = 5.7 q: the same noise gives a larger epsilon
    found = noise_for_epsilon(trial.target_epsilon, 1e-5, 256 / 10_500, 3526, "rdp", 0.01)
    assert sigma <= found <= 1.01 * sigma  # the run's noise, from above, within the tolerance
    # tune.epochs 3 of 15: a fifth of the steps, round(702 / 41) = 17 epochs, the run's sigma
    short = tune_module.with_the_runs_steps(run, 10_500, 60_000, 3)
    assert short.train.epochs == 17
    assert sigma <= noise_for_epsilon(short.target_epsilon, 1e-5, 256 / 10_500, 17 * 41, "rdp",
                                      0.01) <= 1.01 * sigma
    with pytest.raises(ConfigError, match=r"tune.members: 100 records cannot take the run's "
                                          r"plan \(train.batch_size: 256 is larger"):
        tune_module.with_the_runs_steps(run, 10_500, 100)
    # no noise, or a mechanism of its own: the steps only
    plain = tune_module.with_the_runs_steps(
        TrainConfig.of("non_private", None, batch_size=256, epochs=15), 10_500, 60_000)
    assert plain.train.epochs == 86 and plain.target_epsilon is None
    own = tune_module.with_the_runs_steps(
        TrainConfig.of("sanitize", 0.5, batch_size=256, epochs=15), 10_500, 60_000)
    assert own.target_epsilon == 0.5


def test_the_stage_trains_each_trial_at_the_runs_steps(tmp_path, tiny_raw, write_params,
                                                       monkeypatch):
    """Through the stage: the members split's size is the run's (tune.members unset), and a
    record searched with the default (epochs) is not reused for steps."""
    raw = tiny_raw(train={"methods": ["dp_sgd"], "epochs": 1}, tune={**TUNE, "trials": 1})
    base = prepared_project(tmp_path, raw, write_params)
    assert main([*base, "tune"]) == 0
    layout = Layout(tmp_path)
    seen = []
    real = tune_module.train_model

    def recorded(x, y, shape, classes, cfg, **kw):
        result = real(x, y, shape, classes, cfg, **kw)
        seen.append((len(x), cfg, result.privacy["noise_multiplier"]))
        return result

    monkeypatch.setattr(tune_module, "train_model", recorded)
    steps = write_params(tiny_raw(train={"methods": ["dp_sgd"], "epochs": 1},
                                  tune={**TUNE, "trials": 1, "match": "steps"}))
    assert main(["--params", str(steps), "--root", str(tmp_path), "--quiet", "tune"]) == 0
    (n_public, cfg, trained_sigma), = seen  # searched again: the fingerprint has match: steps
    members = read_json(layout.prepared_meta)["sizes"]["target_train"]
    # the run's: 1 epoch of the members, floor(members / 64) steps; the trial takes as many
    assert cfg.train.epochs == round((members // 64) / (n_public // 64)) > 1
    from dpclip.privacy import noise_for_epsilon

    run_sigma = noise_for_epsilon(8, 1e-5, 64 / members, members // 64, "rdp", 0.01)
    assert run_sigma <= trained_sigma <= 1.01 * run_sigma  # what the trial trained with


def test_every_tune_key_enters_the_search_s_fingerprint(tiny_raw):
    from dpclip.pipeline import tuned

    before = parse_params(tiny_raw(tune=TUNE))
    steps = parse_params(tiny_raw(tune={**TUNE, "match": "steps", "members": 60_000}))
    assert tuned.fingerprint(steps, "dp_sgd") != tuned.fingerprint(before, "dp_sgd")
    with pytest.raises(ConfigError, match="tune.members: 60000 is read only with tune.match"):
        parse_params(tiny_raw(tune={**TUNE, "members": 60_000}))
