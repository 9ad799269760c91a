"""Evaluate flow: greedy chain speculative decoding on held-out prompts, gated on acceptance length."""

from prefect import flow

from tasks.config import RunConfig
from tasks.evaluate.stage import evaluate_task, gate_eval_task, stage_summary
from tasks.run_lock import holds_run_lock
from tasks.stages import run_name
from tasks.target_model.preflight import stage_preflight


@flow(name="evaluate", flow_run_name=run_name("evaluate"), log_prints=True)
@holds_run_lock
def evaluate_flow(config: RunConfig) -> dict:
    stage_preflight(config.target)
    summary = evaluate_task(config)
    gate_eval_task(config)
    return stage_summary(summary)
