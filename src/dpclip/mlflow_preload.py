"""Imported ahead of time by the processes that log MLflow children (the fork server of the
report's workers, :data:`dpclip.pipeline.spec.MLFLOW_WORKER_IMPORTS`): it builds MLflow's map
of installed packages there once, and every worker inherits it.

When MLflow logs a model, it checks the model's pip requirements against the installed
packages and warns on a mismatch. The first check in a process builds a map from importable
modules to installed distributions, from every distribution's file list
(``importlib_metadata.packages_distributions()``). That took 1.2-1.5 s of a worker's first child
here, against 0.3 s for each later child. MLflow keeps the map for the life of the process, in
a private module (``mlflow.utils.requirements_utils``). Should that change, this does nothing,
and each worker builds its own map as before (tests/test_tracking.py notices)."""

from __future__ import annotations


def build_package_map() -> bool:
    """Have MLflow build its module-to-distribution map in this process; whether it holds one
    now."""
    try:
        from mlflow.utils import requirements_utils

        requirements_utils._init_modules_to_packages_map()
        return requirements_utils._MODULES_TO_PACKAGES is not None
    except (ImportError, AttributeError):
        return False


build_package_map()
