"""`dpclip compare`: DVC experiments as rows (run x experiment) that fit a terminal. The DVC
side runs for real in tests/test_e2e.py; here the rows of `dvc exp show --json` are written by
hand."""

from __future__ import annotations

import pytest

from dpclip.reporting.compare import (MAX_WIDTH, changed_params, compare_text, comparison_rows,
                                      experiments_from_json, select)
from dpclip.errors import DpclipError


def _summary(accuracy, ece=0.05):
    return {"epsilon": 7.998, "accuracy": accuracy, "ece": ece, "attack_auc": 0.55,
            "attack_tpr_at_low_fpr": 0.02, "audit_epsilon_lower_bound": 1.5}


def _revision(rev, name, epochs, accuracies):
    return {"rev": rev, "name": name, "data": {
        "metrics": {f"summary/{run}.json": {"data": _summary(a)} for run, a in accuracies.items()},
        "params": {"params.yaml": {"data": {"train": {"epochs": epochs, "lr": 0.1}}}}}}


RUNS = {"dp_sgd-eps8-iid-seed0": 0.90, "non_private-eps8-iid-seed0": 0.97}
LONGER = {"dp_sgd-eps8-iid-seed0": 0.93, "non_private-eps8-iid-seed0": 0.97}


def _shown(workspace=RUNS):
    commit = _revision("a" * 40, "main", 2, RUNS)
    commit["experiments"] = [{"name": "epochs3", "revs": [_revision("b" * 40, "epochs3", 3,
                                                                   LONGER)]}]
    return [_revision("workspace", None, 2, workspace), commit]


def test_the_workspace_is_left_out_when_it_holds_the_baseline():
    assert [e.name for e in experiments_from_json(_shown())] == ["main", "epochs3"]
    changed = {**RUNS, "dp_sgd-eps8-iid-seed0": 0.5}
    assert [e.name for e in experiments_from_json(_shown(changed))] == \
        ["workspace", "main", "epochs3"]


def test_rows_pair_each_run_across_experiments_with_the_accuracy_difference():
    experiments = experiments_from_json(_shown())
    rows = comparison_rows(experiments)
    assert [(r["run"], r["experiment"]) for r in rows] == [
        ("dp_sgd-eps8-iid-seed0", "main"), ("dp_sgd-eps8-iid-seed0", "epochs3"),
        ("non_private-eps8-iid-seed0", "main"), ("non_private-eps8-iid-seed0", "epochs3")]
    assert rows[0]["d_accuracy"] is None and rows[1]["d_accuracy"] == pytest.approx(0.03)
    only = comparison_rows(experiments, only_changed=True)
    assert {r["run"] for r in only} == {"dp_sgd-eps8-iid-seed0"}  # non_private is unchanged
    assert changed_params(experiments) == {"train.epochs": [2, 3]}


def test_the_text_fits_120_columns_even_with_long_names():
    shown = _shown()
    long_run = "a_plugin_method_with_a_long_name-eps0.125-0.05-seed12"
    shown[1]["data"]["metrics"][f"summary/{long_run}.json"] = {"data": _summary(0.8)}
    shown[1]["experiments"][0]["name"] = "an-experiment-name-much-longer-than-a-column"
    text = compare_text(experiments_from_json(shown))
    assert max(len(line) for line in text.splitlines()) <= MAX_WIDTH
    assert "main=2, an-experiment-name-much-longer-than-a-column=3" in text
    assert "+0.0300" in text  # dp_sgd's accuracy difference


def test_an_unknown_experiment_is_named_in_the_error():
    with pytest.raises(DpclipError, match="no experiment 'nope'.*main, epochs3"):
        select(experiments_from_json(_shown()), ["nope"])
    assert [e.name for e in select(experiments_from_json(_shown()), ["epochs3", "aaaa"])] == \
        ["epochs3", "main"]


def test_an_epsilon_without_a_guarantee_or_of_another_notion_is_marked():
    """The audit saw the sanitize `paper` run printed "eps 1.00" like dp_sgd's."""
    marked = {"no": {"dp_guarantee": False, "adjacency_add_remove": False},
              "other": {"dp_guarantee": True, "adjacency_add_remove": False},
              "sound": {"dp_guarantee": True, "adjacency_add_remove": True}}
    row = {"rev": "a" * 40, "name": "main", "data": {"metrics": {
        f"summary/{run}.json": {"data": {**_summary(0.9), **flags}}
        for run, flags in marked.items()}, "params": {}}}
    lines = compare_text(experiments_from_json([row])).splitlines()
    shown = {line.split()[0]: line.split()[2] for line in lines
             if line.split() and line.split()[0] in marked}
    assert shown == {"no": "8.00!", "other": "8.00*", "sound": "8.00"}


def test_experiments_on_different_data_are_never_differenced():
    """What a user saw: an experiment on their CSV printed as +0.0629 against the digits
    baseline. Each data set now gets its own table, under a line that says why."""
    shown = _shown()
    csv = shown[1]["experiments"][0]["revs"][0]
    csv["data"]["params"]["params.yaml"]["data"]["data"] = {"dataset": "csv", "path": "bc.csv"}
    for baseline in (shown[0], shown[1]):  # the workspace holds the baseline
        baseline["data"]["params"]["params.yaml"]["data"]["data"] = {"dataset": "digits",
                                                                      "path": None}
    text = compare_text(experiments_from_json(shown))
    assert text.startswith("Not comparable: these experiments ran on 2 different data sets")
    assert "data.dataset, data.path differ" in text
    assert "== data.dataset='digits', data.path=None ==" in text
    assert "== data.dataset='csv', data.path='bc.csv' ==" in text
    assert "+0.03" not in text  # no difference across the two
    same = compare_text(experiments_from_json(_shown()))
    assert "Not comparable" not in same and "+0.0300" in same


def test_results_filed_under_other_data_are_kept_apart_whatever_params_yaml_says():
    """What a user saw: after a failed experiment and the documented restore of params.yaml,
    the workspace's results of one dataset were filed under another. The data identity the
    summaries are filed under (dpclip.summaries) decides, not the parameters; and every TPR
    names its FPR."""
    shown = _shown()
    for row, data in ((shown[0], "csv-penguins-0badcafe"), (shown[1], "digits-1a2b3c4d")):
        row["data"]["metrics"] = {path: {"data": {data: {**entry["data"],
                                                         "attack_low_fpr": 0.028}}}
                                  for path, entry in row["data"]["metrics"].items()}
    shown[0]["data"]["metrics"]["summary/dp_sgd-eps8-iid-seed0.json"]["data"][
        "csv-penguins-0badcafe"]["accuracy"] = 0.985
    experiments = experiments_from_json(shown)
    assert [e.data for e in experiments] == ["csv-penguins-0badcafe", "digits-1a2b3c4d",
                                             None]
    text = compare_text(experiments[:2])  # the same params.yaml, other data
    assert "Not comparable" in text and "their results are filed under different data" in text
    assert "== data csv-penguins-0badcafe ==" in text and "+0.08" not in text
    assert "0.020 @2.8%" in text and "TPR @FPR" in text
