"""The validate flow: how far the rebuilt ids can be trusted, per source, gated."""

from __future__ import annotations

from prefect import flow
from prefect.artifacts import create_markdown_artifact

import tasks  # noqa: F401  (offline defaults before Prefect is imported)
from tasks.config import RunConfig
from tasks.gates import enforce
from tasks.target.preflight import preflight_task
from tasks.validate.stage import gate_frame, gate_parameters, plan_parts, summarize, validate_part_task


@flow(name="validate")
def validate_flow(config: RunConfig) -> dict:
    """Check and simulate every reconstructed part, publish rates and examples, gate the rates."""
    preflight_task(config.target)
    parts = plan_parts(config)
    for future in [validate_part_task.submit(config, part) for part in parts]:
        future.result()
    summary = summarize(config, parts)
    create_markdown_artifact(
        key="validation-report", markdown=summary.pop("markdown"), description="Validation rates and examples"
    )
    enforce("validation", gate_frame(config), id_column="source", parameters=gate_parameters(config))
    return summary
