"""extract flow: plan shards, extract each (finished shards are skipped), index, then gate."""

from __future__ import annotations

from prefect import flow

from tasks.config import RunConfig
from tasks.extract.checks import gate_task
from tasks.extract.stage import extract_shard_task, finalize_task, plan_task
from tasks.target.preflight import stage_preflight


@flow(name="extract")
def extract_flow(config: RunConfig) -> dict:
    """merged/ -> hidden_states/ shards, index.parquet and meta.json, gated by `hidden_states`."""
    stage_preflight(config.target)
    plans = plan_task(config)
    futures = [extract_shard_task.submit(config, plan) for plan in plans]
    markers = [future.result() for future in futures]
    summary = finalize_task(config, plans, markers)
    return summary | {"gate": gate_task(config)}
