"""The merge flow: reconstructed sources -> deduplicated, mixed train/eval shards, gated."""

from __future__ import annotations

from prefect import flow

import tasks  # noqa: F401  (offline defaults before Prefect is imported)
from tasks.config import RunConfig
from tasks.merge.task import gate_merged_task, merge_task
from tasks.run_lock import holds_run_lock
from tasks.stages import run_name
from tasks.target_model.preflight import stage_preflight


@flow(name="merge", flow_run_name=run_name("merge"))
@holds_run_lock
def merge_flow(config: RunConfig, force: bool = False) -> dict:
    """Merge, dedup, mix and split the reconstructed sources (force: even when current), then gate them."""
    stage_preflight(config.target)
    summary = merge_task(config, force)
    checked = gate_merged_task(config)
    return summary | {"gated_rows": checked}
