"""The generate flow: stage, gate, artifacts; a failing gate names the expectation."""

import json

import pytest

from flows.generate import generate_flow
from tasks.config import ApiConfig, GenerateConfig, RequestConfig, RunConfig, SourceConfig
from tasks.gates import GateError
from tests.support.faults import CannedServer


@pytest.fixture(scope="module")
def server():
    canned = CannedServer().start()
    yield canned
    canned.stop()


def config_for(tmp_path, server, contents, max_error_rate=0.05):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": c}]}) + "\n" for i, c in enumerate(contents))
    )
    return RunConfig(
        name="flow",
        runs_dir=tmp_path,
        generate=GenerateConfig(
            sources=[SourceConfig(name="f", format="openai", path=str(prompts))],
            api=ApiConfig(base_url=server.base_url, provider="openrouter", api_key_env=None, max_retries=1, backoff_base_s=0.01),
            request=RequestConfig(max_tokens=16),
            max_error_rate=max_error_rate,
        ),
    )


def test_flow_generates_gates_and_publishes_artifacts(prefect_harness, tmp_path, server):
    from prefect.client.orchestration import get_client

    result = generate_flow(config_for(tmp_path, server, [f"question {i}" for i in range(6)]))
    assert result["rows"] == 6 and result["error_rate"] == 0.0
    summary = json.loads((tmp_path / "flow" / "generations" / "summary.json").read_text())
    assert summary["by_finish_reason"] == {"stop": 6} and summary["cost_usd"] == pytest.approx(0.0006)

    async def keys():
        async with get_client() as client:
            return {a.key for a in await client.read_artifacts()}

    import asyncio

    assert {"generate-summary", "generate-progress", "gate-generate"} <= asyncio.run(keys())


def test_gate_fails_when_the_error_rate_is_over_the_limit(prefect_harness, tmp_path, server):
    config = config_for(tmp_path, server, ["fine", "fault=400 refused"], max_error_rate=0.1)
    with pytest.raises(GateError, match="error_rate"):
        generate_flow(config)


def test_key_from_a_prefect_secret_block_is_sent_and_never_written(prefect_harness, tmp_path, server):
    from prefect.blocks.system import Secret

    sentinel = "sk-block-SENTINEL-9876543210"
    Secret(value=sentinel).save("draftsmith-test-key", overwrite=True)
    config = config_for(tmp_path, server, ["block key row", "fault=echo401 leak"], max_error_rate=0.5)
    config.generate.api.api_key_secret_block = "draftsmith-test-key"
    generate_flow(config)
    assert server.headers_seen[-1] == f"Bearer {sentinel}"
    for path in (tmp_path / "flow").rglob("*"):
        assert not path.is_file() or sentinel.encode() not in path.read_bytes(), path


@pytest.mark.slow
def test_a_run_that_ends_with_no_rows_fails_and_keeps_the_earlier_table(prefect_harness, tmp_path, server):
    """Every prompt skipped before any request: the stage names why, row by row, and writes nothing."""
    from tasks.generate.stage import NoRowsError
    from tests.pipeline_runs import tree_stats

    config = config_for(tmp_path, server, ["a first question", "a second question"])
    assert generate_flow(config)["rows"] == 2
    before = tree_stats(config.run_dir)
    source = config.generate.sources[0].model_copy(update={"max_prompt_chars": 5})
    skipping = config.model_copy(update={"generate": config.generate.model_copy(update={"sources": [source]})})
    with pytest.raises(
        NoRowsError, match=r"0 prompt\(s\) to answer, none answered; refused: 2 prompt_too_long \(e\.g\. f:q0, f:q1\)"
    ):
        generate_flow(skipping)
    assert tree_stats(config.run_dir) == before


def test_the_gate_refuses_an_empty_table(tmp_path):
    from tasks.gates import enforce
    from tasks.generate.gate import gate_frame
    from tasks.storage import write_table

    config = RunConfig(name="empty", runs_dir=tmp_path)
    write_table("generations", [], config.run_dir / "generations" / "part-00000.parquet")
    with pytest.raises(GateError, match="expect_table_row_count_to_be_between.*observed 0"):
        enforce("generations", gate_frame(config, 0.0), parameters={"max_error_rate": 0.05})
