"""The dpclip command on bad input: one message naming the key and the value, exit 2, and no
half-written output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import prepared_project
from dpclip.cli import main
from dpclip.errors import DpclipError
from dpclip.files import atomic_path, write_json


def _files(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("override, key, shown", [
    ({"privacy": {"target_epsilons": [-2]}}, "privacy.target_epsilons", "-2"),
    ({"privacy": {"delta": 1.5}}, "privacy.delta", "1.5"),
    ({"partition": {"alphas": [-0.5]}}, "partition.alphas", "-0.5"),
    ({"data": {"dataset": "svhn"}}, "data.dataset", "'svhn'"),
    ({"train": {"model": "vit"}}, "train.model", "'vit'"),
    ({"train": {"methods": ["dp_sgd", "dp_magic"]}}, "train.methods", "'dp_magic'"),
    ({"train": {"epochs": "ten"}}, "train.epochs", "'ten'"),
])
def test_bad_params_stop_every_stage_before_work(tmp_path, tiny_raw, write_params, capsys,
                                                  override, key, shown):
    params = write_params(tiny_raw(**override))
    before = _files(tmp_path)
    for argv in (["prepare"], ["partition", "--alpha", "iid"],
                 ["train", "--method", "dp_sgd", "--epsilon", "8", "--alpha", "iid",
                  "--seed", "0"], ["report"]):
        code = main(["--params", str(params), "--root", str(tmp_path), *argv])
        err = capsys.readouterr().err
        assert code == 2
        assert key in err and shown in err
    assert _files(tmp_path) == before


def _prepared(tmp_path, tiny_raw, write_params, **override):
    return prepared_project(tmp_path, tiny_raw(**override), write_params)


def test_batch_larger_than_the_data_fails_before_training(tmp_path, tiny_raw, write_params,
                                                           capsys):
    base = _prepared(tmp_path, tiny_raw, write_params, train={"batch_size": 5000})
    code = main([*base, "train", "--method", "dp_sgd", "--epsilon", "8", "--alpha", "iid",
                 "--seed", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "train.batch_size: 5000" in err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "traces").exists()


def test_run_outside_the_configured_matrix_is_refused(tmp_path, tiny_raw, write_params, capsys):
    base = _prepared(tmp_path, tiny_raw, write_params)
    code = main([*base, "train", "--method", "dp_sgd", "--epsilon", "3", "--alpha", "iid",
                 "--seed", "0"])
    assert code == 2 and "privacy.target_epsilons: 3" in capsys.readouterr().err


def test_part_of_a_runs_options_is_refused(tmp_path, tiny_raw, write_params, capsys):
    base = _prepared(tmp_path, tiny_raw, write_params)
    code = main([*base, "train", "--method", "dp_sgd"])
    err = capsys.readouterr().err
    assert code == 2 and "missing --epsilon, --alpha, --seed" in err
    assert not (tmp_path / "runs").exists()


def test_every_run_in_one_process_gives_the_models_of_single_runs(tmp_path, tiny_raw,
                                                                    write_params, capsys):
    """``dpclip train`` without run options trains the configured runs one after another in
    one process (dvc.yaml); each run seeds itself, so its model is the one a run alone gives,
    and a second call finds every run up to date."""
    import json

    batch, alone = tmp_path / "batch", tmp_path / "alone"
    batch.mkdir(), alone.mkdir()
    base = prepared_project(batch, tiny_raw(), write_params)
    assert main([*base, "train"]) == 0
    assert main([*base, "evaluate"]) == 0
    assert main([*base, "train"]) == 0
    out = capsys.readouterr().out
    assert "[2/2] dp_sgd-eps8-iid-seed0: epsilon=" in out
    assert out.count("up to date") == 2  # the second call
    base = prepared_project(alone, tiny_raw(), write_params)
    assert main([*base, "train", "--method", "dp_sgd", "--epsilon", "8", "--alpha", "iid",
                 "--seed", "0"]) == 0

    def weights(root):
        return json.loads((root / "runs" / "dp_sgd-eps8-iid-seed0" / "record.json")
                          .read_text())["weights_sha256"]

    assert weights(batch) == weights(alone)
    model = Path("runs") / "dp_sgd-eps8-iid-seed0" / "model.pt"
    assert (batch / model).read_bytes() == (alone / model).read_bytes()  # DVC sees one model


def test_missing_csv_file_names_data_path(tmp_path, tiny_raw, write_params, capsys):
    params = write_params(tiny_raw(data={"dataset": "csv", "path": str(tmp_path / "x.csv"),
                                         "target": "y"}))
    code = main(["--params", str(params), "--root", str(tmp_path), "prepare"])
    assert code == 2 and "data.path" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()


def test_validate_names_the_file_it_read(tmp_path, tiny_raw, write_params, capsys):
    """It said "params.yaml is valid" of any --params file."""
    params = write_params(tiny_raw(), name="tiny.yaml")
    assert main(["--params", str(params), "validate"]) == 0
    assert capsys.readouterr().out.strip() == f"{params} is valid"


def test_missing_params_file(tmp_path, capsys):
    assert main(["--params", str(tmp_path / "nope.yaml"), "validate"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.json"
    write_json(target, {"ok": 1})
    with pytest.raises(DpclipError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise DpclipError("interrupted")
    assert target.read_text().strip().startswith("{") and _files(tmp_path) == ["out.json"]


def test_the_same_weights_give_the_same_model_file(tmp_path):
    """DVC hashes model files: identical weights must give identical bytes, whatever the file
    is called (torch names the archive's folder after the file)."""
    import torch

    from dpclip.files import write_torch

    weights = {"w": torch.arange(6.0).reshape(2, 3)}
    a = write_torch(tmp_path / "a" / "model.pt", weights)
    b = write_torch(tmp_path / "b" / "other.pt", {"w": torch.arange(6.0).reshape(2, 3)})
    assert a.read_bytes() == b.read_bytes()
    assert torch.equal(torch.load(a, weights_only=True)["w"], weights["w"])
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["model.pt"]  # no temp left


def test_bench_reports_ratios_to_dp_sgd(tmp_path, tiny_raw, write_params, capsys,
                                       monkeypatch):
    base = _prepared(tmp_path, tiny_raw, write_params)
    # the peak memory of each method is measured in a fresh process each (4 here, 16 s; that
    # measurement: test_peak_memory_is_what_the_steps_add_to_a_fresh_process): here a stand-in
    # gives each name its own number, and the table must carry them and their ratios
    measured = {"non_private": 3.0, "opacus_ghost": 12.0, "dp_sgd": 6.0, "ww_dp_sgd": 9.0}
    asked = []

    def peak_memory(params_path, root, name, steps, model, hidden, batch_size):
        asked.append((name, steps, model))
        return measured[name]

    monkeypatch.setattr("dpclip.tools.bench.peak_memory", peak_memory)
    code = main([*base, "bench", "--methods", "dp_sgd", "ww_dp_sgd", "sanitize", "--steps", "2",
                 "--rounds", "2", "--epoch"])
    assert code == 0, capsys.readouterr().err
    import json

    result = json.loads((tmp_path / "reports" / "bench.json").read_text())
    rows = {row["method"]: row for row in result["table"]}
    assert list(rows) == ["non_private", "opacus_ghost", "dp_sgd", "ww_dp_sgd"]  # the anchors
    assert result["not_timed"] == ["sanitize"]  # no per-batch DP step to compare
    assert rows["dp_sgd"]["ratio_to_dp_sgd"] == 1.0 and rows["ww_dp_sgd"]["step_ms_median"] > 0
    assert rows["non_private"]["ratio_to_non_private"] == 1.0
    assert rows["opacus_ghost"]["ratio_to_dp_sgd"] == pytest.approx(
        rows["opacus_ghost"]["step_ms_median"] / rows["dp_sgd"]["step_ms_median"])
    # at least 100 steps each, so that the WW probe (every 50 steps) falls among them
    assert asked == [(name, 100, "mlp") for name in rows]
    assert {name: row["peak_mib"] for name, row in rows.items()} == measured
    assert rows["opacus_ghost"]["memory_ratio_to_dp_sgd"] == 2.0
    assert rows["ww_dp_sgd"]["memory_ratio_to_dp_sgd"] == 1.5
    assert 0 <= result["probes"]["mlp/ww_dp_sgd"]["share"] < 1
    # the probes counted are those of the timed steps only (after the warm-up), and the file
    # says how many steps were timed, which the cost claims read
    probe = result["probes"]["mlp/ww_dp_sgd"]
    assert probe["steps"] >= 200 and probe["share"] == probe["probe_s"] / probe["train_s"]
    assert (tmp_path / "reports" / "bench.md").exists()
    out = capsys.readouterr().out
    assert "## Whole epochs (mlp" in out
    # --epoch: records per second of whole epochs, and the time of one of 60,000 records
    epochs = {row["method"]: row for row in result["epochs"]["mlp"]}
    assert set(epochs) == {"non_private", "opacus_ghost", "dp_sgd"}
    n = len(np.load(tmp_path / "data" / "prepared" / "target_train.npz")["y"])
    for row in epochs.values():
        assert row["records_per_s"] == pytest.approx(n / row["epoch_s"])
        assert row["epoch_s_60000"] == pytest.approx(60000 / row["records_per_s"])
    assert epochs["non_private"]["ratio_to_non_private"] == 1.0


def test_peak_memory_is_what_the_steps_add_to_a_fresh_process(tmp_path, tiny_raw,
                                                               write_params):
    """``dpclip bench``'s memory column: the resident set's growth over its level before the
    timed steps. 64 MiB written meanwhile show as 64 MiB (the sampler reads the peak, not the
    end), and one method's steps in a fresh process give a growth of a few MiB at most on
    the tiny MLP."""
    import time

    from dpclip.tools.bench import _RssPeak, peak_memory

    with _RssPeak() as peak:
        held = np.ones(64 * 2 ** 20 // 8)  # written, so resident
        deadline = time.monotonic() + 5  # the sampler thread may wait for a core
        while peak._peak - peak._base < 63 * 2 ** 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        del held  # returned to the system (above glibc's mmap threshold)
    assert 63 <= peak.growth_mib <= 70
    base = _prepared(tmp_path, tiny_raw, write_params)
    assert peak_memory(base[1], str(tmp_path), "dp_sgd", 1, "mlp", [32], 64) < 64


def test_a_prefect_run_forms_changes_are_validated_like_params_yaml(tmp_path, tiny_raw,
                                                                     write_params):
    """The deployment's run form (methods, target epsilons, seeds, dataset) goes through the
    same schema; an integral epsilon keeps YAML's spelling, so run names match DVC's."""
    from dpclip.pipeline.params import load_params
    from dpclip.run_keys import configured_runs
    from flows.pipeline import overrides

    path = write_params(tiny_raw())
    params = load_params(path, overrides(methods=["dp_sgd"], target_epsilons=[8.0, 0.5],
                                         seeds=[3]))
    assert [k.name for k in configured_runs(params)] == ["dp_sgd-eps8-iid-seed3",
                                                          "dp_sgd-eps0.5-iid-seed3"]
    assert params.train.epochs == 2  # the rest of the file is kept
    with pytest.raises(DpclipError, match="train.methods: 'dp_magic'"):
        load_params(path, overrides(methods=["dp_magic"]))
    with pytest.raises(DpclipError, match="data.dataset"):
        load_params(path, overrides(dataset="svhn"))


def test_a_local_dask_cluster_fills_the_cpus_without_oversubscribing(monkeypatch):
    from flows import pipeline

    monkeypatch.setattr(pipeline.os, "cpu_count", lambda: 8)
    assert pipeline.local_workers(None) == 1  # each run uses every CPU
    assert pipeline.local_workers(1) == 8 and pipeline.local_workers(3) == 2
    assert pipeline.local_workers(16) == 1


def test_the_thread_count_is_set_from_the_parameters():
    """Results depend on torch's thread count (dpclip.threads): a Dask worker starts with one,
    the stages set the configured count."""
    import torch

    from dpclip.threads import use_threads

    before = torch.get_num_threads()
    try:
        assert use_threads(1) == 1 and torch.get_num_threads() == 1
        assert use_threads(None) >= 1 and torch.get_num_threads() == use_threads(None)
    finally:
        torch.set_num_threads(before)


def test_a_stage_failing_under_dvc_exp_run_says_how_to_put_params_yaml_back(
        tmp_path, tiny_raw, write_params, monkeypatch, capsys):
    """What a user met: `dvc exp run -S data.path=missing.csv` failed and left params.yaml
    rewritten, with nothing saying so."""
    params = write_params(tiny_raw(data={"dataset": "csv", "path": "missing.csv",
                                         "target": "y"}))
    args = ["--params", str(params), "--root", str(tmp_path), "check"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    assert main(args) == 2
    assert "git checkout -- params.yaml" not in capsys.readouterr().err
    monkeypatch.setenv("DVC_EXP_NAME", "penguins")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "data.path: 'missing.csv'" in err and "git checkout -- params.yaml" in err
    temporary = tmp_path / ".dvc" / "tmp" / "exps" / "run"  # a --temp experiment's copy
    temporary.mkdir(parents=True)
    monkeypatch.chdir(temporary)
    assert main(args) == 2
    assert "git checkout -- params.yaml" not in capsys.readouterr().err
