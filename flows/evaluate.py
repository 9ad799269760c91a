"""Evaluate flow: greedy chain speculative decoding on held-out prompts, gated on acceptance length."""

from prefect import flow

from tasks.config import RunConfig
from tasks.evaluate.stage import evaluate_task, gate_eval_task
from tasks.target.preflight import preflight_task


@flow(name="evaluate", log_prints=True)
def evaluate_flow(config: RunConfig) -> dict:
    preflight_task(config.target)
    summary = evaluate_task(config)
    gate_eval_task(config)
    return {
        "prompts": summary["prompts"],
        "acceptance_length": summary["acceptance_length"],
        "per_position_acceptance": summary["per_position_acceptance"],
        "identical": summary["identical"],
        "results": summary["results"],
        "histogram": summary["histogram"],
    }
