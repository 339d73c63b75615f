"""Prefect front door: orchestration only (ordering, retries, schedules), no stage logic.

Defaults for a local machine, set before Prefect is imported (any value already in the
environment wins): give Prefect's temporary local API time to start on a small machine, send
no telemetry (the machine may be offline), and show the ``dpclip`` loggers (progress, the
PRIVACY BUG errors) in the flow run's logs in the UI.
"""

import os

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "dpclip")
