import pytest

from flows.preflight import preflight_flow
from tasks.config import RunConfig
from tasks.target_model.preflight import PreflightError


def test_preflight_flow_passes_and_publishes(prefect_harness):
    from prefect.client.orchestration import get_client

    result = preflight_flow(RunConfig())
    assert result["end_of_turn_id"] == 2

    async def artifact_keys():
        async with get_client() as client:
            return {a.key for a in await client.read_artifacts()}

    import asyncio

    assert "preflight" in asyncio.run(artifact_keys())


def test_preflight_flow_fails_on_wrong_pin(prefect_harness):
    config = RunConfig.model_validate({"target": {"special_tokens": {"<|im_end|>": 163533}}})
    with pytest.raises(PreflightError, match="pins id 163533"):
        preflight_flow(config)


def test_prefect_yaml_deploys_the_demo_config():
    """`prefect deploy --all` registers what `draftsmith deploy --config configs/demo.yaml` registers: the same
    deployments (`eagle3_pipeline/demo`, `<stage flow>/demo-<stage>`), entrypoints, tags, descriptions, schedule and
    pool, each with the demo config."""
    from pathlib import Path

    import yaml

    from flows.deploy import build_deployments
    from tasks.config import RunConfig, load_config

    root = Path(__file__).resolve().parents[2]
    doc = yaml.safe_load((root / "prefect.yaml").read_text())
    demo = load_config(root / "configs" / "demo.yaml")
    entrypoints = {d["entrypoint"] for d in doc["deployments"]}
    assert "flows/pipeline.py:eagle3_pipeline" in entrypoints and len(entrypoints) == 8
    for deployment in doc["deployments"]:
        assert RunConfig.model_validate(deployment["parameters"]["config"]) == demo, deployment["name"]
    declared = [
        (d["name"], d["entrypoint"], d["tags"], d.get("description"), d["concurrency_limit"], d["work_pool"]["name"])
        + ([(s["cron"], s["timezone"]) for s in d.get("schedules", [])],)
        for d in doc["deployments"]
    ]
    registered = [
        (d.name, d.entrypoint, d.tags, d.description, d.concurrency_limit, d.work_pool_name)
        + ([(s.schedule.cron, s.schedule.timezone) for s in d.schedules or []],)
        for d in build_deployments(demo)
    ]
    assert declared == registered
