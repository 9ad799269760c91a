"""Generate flow: prompts -> the target's replies (journaled), gated before reconstruct reads them."""

from __future__ import annotations

from prefect import flow, get_run_logger

import tasks  # noqa: F401  (offline defaults before Prefect starts)
from tasks.config import RunConfig
from tasks.generate.gate import gate_generations_task
from tasks.generate.stage import generate_task
from tasks.run_lock import holds_run_lock
from tasks.stages import run_name
from tasks.target_model.preflight import stage_preflight


@flow(name="generate", flow_run_name=run_name("generate"))
@holds_run_lock
def generate_flow(config: RunConfig, force: bool = False) -> dict:
    """Generate replies for every configured prompt source (force: retry permanent failures too), gate the table."""
    stage_preflight(config.target)
    summary = generate_task(config, force)
    if summary["stopped"]:
        get_run_logger().warning("generation stopped early (%s); rerun to finish", summary["stopped"])
    gate_generations_task(config, summary["error_rate"])
    return summary
