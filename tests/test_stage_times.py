"""``python -m dpclip.reporting.stage_times``: the per-stage time table of ``make run``."""

from __future__ import annotations

import io
import json

import pytest

from dpclip.reporting.stage_times import main, stage_seconds, summarise


def test_each_stage_lasts_until_the_next_one_starts():
    events = [(1.0, "prepare"), (3.0, "partition@iid"), (7.0, "partition@0.5"),
              (8.5, "report")]
    assert stage_seconds(events, end=10.0) == [
        ("prepare", 2.0), ("partition@iid", 4.0), ("partition@0.5", 1.5), ("report", 1.5)]


def test_matrix_cells_are_summed_per_stage_kind_and_reported_runs_counted():
    rows = summarise([("prepare", 2.0), ("partition@a", 4.0), ("partition@b", 2.0),
                      ("train", 1.0), ("evaluate", 0.5)], total=10.0,
                     runs={"train": 4, "evaluate": 0})
    assert rows == [
        {"stage": "prepare", "runs": 1, "seconds": 2.0, "per_run": 2.0, "share": 0.2},
        {"stage": "partition", "runs": 2, "seconds": 6.0, "per_run": 3.0, "share": 0.6},
        {"stage": "train", "runs": 4, "seconds": 1.0, "per_run": 0.25, "share": 0.1},
        {"stage": "evaluate", "runs": 0, "seconds": 0.5, "per_run": None, "share": 0.05}]


def test_output_passes_through_and_the_table_is_written(tmp_path):
    dvc = ("Running stage 'prepare':\n> dpclip prepare\nRunning stage 'train':\n"
           "[1/3] a-eps8-iid-seed0: up to date\n[2/3] b-eps8-iid-seed0: epsilon=7.9, 1.0 s\n"
           "c:  50%|#####  \r[3/3] c-eps8-iid-seed0: epsilon=inf, 0.5 s\n"
           # runs side by side: a bar on a row of its own moves the cursor back up
           "Running stage 'audit':\n[1/2] a-eps8-iid-seed0: x\n          \x1b[A"
           "[2/2] b-eps8-iid-seed0: y\n"
           "Stage 'shadow' didn't change, skipping\n")
    out = io.StringIO()
    assert main(io.StringIO(dvc), out, record=tmp_path / "times.json") == 0
    assert out.getvalue().startswith(dvc)  # DVC's own output, unchanged
    record = json.loads((tmp_path / "times.json").read_text())
    assert [r["stage"] for r in record["stages"]] == ["dvc start-up", "prepare", "train",
                                                      "audit"]
    assert [r["runs"] for r in record["stages"]] == [1, 1, 2, 2]
    assert sum(r["seconds"] for r in record["stages"]) == pytest.approx(record["total_s"],
                                                                         abs=0.2)
    assert "Where the time went" in out.getvalue()


def test_nothing_run_means_no_table(tmp_path):
    out = io.StringIO()
    assert main(io.StringIO("Data and pipelines are up to date.\n"), out,
                record=tmp_path / "times.json") == 0
    assert out.getvalue() == "Data and pipelines are up to date.\n"
    assert not (tmp_path / "times.json").exists()


def test_the_record_is_outside_every_dvc_output():
    """A file added to a stage's output after DVC recorded it makes the stage stale: the
    next ``dvc repro`` would re-run the report for nothing."""
    import yaml

    from conftest import PROJECT
    from dpclip.reporting.stage_times import RECORD

    stages = yaml.safe_load((PROJECT / "dvc.yaml").read_text())["stages"]
    outputs = [str(next(iter(o)) if isinstance(o, dict) else o).split("$")[0]
               for stage in stages.values()
               for kind in ("outs", "metrics", "plots") for o in stage.get(kind, [])]
    assert outputs and not any(RECORD.as_posix().startswith(out.rstrip("/"))
                               for out in outputs), outputs
