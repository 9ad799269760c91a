"""Offline Prefect defaults, applied before Prefect is first imported."""

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent

# Each default is applied only when the user has not set the variable.
OFFLINE_DEFAULTS = {
    # A project-local home keeps the SQLite database and logs beside the runs.
    "PREFECT_HOME": str(PROJECT_ROOT / ".prefect"),
    # Telemetry needs the network and logs "database is locked" from temporary servers.
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    # The temporary API server can take >20 s to start on a busy 2-core machine.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    # Flow-run logs should not try to reach Prefect Cloud.
    "PREFECT_CLOUD_ENABLE_ORCHESTRATION_TELEMETRY": "false",
    # The stages' own log lines (progress, what a stage waits on) go to the run's log in the UI too.
    "PREFECT_LOGGING_EXTRA_LOGGERS": "tasks",
    # ... and stay on the console when the same code runs outside a flow (benchmarks, direct calls).
    "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "GX_ANALYTICS_ENABLED": "false",
}


def configure_prefect_env() -> None:
    """Set offline defaults for Prefect, Hugging Face and Great Expectations."""
    for key, value in OFFLINE_DEFAULTS.items():
        os.environ.setdefault(key, value)
