"""The validate flow: how far the rebuilt ids can be trusted, per source, gated."""

from __future__ import annotations

from prefect import flow

import tasks  # noqa: F401  (offline defaults before Prefect is imported)
from tasks.config import RunConfig
from tasks.run_lock import holds_run_lock
from tasks.stages import run_name
from tasks.target_model.preflight import stage_preflight
from tasks.validate.stage import TASKS, gate_task


@flow(name="validate", flow_run_name=run_name("validate"))
@holds_run_lock
def validate_flow(config: RunConfig, force: bool = False) -> dict:
    """Check and simulate every reconstructed part (force: even those already done), report, gate the rates."""
    stage_preflight(config.target)
    summary = TASKS.run(config, force)  # plan -> one task per reconstructed part -> finalize
    gate_task(config)
    return summary
