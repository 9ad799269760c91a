"""The validate flow: how far the rebuilt ids can be trusted, per source, gated."""

from __future__ import annotations

from prefect import flow

import tasks  # noqa: F401  (offline defaults before Prefect is imported)
from tasks.config import RunConfig
from tasks.target.preflight import stage_preflight
from tasks.validate.stage import finalize_task, gate_task, plan_parts, validate_part_task


@flow(name="validate")
def validate_flow(config: RunConfig) -> dict:
    """Check and simulate every reconstructed part, publish rates and examples, gate the rates."""
    stage_preflight(config.target)
    parts = plan_parts(config)
    for future in [validate_part_task.submit(config, part) for part in parts]:
        future.result()
    summary = finalize_task(config, parts)
    gate_task(config)
    return summary
