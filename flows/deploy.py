"""Deployments on a process work pool: the pipeline (scheduled from the config) and every stage flow.

`register` creates the pool if it is missing and registers the deployments on it; a worker for the pool
(`draftsmith worker`, or `prefect worker start --pool NAME`) runs their flow runs from the project root.
Stopping a worker pauses nothing: scheduled runs wait (Late) until a worker serves the pool again. Each
deployment runs one flow run at a time (concurrency limit 1), so a schedule never overlaps a running
pipeline of the same config; the run directory's lock guards runs started any other way.
"""

from __future__ import annotations

from flows.pipeline import eagle3_pipeline
from tasks.config import OrchestrationConfig, RunConfig
from tasks.prefect_env import PROJECT_ROOT
from tasks.stages import STAGE_NAMES, stage, stage_flow


def entrypoint(flow_ref: str) -> str:
    """ "flows.generate:generate_flow" -> "flows/generate.py:generate_flow" (relative to the project root)."""
    module, attribute = flow_ref.split(":")
    return f"{module.replace('.', '/')}.py:{attribute}"


def run_form(deployment):
    """Keep the deployment's parameters to what a run reads: the config and `force` (stages to rerun though up to
    date: a choice in the form, `--param force='["train"]'` on `prefect deployment run`), no deploy-time settings
    (schedule, time zone, work pool)."""
    schema = deployment._parameter_openapi_schema
    for key in OrchestrationConfig.DEPLOY_ONLY:
        schema.definitions["OrchestrationConfig"]["properties"].pop(key)
    return deployment


def build_deployments(config: RunConfig) -> list:
    """The pipeline deployment (with the config's cron schedule) plus one unscheduled deployment per stage."""
    from prefect.client.schemas.schedules import CronSchedule

    orchestration = config.orchestration
    run_config = config.model_dump(mode="json", exclude={"orchestration": set(OrchestrationConfig.DEPLOY_ONLY)})
    common = {
        "parameters": {"config": run_config},
        "work_pool_name": orchestration.work_pool,
        "job_variables": {"working_dir": str(PROJECT_ROOT)},
        "concurrency_limit": 1,
    }
    cron = orchestration.schedule_cron
    schedule = CronSchedule(cron=cron, timezone=orchestration.schedule_timezone) if cron else None
    pipeline = eagle3_pipeline.to_deployment(
        name=config.name,
        schedules=[schedule] if schedule else None,
        tags=["draftsmith", "pipeline", config.name],
        description=f"The whole chain for run {config.name!r}"
        + (f", on schedule {cron!r} ({orchestration.schedule_timezone})" if cron else ""),
        **common,
    )
    pipeline.entrypoint = entrypoint("flows.pipeline:eagle3_pipeline")
    deployments = [run_form(pipeline)]
    for name in STAGE_NAMES:
        deployment = stage_flow(name).to_deployment(
            name=f"{config.name}-{name}",
            tags=["draftsmith", name, config.name],
            description=f"Stage {name} alone for run {config.name!r}",
            **common,
        )
        deployment.entrypoint = entrypoint(stage(name).flow)
        deployments.append(run_form(deployment))
    return deployments


def ensure_work_pool(name: str) -> bool:
    """Create the process work pool unless it exists; True when it was created."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists
    from prefect.workers.process import ProcessWorker

    template = ProcessWorker.get_default_base_job_template()
    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name=name, type="process", base_job_template=template))
        except ObjectAlreadyExists:
            return False
    return True


def register(config: RunConfig) -> list[tuple[str, str]]:
    """Create the work pool if needed and register (or update) the deployments; (flow/deployment name, id) each."""
    ensure_work_pool(config.orchestration.work_pool)
    registered = []
    for deployment in build_deployments(config):
        registered.append((f"{deployment.flow_name}/{deployment.name}", str(deployment.apply())))
    return registered


def run_worker(pool: str) -> None:
    """Run a process worker for `pool` until stopped (Ctrl-C or SIGTERM)."""
    import anyio
    from prefect.workers.process import ProcessWorker

    async def work() -> None:
        async with ProcessWorker(work_pool_name=pool) as worker:
            await worker.start()

    anyio.run(work)
