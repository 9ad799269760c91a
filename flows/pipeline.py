"""eagle3_pipeline: every stage as a subflow, gated, skipping what is already up to date."""

from __future__ import annotations

import time

from prefect import flow
from prefect.logging import get_run_logger

from tasks.config import RunConfig
from tasks.runners import build_task_runner
from tasks.stage_record import current_summary, save_record
from tasks.target.preflight import preflight_task

STAGE_ORDER = ("generate", "reconstruct", "validate", "merge", "extract", "train", "evaluate")


def stage_flows() -> dict:
    """Stage name -> its flow (imported here so that each stage flow stays importable alone)."""
    from flows.preflight import preflight_flow

    return {"preflight": preflight_flow}


def run_stage(stage: str, config: RunConfig) -> dict:
    """Run one stage as a subflow unless its record says it is up to date."""
    logger = get_run_logger()
    summary = current_summary(config, stage)
    if summary is not None:
        logger.info("stage %s is up to date (same config and inputs): skipped", stage)
        return summary | {"skipped": True}
    started = time.time()
    stage_flow = stage_flows()[stage].with_options(task_runner=build_task_runner(config.orchestration))
    summary = stage_flow(config)
    save_record(config, stage, summary, started)
    return summary


@flow(name="eagle3_pipeline", log_prints=True)
def eagle3_pipeline(config: RunConfig) -> dict:
    """Preflight, then generate -> reconstruct -> validate -> merge -> extract -> train -> evaluate."""
    results = {"preflight": preflight_task(config.target)}
    for stage in STAGE_ORDER:
        if stage in stage_flows():
            results[stage] = run_stage(stage, config)
    return results
