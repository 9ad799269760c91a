"""The extract flow: merged rows -> the target's hidden states, sharded, indexed and gated."""

from __future__ import annotations

from prefect import flow

import tasks  # noqa: F401  (offline defaults before Prefect is imported)
from tasks.config import RunConfig
from tasks.extract.checks import gate_task
from tasks.extract.stage import TASKS
from tasks.run_lock import holds_run_lock
from tasks.stages import run_name
from tasks.target_model.preflight import stage_preflight


@flow(name="extract", flow_run_name=run_name("extract"))
@holds_run_lock
def extract_flow(config: RunConfig, force: bool = False) -> dict:
    """merged/ -> hidden_states/ shards (force: even those already done), index.parquet and meta.json, gated."""
    stage_preflight(config.target)
    summary = TASKS.run(config, force)  # plan -> one task per shard -> finalize
    return summary | {"gate": gate_task(config)}
