"""Imported ahead of time by the processes that log MLflow children (the fork server of the
report's workers, :data:`dpclip.pipeline.spec.MLFLOW_WORKER_IMPORTS`): MLflow's map of
installed packages is built there once (:func:`dpclip.tracking.build_package_map`), and every
worker inherits it instead of building its own for its first child (1.2-1.5 s here)."""

from __future__ import annotations

from dpclip.tracking import build_package_map

build_package_map()
