"""eagle3_pipeline: every stage as a subflow, gated, skipping what is already up to date."""

from __future__ import annotations

import time

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.logging import get_run_logger

from tasks.config import RunConfig
from tasks.run_report import run_report_markdown
from tasks.runners import build_task_runner
from tasks.stage_record import current_summary, save_record
from tasks.target.preflight import preflight_task

STAGE_ORDER = ("generate", "reconstruct", "validate", "merge", "extract", "train", "evaluate")


def stage_flows() -> dict:
    """Stage name -> its flow (imported here so that each stage flow stays importable alone)."""
    from flows.evaluate import evaluate_flow
    from flows.extract import extract_flow
    from flows.generate import generate_flow
    from flows.merge import merge_flow
    from flows.reconstruct import reconstruct_flow
    from flows.train import train_flow
    from flows.validate import validate_flow

    return {
        "generate": generate_flow,
        "reconstruct": reconstruct_flow,
        "validate": validate_flow,
        "merge": merge_flow,
        "extract": extract_flow,
        "train": train_flow,
        "evaluate": evaluate_flow,
    }


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
        results[stage] = run_stage(stage, config)
    create_markdown_artifact(
        key="run-report", markdown=run_report_markdown(config, results), description=f"Run {config.name}"
    )
    return results
