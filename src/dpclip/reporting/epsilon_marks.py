"""How an epsilon is shown beside what it guarantees: every table, file and chart that shows an
epsilon marks it with :func:`epsilon_mark` (the one rule, so that they cannot disagree).

* ``!``: the run makes no DP guarantee (``privacy.dp_guarantee: false``: a literal-paper rule
  whose accounting does not hold); its epsilon is the number the paper's accounting gives, not a
  bound on anything.
* ``*``: a guarantee under another neighbouring notion than add/remove one record
  (``privacy.adjacency``, e.g. ``replace_one_features``): not the same quantity as DP-SGD's.
* nothing: a guarantee under add/remove adjacency. Unknown (older summaries without the keys):
  nothing either.
"""

from __future__ import annotations

NO_GUARANTEE, OTHER_ADJACENCY = "!", "*"
LEGEND = (f"{NO_GUARANTEE}: no DP guarantee (the epsilon is not a bound); {OTHER_ADJACENCY}: "
          f"another neighbouring notion than add/remove one record")


def epsilon_mark(dp_guarantee, adjacency) -> str:
    """"!", "*" or "" for a run's ``privacy.dp_guarantee`` and ``privacy.adjacency``."""
    if dp_guarantee is False or dp_guarantee == 0:
        return NO_GUARANTEE
    if adjacency not in (None, "add_remove"):
        return OTHER_ADJACENCY
    return ""


def series_label(name: str, dp_guarantee, adjacency) -> str:
    """A chart's series name with what its epsilon means in words (a legend has room for
    them): "sanitize iid (no DP guarantee)", "sanitize iid (replace_one_features adjacency)"."""
    mark = epsilon_mark(dp_guarantee, adjacency)
    if mark == NO_GUARANTEE:
        return f"{name} (no DP guarantee)"
    if mark == OTHER_ADJACENCY:
        return f"{name} ({adjacency} adjacency)"
    return name


def summary_adjacency(summary: dict) -> str | None:
    """The adjacency a run summary (``summary/<run>.json``) states: "add_remove", "another"
    (the metrics file names it), or None for an older summary without the key."""
    flag = summary.get("adjacency_add_remove")
    return None if flag is None else "add_remove" if flag else "another"
