"""Deployments: the pipeline (scheduled from the config) and every stage flow, served by one process."""

from __future__ import annotations

from flows.pipeline import eagle3_pipeline
from tasks.config import RunConfig
from tasks.stages import STAGE_NAMES, stage_flow


def build_deployments(config: RunConfig) -> list:
    """The pipeline deployment (with the config's cron schedule) plus one unscheduled deployment per stage."""
    parameters = {"config": config.model_dump(mode="json")}
    cron = config.orchestration.schedule_cron
    deployments = [
        eagle3_pipeline.to_deployment(
            name=config.name,
            cron=cron,
            parameters=parameters,
            tags=["draftsmith", "pipeline"],
            description=f"The whole chain for run {config.name!r}" + (f", on schedule {cron!r}" if cron else ""),
        )
    ]
    for stage in STAGE_NAMES:
        deployments.append(
            stage_flow(stage).to_deployment(
                name=f"{config.name}-{stage}",
                parameters=parameters,
                tags=["draftsmith", "stage"],
                description=f"Stage {stage} alone for run {config.name!r}",
            )
        )
    return deployments


def register(config: RunConfig) -> list[str]:
    """Register (or update) the deployments with the Prefect API; returns their ids."""
    return [str(d.apply()) for d in build_deployments(config)]


def serve_deployments(config: RunConfig) -> None:
    """Register the deployments and run their scheduled and UI-triggered runs until stopped."""
    from prefect import serve

    serve(*build_deployments(config))
