"""draftsmith stage logic: plain functions first, thin Prefect tasks on top."""

import logging

from tasks.prefect_env import configure_prefect_env

configure_prefect_env()
# The stages' own lines (progress, what a stage waits on) at INFO; Prefect adds its handlers to `tasks`.
logging.getLogger("tasks").setLevel(logging.INFO)

__version__ = "0.1.0"
