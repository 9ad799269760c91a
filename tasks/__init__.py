"""draftsmith stage logic: plain functions first, thin Prefect tasks on top."""

from tasks.prefect_env import configure_prefect_env

configure_prefect_env()

__version__ = "0.1.0"
