"""The reconstruct flow: generations -> exact training ids, gated."""

from __future__ import annotations

from prefect import flow

import tasks  # noqa: F401  (offline defaults before Prefect is imported)
from tasks.config import RunConfig
from tasks.reconstruct.stage import finalize_task, gate_task, plan_shards, reconstruct_shard_task
from tasks.target.preflight import stage_preflight


@flow(name="reconstruct")
def reconstruct_flow(config: RunConfig) -> dict:
    """Rebuild every generations shard, collect quarantine, gate the table."""
    stage_preflight(config.target)
    shards = plan_shards(config)
    futures = [reconstruct_shard_task.submit(config, shard) for shard in shards]
    summary = finalize_task(config, shards, [f.result() for f in futures])
    gate_task(config)
    return summary
