"""Deployments on a process work pool: the pipeline (scheduled from the config) and every stage flow.

`register` creates the pool if it is missing and registers the deployments on it; a worker for the pool
(`draftsmith worker`, or `prefect worker start --pool NAME`) runs their flow runs from the project root.
Stopping a worker pauses nothing: scheduled runs wait (Late) until a worker serves the pool again. Each
deployment runs one flow run at a time (concurrency limit 1), so a schedule never overlaps a running
pipeline of the same config; the run directory's lock guards runs started any other way. `serve_ui` is the server
they all talk to (`draftsmith ui`), over the same Prefect home every command records into.
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
    (schedule, time zone, work pool). `force` comes first: the form lists properties by `position`, and the config
    below it unfolds into every key of every section."""
    schema = deployment._parameter_openapi_schema
    for key in OrchestrationConfig.DEPLOY_ONLY:
        schema.definitions["OrchestrationConfig"]["properties"].pop(key)
    order = sorted(schema.properties, key=lambda name: name != "force")  # stable: the others keep their order
    schema.properties = {name: schema.properties[name] for name in order}
    for position, name in enumerate(order):
        schema.properties[name]["position"] = position
    return deployment


def pipeline_description(config: RunConfig) -> str:
    """What the pipeline deployment runs and when, naming the schedule's time zone: the UI shows a cron schedule as
    "At 03:00 AM every day" and names the zone only in a tooltip."""
    text = f"The whole chain for run {config.name!r}: stages whose config and inputs are unchanged are skipped."
    cron, zone = config.orchestration.schedule_cron, config.orchestration.schedule_timezone
    if cron:
        text += f" Schedule: cron `{cron}` in time zone {zone} (the times shown for it are {zone} times)."
    return text


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
        description=pipeline_description(config),
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


def serve_ui(port: int) -> None:
    """Serve the Prefect API and UI on 127.0.0.1:`port` over PREFECT_HOME's database, with the services that start
    scheduled runs, until Ctrl-C or SIGTERM."""
    import uvicorn
    from prefect.server.api.server import create_app
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_API_HOST,
        PREFECT_SERVER_API_PORT,
        PREFECT_UI_API_URL,
        temporary_settings,
    )

    # The UI asks this server, not whatever PREFECT_API_URL the shell points at (which may name another one).
    served = {
        PREFECT_SERVER_API_HOST: "127.0.0.1",
        PREFECT_SERVER_API_PORT: port,
        PREFECT_UI_API_URL: f"http://127.0.0.1:{port}/api",
    }
    with temporary_settings(served, restore_defaults={PREFECT_API_URL}):
        uvicorn.run(create_app(final=True), host="127.0.0.1", port=port, log_level="warning")
