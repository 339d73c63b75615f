"""A run's summary (``summary/<run>.json``): the scalars git tracks, which ``dvc metrics diff``
and ``dvc exp show`` compare, held under the identity of the data the run was trained and
evaluated on (``{"digits-1a2b3c4d": {"accuracy": ...}}``), so that DVC never puts the numbers
of two datasets in one row: their keys differ."""

from __future__ import annotations


def filed(dataset_id: str, scalars: dict) -> dict:
    """The summary file's content: ``scalars`` under ``dataset_id``."""
    return {dataset_id: scalars}


def unfiled(summary: dict) -> tuple[str | None, dict]:
    """(dataset identity, scalars) of a summary file's content; a summary written before the
    identity was filed (its values are numbers) has none."""
    if len(summary) == 1:
        ((dataset_id, scalars),) = summary.items()
        if isinstance(scalars, dict):
            return dataset_id, scalars
    return None, summary
