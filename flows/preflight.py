"""Preflight flow: the tokenizer check alone, runnable from the UI."""

from prefect import flow

from tasks.config import RunConfig
from tasks.stages import run_name
from tasks.target_model.preflight import preflight_task


@flow(name="preflight", flow_run_name=run_name("preflight"), log_prints=True)
def preflight_flow(config: RunConfig) -> dict:
    return preflight_task(config.target)
