"""The reconstruct flow: generations -> exact training ids, gated."""

from __future__ import annotations

from prefect import flow
from prefect.artifacts import create_markdown_artifact

import tasks  # noqa: F401  (offline defaults before Prefect is imported)
from tasks.config import RunConfig
from tasks.gates import enforce
from tasks.reconstruct.stage import gate_frame, gate_parameters, plan_shards, reconstruct_shard_task, summarize
from tasks.target.preflight import preflight_task


@flow(name="reconstruct")
def reconstruct_flow(config: RunConfig) -> dict:
    """Rebuild every generations shard, collect quarantine, gate the table."""
    preflight_task(config.target)
    shards = plan_shards(config)
    futures = [reconstruct_shard_task.submit(config, shard) for shard in shards]
    summary = summarize(config, shards, [f.result() for f in futures])
    enforce("reconstructed", gate_frame(config), parameters=gate_parameters(config))
    methods = ", ".join(f"{m}: {n}" for m, n in summary["methods"].items()) or "none"
    create_markdown_artifact(
        key="reconstruct-summary",
        markdown=f"# Reconstruct\n\n{summary['rows']} rows rebuilt ({methods}); {summary['quarantined']} quarantined.\n",
        description="Reconstruct stage summary",
    )
    return summary
