"""Paper presets: the overlays merge over params.yaml, dataset paths resolve against the
datasets folder, every committed preset validates, and a preset runs the whole pipeline into
its own folder (digits, tiny) without touching the project's outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import merged, prepared_project, tiny_project_params
from dpclip.cli import main
from dpclip.pipeline.params import parse_params
from dpclip.errors import DpclipError
from dpclip.files import read_json
from dpclip.tools.presets import available_presets, load_preset, variant_params
from dpclip.reporting.seed_stats import minimum_exact_seeds, seeds_needed

PROJECT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", available_presets(PROJECT / "presets"))
def test_every_committed_preset_is_valid_and_reads_the_shared_datasets(name, tmp_path):
    preset = load_preset(name, PROJECT / "presets")
    assert preset["deviations"] and preset["source"]
    for variant in (preset.get("variants") or {"main": {}}):
        raw = variant_params(preset, variant, PROJECT / "params.yaml", tmp_path / "sets")
        params = parse_params(raw)  # validated as params.yaml is
        assert params.data.path.startswith(str(tmp_path / "sets"))
        # the fewest seeds at which the exact test can reach 5% (runs may use fewer: --seeds)
        assert len(params.train.seeds) >= minimum_exact_seeds()
        assert not params.data.download  # the real files, never fetched
        # research comparisons, paired by seed: the methods share their noise, as every
        # committed result ran (the default is independent noise for released models)
        assert params.privacy.common_random_numbers, (name, variant)


def test_a_variant_overlays_the_preset_and_an_unknown_one_is_refused(tmp_path):
    preset = load_preset("table11", PROJECT / "presets")
    raw = variant_params(preset, "C0.25", PROJECT / "params.yaml", tmp_path)
    assert raw["train"]["clip_norm"] == 0.25 and raw["train"]["model"] == "paper_cnn"
    with pytest.raises(DpclipError, match="'C3' is not one of"):
        variant_params(preset, "C3", PROJECT / "params.yaml", tmp_path)
    with pytest.raises(DpclipError, match="does not exist"):
        load_preset("table99", PROJECT / "presets")
    # LiRA and RMIA in a preset: at least 8 reference models, or none
    weak = {**preset, "params": {**preset["params"], "attack": {"references": 2}}}
    with pytest.raises(DpclipError, match="attack.references: 2 is too few for evidence"):
        variant_params(weak, "C1", PROJECT / "params.yaml", tmp_path)
    strong = {**preset, "params": {**preset["params"], "attack": {"references": 8}}}
    assert variant_params(strong, "C1", PROJECT / "params.yaml", tmp_path)["attack"][
        "references"] == 8


def test_a_preset_runs_the_pipeline_in_its_own_folder(tmp_path, capsys):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_project_params()))
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "tiny.yaml").write_text(yaml.safe_dump({
        "description": "d", "source": "s", "deviations": ["digits, not MNIST"],
        "params": {"train": {"methods": ["dp_sgd"], "seeds": [0, 1], "epochs": 1},
                   "attack": {"references": 0}, "audit": {"kinds": []},
                   "evaluate": {"ir_attack": False}, "shadow": {"epochs": 1}},
        "variants": {"C1": {"train": {"clip_norm": 1.0}}, "C2": {"train": {"clip_norm": 2.0}}}}))
    assert main(["--root", str(tmp_path), "--quiet", "preset", "tiny", "--variant", "C2"]) == 0
    out = tmp_path / "results" / "presets" / "tiny"
    record = read_json(out / "preset.json")
    assert list(record["variants"]) == ["C2"] and record["deviations"] == ["digits, not MNIST"]
    assert record["variants"]["C2"]["devices"] == ["cpu"]  # what the numbers were computed on
    assert (out / "C2" / "reports" / "comparison.csv").is_file()
    assert read_json(out / "C2" / "runs" / "dp_sgd-eps8-iid-seed1" / "record.json")
    assert yaml.safe_load((out / "C2" / "params.yaml").read_text())["train"]["clip_norm"] == 2.0
    assert not (tmp_path / "runs").exists()  # the project's own outputs untouched
    assert "tiny C2:" in capsys.readouterr().out


def _two_variant_project(root: Path) -> Path:
    root.mkdir()
    # the project's own count is 2: the preset's runs must get 1 whatever the project says
    (root / "params.yaml").write_text(yaml.safe_dump(merged(tiny_project_params(),
                                                            {"train": {"threads": 2}})))
    (root / "presets").mkdir()
    (root / "presets" / "tiny.yaml").write_text(yaml.safe_dump({
        "description": "d", "source": "s", "deviations": ["digits"],
        "params": {"train": {"methods": ["dp_sgd"], "seeds": [0], "epochs": 1},
                   "attack": {"references": 0}, "audit": {"kinds": []},
                   "evaluate": {"ir_attack": False}, "shadow": {"epochs": 1}},
        "variants": {"C1": {"train": {"clip_norm": 1.0}}, "C2": {"train": {"clip_norm": 2.0}}}}))
    return root


def test_variants_side_by_side_give_the_numbers_one_after_another_gives(tmp_path, capsys):
    import pandas as pd

    tables = {}
    for jobs in (1, 2):
        project = _two_variant_project(tmp_path / f"jobs{jobs}")
        assert main(["--root", str(project), "preset", "tiny", "--jobs", str(jobs)]) == 0
        out = project / "results" / "presets" / "tiny"
        assert set(read_json(out / "preset.json")["variants"]) == {"C1", "C2"}
        for variant in ("C1", "C2"):  # one torch thread per run, whatever the layout
            raw = yaml.safe_load((out / variant / "params.yaml").read_text())
            assert raw["train"]["threads"] == 1
            tables[jobs, variant] = pd.read_csv(out / variant / "reports" / "comparison.csv")
            if jobs == 2:  # each variant's progress in its own log, not interleaved
                assert "train dp_sgd-eps8-iid-seed0" in (out / variant / "preset.log").read_text()
    assert "2 variants, 2 at a time" in capsys.readouterr().out
    for variant in ("C1", "C2"):
        columns = ["accuracy", "ece", "epsilon", "mia_auc", "c_final"]
        pd.testing.assert_frame_equal(tables[1, variant][columns], tables[2, variant][columns])
    assert not tables[1, "C1"]["accuracy"].equals(tables[1, "C2"]["accuracy"])
    with pytest.raises(DpclipError, match="--jobs: 0 must be at least 1"):
        from dpclip.tools.presets import run_preset
        run_preset("tiny", project=tmp_path / "jobs1", jobs=0)


def test_one_variant_runs_its_runs_side_by_side(tmp_path, monkeypatch):
    """With one variant there is nothing to put beside it: its runs go side by side instead,
    ``--jobs`` at a time (tests/pipeline/test_side_by_side.py: the same numbers); variants one
    after another (``--jobs 1``) keep their runs in one process."""
    from dpclip.tools import presets

    calls = []
    monkeypatch.setattr(presets, "run_in_folder", lambda raw, root, track=False, progress=True,
                        jobs=1: calls.append((root.name, jobs)) or 1.0)
    project = _two_variant_project(tmp_path / "project")
    presets.run_preset("tiny", project=project, variants=["C2"], jobs=2, progress=False)
    presets.run_preset("tiny", project=project, jobs=1, progress=False)
    assert calls == [("C2", 2), ("C1", 1), ("C2", 1)]
    # without --jobs: the per-run stages' rule (one thread a run: a worker per CPU; a GPU: 1)
    monkeypatch.delenv("DPCLIP_JOBS", raising=False)
    monkeypatch.setattr("dpclip.pipeline.side_by_side.cpu_count", lambda: 3)
    presets.run_preset("tiny", project=project, variants=["C1"], progress=False)
    assert calls[-1] == ("C1", 3)


def test_a_preset_states_its_expected_training_time_before_it_trains(tmp_path, capsys):
    from dpclip.pipeline.params import load_params
    from dpclip.layout import Layout
    from dpclip.tools.folder_run import expected_cost

    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_project_params()))
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "tiny.yaml").write_text(yaml.safe_dump({
        "description": "d", "source": "s", "deviations": ["digits"],
        "params": {"train": {"methods": ["dp_sgd"], "seeds": [0, 1], "epochs": 2},
                   "attack": {"references": 0}, "audit": {"kinds": []},
                   "evaluate": {"ir_attack": False}, "shadow": {"epochs": 1}}}))
    assert main(["--root", str(tmp_path), "preset", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "expected training: 2 runs, about" in out and "dp_sgd 2 x " in out
    root = tmp_path / "results" / "presets" / "tiny" / "main"
    params, layout = load_params(root / "params.yaml"), Layout(root)
    assert expected_cost(params, layout) == {"runs": 0, "seconds": 0.0, "seconds_all": 0.0,
                                             "methods": {}}
    # the plan it states is the run's own: the steps each trained run records
    steps = read_json(root / "runs" / "dp_sgd-eps8-iid-seed0" / "record.json")["privacy"]["steps"]
    assert f"dp_sgd 2 x {steps} steps" in out
    assert main(["--root", str(tmp_path), "preset", "tiny"]) == 0
    assert "expected training: none, every run is up to date" in capsys.readouterr().out


def test_the_stated_time_counts_the_audit_and_reference_models_each_run_trains(
        tmp_path, tiny_raw, write_params):
    from dpclip.tools.cost import cost_text, training_cost
    from dpclip.layout import Layout
    from dpclip.run_keys import configured_runs
    from dpclip.pipeline.params import load_params

    raw = tiny_raw(train={"methods": ["non_private", "dp_sgd", "adaclip_opacus"],
                          "seeds": [0, 1]},
                   audit={"kinds": ["whitebox", "blackbox"]}, attack={"references": 4})
    prepared_project(tmp_path, raw, write_params)
    params = load_params(tmp_path / "params.yaml")
    cost = training_cost(params, Layout(tmp_path), configured_runs(params), steps=1)
    # the target, one model per audit kind for a run with a DP claim, and the references
    assert cost["methods"]["dp_sgd"]["models_per_run"] == 1 + 2 + 4
    assert cost["methods"]["non_private"]["models_per_run"] == 1 + 0 + 4
    # no shared DP step for gradient canaries: the black-box audit alone
    assert cost["methods"]["adaclip_opacus"]["models_per_run"] == 1 + 1 + 4
    per_run = {name: m["steps_per_run"] * m["step_s"] + m["setup_s"]
               for name, m in cost["methods"].items()}
    assert cost["seconds"] == pytest.approx(2 * sum(per_run.values()))
    assert cost["seconds_all"] == pytest.approx(14 * per_run["dp_sgd"] + 10 * per_run[
        "non_private"] + 12 * per_run["adaclip_opacus"])
    text = cost_text(cost)
    assert "(5/6/7 models a run in all)" in text and text.endswith("evaluation not included)")


# --- seeds by power --------------------------------------------------------------------------

# paired differences ww - dp per seed: mean 0.01 and sample sd 0.02 whatever the count
# (alternating +-c about the mean, c set so the sample variance is 0.02^2; an odd count adds
# one difference at the mean)
def _differences(n: int) -> list[float]:
    pairs = n - n % 2
    c = 0.02 * ((n - 1) / pairs) ** 0.5
    return [0.01 + (c if i % 2 else -c) * (i < pairs) for i in range(n)]


def _fake_run(seconds_per_seed: float, calls: list):
    """A stand-in for the pipeline: writes the summary a preset run would, for the seeds asked,
    with the differences above; its wall time is the new seeds' cost."""
    import pandas as pd

    def run_variant(raw, root, track=False, progress=True, jobs=1):
        seeds = raw["train"]["seeds"]
        calls.append(len(seeds))
        done = len(pd.read_csv(root / "reports" / "comparison.csv")) // 2 \
            if (root / "reports" / "comparison.csv").is_file() else 0
        rows = []
        for seed, d in zip(seeds, _differences(len(seeds))):
            rows += [{"method": "dp_sgd", "seed": seed, "target_epsilon": 8, "alpha": "iid",
                      "accuracy": 0.9},
                     {"method": "ww_dp_sgd", "seed": seed, "target_epsilon": 8,
                      "alpha": "iid", "accuracy": 0.9 + d}]
        (root / "reports").mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_csv(root / "reports" / "comparison.csv", index=False)
        (root / "timings").mkdir(exist_ok=True)
        for seed in seeds:  # one run's training time per seed, as the train stage records
            (root / "timings" / f"run-seed{seed}.json").write_text(
                json.dumps({"train_s": seconds_per_seed}))
        return seconds_per_seed * (len(seeds) - done) + 1.0  # + set-up
    return run_variant


def _power_project(tmp_path: Path) -> Path:
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_project_params()))
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "toy.yaml").write_text(yaml.safe_dump({
        "description": "d", "source": "s", "deviations": ["none"],
        "params": {"attack": {"references": 0}}}))
    (tmp_path / "presets" / "claims.yaml").write_text(yaml.safe_dump({"claims": [{
        "id": "toy", "claim": "ww is more accurate", "source": "s", "paper": "p",
        "preset": "toy", "rule": "better", "method": "ww_dp_sgd", "baseline": "dp_sgd",
        "metric": "accuracy", "effect": 0.01}]}))
    return tmp_path


@pytest.mark.parametrize("budget_s, expected_capped", [(10_000, False), (120, True)])
def test_seeds_by_power_runs_what_the_claims_need_within_the_budget(
        tmp_path, monkeypatch, budget_s, expected_capped):
    from dpclip.tools import presets

    project = _power_project(tmp_path)
    calls: list[int] = []
    monkeypatch.setattr(presets, "run_in_folder", _fake_run(10.0, calls))
    needed = seeds_needed(0.02, 0.01)  # d = 0.5: the G*Power value is 34
    assert needed == 34
    record = presets.seeds_by_power("toy", budget_s, project=project)
    power = record["power"]
    assert calls[0] == minimum_exact_seeds()  # first the fewest the exact test can use
    if expected_capped:  # 120 s at 10 s a seed: 12 seeds, short of the 34 needed
        assert power == {"seeds": 12, "seeds_needed": 34, "budget_s": 120, "capped": True}
    else:
        assert power == {"seeds": 34, "seeds_needed": 34, "budget_s": 10_000, "capped": False}
    assert calls[-1] == power["seeds"]
    assert record["variants"]["main"]["seeds"] == power["seeds"]
    # every call's wall time: the new seeds' and each call's set-up
    calls_made = len(calls)
    assert record["variants"]["main"]["wall_s_total"] == pytest.approx(
        10.0 * power["seeds"] + calls_made)
    saved = read_json(project / "results" / "presets" / "toy" / "preset.json")
    assert saved["power"] == power
    # a plain run with another number of seeds drops the power record (it described those)
    record = presets.run_preset("toy", project=project, seeds=3)
    saved = read_json(project / "results" / "presets" / "toy" / "preset.json")
    assert "power" not in record and "power" not in saved


def test_params_only_writes_each_variant_as_a_project_the_flow_can_run(tmp_path, capsys):
    from dpclip.pipeline.params import load_params

    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_project_params()))
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "tiny.yaml").write_text(yaml.safe_dump({
        "description": "d", "source": "s", "deviations": ["digits"],
        "params": {"train": {"methods": ["dp_sgd"]}, "attack": {"references": 0}},
        "variants": {"C1": {"train": {"clip_norm": 1.0}}, "C2": {"train": {"clip_norm": 2.0}}}}))
    assert main(["--root", str(tmp_path), "preset", "tiny", "--params-only", "--seeds", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    out = tmp_path / "results" / "presets" / "tiny"
    assert lines == [f"python -m flows.pipeline --params {out / v}/params.yaml --root {out / v} "
                     f"--workers N   # or --dask-address tcp://HOST:8786" for v in ("C1", "C2")]
    params = load_params(out / "C2" / "params.yaml")
    assert params.train.clip_norm == 2.0 and params.train.seeds == [0, 1, 2]
    assert not (out / "C2" / "runs").exists()  # nothing ran


def test_a_preset_with_public_init_and_the_sound_sanitize_runs_end_to_end(tmp_path, capsys):
    """The table2 `sound` variant's shape on digits: DP-SGD from the public pre-training beside
    sanitize's frozen public encoder (pre-trained once, not twice), the expected cost stated."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_project_params()))
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "tiny.yaml").write_text(yaml.safe_dump({
        "description": "d", "source": "s", "deviations": ["digits"],
        "params": {"train": {"methods": ["dp_sgd", "sanitize"], "seeds": [0], "epochs": 1,
                             "public_init": True},
                   "methods": {"sanitize": {"epochs": 1, "public_steps": 20}},
                   "attack": {"references": 0}, "audit": {"kinds": []},
                   "evaluate": {"ir_attack": False}, "shadow": {"epochs": 1}}}))
    assert main(["--root", str(tmp_path), "preset", "tiny"]) == 0
    assert "expected training: 2 runs" in capsys.readouterr().out
    runs = tmp_path / "results" / "presets" / "tiny" / "main" / "runs"
    dp = read_json(runs / "dp_sgd-eps8-iid-seed0" / "record.json")
    assert dp["privacy"]["data_use"]["initialisation"].startswith("pre-trained on the public")
    assert dp["training"]["init_public_steps_run"] > 0
    sanitize = read_json(runs / "sanitize-eps8-iid-seed0" / "record.json")["training"]
    assert "init_public_steps_run" not in sanitize  # its own pre-training only
    assert sanitize["head_kept"] in ("public", "private")


def _tuning_project(tmp_path: Path, taker_train: dict, taker_data: dict | None = None) -> Path:
    """A project with a tuning preset ``tuner`` (its tuning.csv written as the report writes
    it) and a preset ``taker`` that takes its values (``tuned_by: tuner``)."""
    data = {"dataset": "mnist", "split": {"target_train": 0.7, "target_holdout": 0.1,
                                          "shadow_train": 0.1, "shadow_holdout": 0.1}}
    head = {"description": "d", "source": "s", "deviations": []}
    (tmp_path / "presets").mkdir(parents=True)
    (tmp_path / "presets" / "tuner.yaml").write_text(yaml.safe_dump(
        {**head, "params": {"data": data}, "variants": {"eps1": {}}}))
    (tmp_path / "presets" / "taker.yaml").write_text(yaml.safe_dump(
        {**head, "tuned_by": "tuner", "params": {"data": taker_data or data},
         "variants": {"eps1": {"train": taker_train}}}))
    reports = tmp_path / "results" / "presets" / "tuner" / "eps1" / "reports"
    reports.mkdir(parents=True)
    (reports / "tuning.csv").write_text(
        "method,target_epsilon,trials,values\n"
        'dp_sgd,1,12,"train.lr = 0.3142, train.clip_norm = 1.5"\n')
    return tmp_path


def test_a_preset_that_takes_tuned_values_keeps_the_tuning_split_and_the_values(tmp_path):
    """A review: tuned values are copied into another preset by hand, and with another data
    section (Fashion-MNIST as public data) the same fractions put all 10,000 tuning records of
    table10_fair_tune among the test records. `dpclip preset` refuses such a preset."""
    from dpclip.tools.presets import run_preset, tuned_values, tuning_problems

    good = _tuning_project(tmp_path / "good", {"lr": 0.3142, "clip_norm": 1.5})
    assert tuned_values("tuner", "eps1", good) == {"train.lr": 0.3142, "train.clip_norm": 1.5}
    assert tuning_problems(load_preset("taker", good / "presets"), good) == []
    wrong = _tuning_project(tmp_path / "wrong", {"lr": 0.5, "clip_norm": 1.5},
                            {"dataset": "mnist", "shadow_dataset": "fashion-mnist"})
    problems = tuning_problems(load_preset("taker", wrong / "presets"), wrong)
    assert len(problems) == 2 and "data section differs" in problems[0]
    assert "variant 'eps1' has train.lr 0.5, not the tuned 0.3142" in problems[1]
    with pytest.raises(DpclipError, match="train.lr 0.5, not the tuned 0.3142"):
        run_preset("taker", project=wrong)
    assert not (wrong / "results" / "presets" / "taker").exists()  # nothing written
    with pytest.raises(DpclipError, match="has no tuning results for variant 'eps9'"):
        tuned_values("tuner", "eps9", good)


def test_every_committed_preset_with_tuned_values_matches_its_tuning():
    for name in available_presets(PROJECT / "presets"):
        preset = load_preset(name, PROJECT / "presets")
        if preset.get("tuned_by"):
            from dpclip.tools.presets import tuning_problems
            assert tuning_problems(preset, PROJECT) == [], name


# presets first run after loglog_topk became the default: table13_readings runs both
# estimators by variant, the others the paper's
SINCE_THE_PAPERS_ESTIMATOR = {"table13_readings", "table10_readings", "table4_readings",
                              "ww_feedback"}


@pytest.mark.parametrize("name", available_presets(PROJECT / "presets"))
def test_every_preset_variant_that_trains_ww_names_its_estimator(name, tmp_path):
    """A preset's results never rest on the estimator's default (issue 60 changed it to the
    paper's loglog_topk): each names one, and a preset with results committed before that
    change names the mle_ks those runs used."""
    preset = load_preset(name, PROJECT / "presets")
    committed = (PROJECT / "results" / "presets" / name / "preset.json").is_file()
    for variant in (preset.get("variants") or {"main": {}}):
        raw = variant_params(preset, variant, PROJECT / "params.yaml", tmp_path)
        if "ww_dp_sgd" not in raw["train"]["methods"]:
            continue
        estimator = ((raw.get("methods") or {}).get("ww_dp_sgd") or {}).get("estimator")
        assert estimator in ("loglog_topk", "mle_ks"), (name, variant)
        if committed and name not in SINCE_THE_PAPERS_ESTIMATOR:
            assert estimator == "mle_ks", (name, variant)
    if name == "table13_readings":
        estimators = {v: variant_params(preset, v, PROJECT / "params.yaml", tmp_path)[
            "methods"]["ww_dp_sgd"]["estimator"] for v in preset["variants"]}
        assert all(e == ("mle_ks" if v.endswith("_mle_ks") else "loglog_topk")
                   for v, e in estimators.items())
        assert {v.removesuffix("_mle_ks") for v in estimators} == {
            "full", "kappa_small", "kappa_large", "probe_head"}
