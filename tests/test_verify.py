"""`dpclip verify`: a fresh run's summaries against a commit's, per metric and tolerance."""

from __future__ import annotations

import json
import subprocess

import pytest

from dpclip.errors import DpclipError
from dpclip.layout import Layout
from dpclip.reporting.verify import check_run, verify, verify_text

SUMMARY = {"epsilon": 7.998399784936951, "accuracy": 0.9171, "ece": 0.1342,
           "attack_auc": 0.5092}


def test_each_metric_is_judged_by_its_own_tolerance():
    assert check_run("r", SUMMARY, dict(SUMMARY)).status == "identical"
    near = {**SUMMARY, "accuracy": 0.9171 + 0.004, "attack_auc": 0.5092 - 0.009}
    check = check_run("r", SUMMARY, near)
    assert check.status == "within tolerance" and set(check.differences) == {"accuracy",
                                                                            "attack_auc"}
    # the measured cross-kernel swing of sanitize: 0.917 -> 0.901 is beyond 0.005
    far = check_run("r", SUMMARY, {**SUMMARY, "accuracy": 0.9006})
    assert far.status == "differs" and far.beyond == ["accuracy"]
    # epsilon is a function of the plan: a change in its 8th digit is a difference
    eps = check_run("r", SUMMARY, {**SUMMARY, "epsilon": 7.9984}).beyond
    assert eps == ["epsilon"]
    assert check_run("r", SUMMARY, {**SUMMARY, "epsilon": 7.998399784936952}).status == \
        "within tolerance"
    assert check_run("r", None, SUMMARY).status == "missing"
    # a number that turns NaN (or absent) is beyond any tolerance; NaN on both sides is equal
    gone = check_run("r", SUMMARY, {**SUMMARY, "accuracy": float("nan")})
    assert gone.status == "differs" and gone.beyond == ["accuracy"]
    assert check_run("r", {**SUMMARY, "ece": float("nan")},
                     {**SUMMARY, "ece": float("nan")}).status == "identical"


def test_accuracy_may_move_by_one_holdout_record_and_the_report_counts_them(tmp_path):
    """On 181 holdout records one record is 0.0055, above the flat 0.005: one record the other
    way is within tolerance, three are not, and the report says how many records it is."""
    one, three = 0.9171 - 1 / 181, 0.9171 - 3 / 181
    assert check_run("r", SUMMARY, {**SUMMARY, "accuracy": one}).status == "differs"
    assert check_run("r", SUMMARY, {**SUMMARY, "accuracy": one}, holdout=181).status == \
        "within tolerance"
    far = check_run("r", SUMMARY, {**SUMMARY, "accuracy": three}, holdout=181)
    assert far.beyond == ["accuracy"]
    layout = Layout(tmp_path)
    layout.prepared_meta.parent.mkdir(parents=True)
    layout.prepared_meta.write_text(json.dumps({"sizes": {"target_holdout": 181}}))
    text = verify_text([far], "HEAD", layout)
    assert "(beyond 0.00552; 3 of 181 holdout records)" in text


def _git(root, *args):
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
                        "PATH": "/usr/bin:/bin"})


def test_the_workspace_against_a_commit(tmp_path):
    layout = Layout(tmp_path)
    _git(tmp_path, "init", "-q")
    layout.summary("a").parent.mkdir()
    for run in ("a", "b"):
        layout.summary(run).write_text(json.dumps(SUMMARY))
    _git(tmp_path, "add", "summary")
    _git(tmp_path, "commit", "-q", "-m", "results")
    layout.summary("b").write_text(json.dumps({**SUMMARY, "accuracy": 0.95}))
    checks = verify(["a", "b", "c"], layout)
    assert [c.status for c in checks] == ["identical", "differs", "missing"]
    text = verify_text(checks, "HEAD", layout)
    assert "accuracy: 0.9171 -> 0.95 (beyond 0.005)" in text
    assert text.splitlines()[-1] == "1 identical, 1 differs, 1 missing."
    with pytest.raises(DpclipError, match="--against 'nope' is not a revision"):
        verify(["a"], layout, "nope")


def test_a_summary_of_other_data_differs_as_a_whole():
    """A summary filed under another data identity (dpclip.summaries) is not compared number
    by number: equal numbers of two datasets are no reproduction."""
    check = check_run("r", {"digits-1a2b3c4d": SUMMARY}, {"csv-heart-0badcafe": SUMMARY})
    assert check.status == "differs" and check.beyond == ["data"]
    assert check_run("r", {"digits-1a2b3c4d": SUMMARY},
                     {"digits-1a2b3c4d": dict(SUMMARY)}).status == "identical"
