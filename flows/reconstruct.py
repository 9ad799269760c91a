"""The reconstruct flow: generations -> exact training ids, gated."""

from __future__ import annotations

from prefect import flow

import tasks  # noqa: F401  (offline defaults before Prefect is imported)
from tasks.config import RunConfig
from tasks.reconstruct.stage import TASKS, gate_task
from tasks.run_lock import holds_run_lock
from tasks.stages import run_name
from tasks.target_model.preflight import stage_preflight


@flow(name="reconstruct", flow_run_name=run_name("reconstruct"))
@holds_run_lock
def reconstruct_flow(config: RunConfig, force: bool = False) -> dict:
    """Rebuild every generations shard (force: even those already done), collect quarantine, gate the table."""
    stage_preflight(config.target)
    summary = TASKS.run(config, force)  # plan -> one task per shard -> finalize
    gate_task(config)
    return summary
