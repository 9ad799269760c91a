import pytest

from flows.preflight import preflight_flow
from tasks.config import RunConfig
from tasks.target.preflight import PreflightError


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
