"""eagle3_pipeline: every stage as a subflow, gated, skipping what is already up to date."""

from __future__ import annotations

import time

from prefect import flow, tags
from prefect.artifacts import create_markdown_artifact
from prefect.logging import get_run_logger

from tasks.config import RunConfig
from tasks.draft.states import HOW, plan_hidden_states
from tasks.run_lock import holds_run_lock
from tasks.run_report import NOT_NEEDED, UP_TO_DATE, run_artifacts, run_report_markdown, summary_line
from tasks.runners import pipeline_runners
from tasks.stage_record import current_summary, save_record
from tasks.stages import BY_NAME, STAGE_NAMES, StageName, run_name, stage_flow
from tasks.target_model.checkpoint import require_in_process_runnable
from tasks.target_model.preflight import preflight_task


def call_stage_flow(subflow, config: RunConfig, force: bool) -> dict:
    """Run a stage flow; `force` reaches the flows that can skip work (evaluate always decodes afresh)."""
    if force and "force" in subflow.parameters.properties:
        return subflow(config, force=True)
    return subflow(config)


def run_stage(stage: str, config: RunConfig, force: bool, runner) -> dict:
    """Run one stage as a subflow, on `runner(sharded)`'s task runner, unless its record says it is up to date (or it
    is forced), or it is extract and training reads its states elsewhere (`train.hidden_states`)."""
    if stage == "extract":
        plan = plan_hidden_states(config)
        get_run_logger().info(plan.line())
        if not plan.extracts:
            get_run_logger().info("stage extract is not needed: train reads its hidden states %s", HOW[plan.mode])
            return {NOT_NEEDED: True, "hidden_states": plan.mode, "offline_bytes": plan.offline_bytes}
    summary = None if force else current_summary(config, stage)
    if summary is not None:
        get_run_logger().info("stage %s is up to date (same config and inputs): skipped", stage)
        return summary | {UP_TO_DATE: True}
    started = time.time()
    subflow = stage_flow(stage).with_options(task_runner=runner(BY_NAME[stage].sharded))
    with tags(config.name, stage):
        summary = call_stage_flow(subflow, config, force)
    save_record(config, stage, summary, started)
    return summary


@flow(name="eagle3_pipeline", flow_run_name=run_name("pipeline"), log_prints=True)
@holds_run_lock
def eagle3_pipeline(config: RunConfig, force: list[StageName] | None = None) -> dict:
    """Preflight, then generate -> reconstruct -> validate -> merge -> extract -> train -> evaluate.

    Args:
        config: Everything the run reads.
        force: Stages to rerun even when up to date (a reply already bought is never asked for again).
    """
    results = {"preflight": preflight_task(config.target)}
    require_in_process_runnable(config, STAGE_NAMES)
    with pipeline_runners(config.orchestration) as runner:
        for stage in STAGE_NAMES:
            results[stage] = run_stage(stage, config, stage in (force or []), runner)
    from prefect.runtime import flow_run

    report = run_report_markdown(config, results, run_artifacts(flow_run.id))
    create_markdown_artifact(key="run-report", markdown=report, description=f"Run {config.name}")
    get_run_logger().info(summary_line(config, results, flow_run.name))
    return results
