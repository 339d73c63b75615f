"""Prefect front door: orchestration only (ordering, retries, schedules), no stage logic.

Defaults for a local machine, set before Prefect is imported (any value already in the
environment wins): give Prefect's temporary local API time to start on a small machine, send
no telemetry (the machine may be offline), show the ``dpclip`` loggers (progress, the PRIVACY
BUG errors) in the flow run's logs in the UI, and keep Dask's own INFO lines (a local
cluster's start and stop: two thirds of the console, and the benign traceback Dask logs at
INFO when a worker's stream closes under a pending send at shutdown) out of the console; its
warnings and errors still show.
"""

import os

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "dpclip")
os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")  # workers inherit it
