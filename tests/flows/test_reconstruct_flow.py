"""The reconstruct and validate flows end to end on sampled demo generations, gates included."""

from __future__ import annotations

import asyncio
import json

import pytest

from flows.reconstruct import reconstruct_flow
from flows.validate import validate_flow
from tasks.config import ReconstructConfig, RunConfig, ValidationConfig
from tasks.gates import GateError
from tasks.storage import read_table, write_table


def bpe_row(tokenizer) -> dict:
    """Server ids that spell "A:\\n\\n1" with the one-token "\\n\\n", which canonical encoding splits in two."""
    messages = [{"role": "user", "content": "Count from one."}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    completion = encode("A:") + encode("\n\n") + encode("1") + encode("<|im_end|>")
    return {
        "id": "bpe-0",
        "source": "bpe",
        "messages": json.dumps(messages),
        "content": "A:\n\n1",
        "finish_reason": "stop",
        "prompt_token_ids": encode(prompt),
        "token_ids": completion,
    }


def artifact_keys() -> set[str]:
    from prefect.client.orchestration import get_client

    async def read():
        async with get_client() as client:
            return {a.key for a in await client.read_artifacts()}

    return asyncio.run(read())


@pytest.mark.slow
def test_flows_rebuild_and_validate_server_ids_exactly(prefect_harness, tmp_path, demo_tokenizer, sampled_generations):
    # The "bpe" source is one row built to be bpe_only in simulate: its rate is 100% by design.
    config = RunConfig(runs_dir=tmp_path, name="flow", validation=ValidationConfig(max_simulate_bpe_only_rate=1.0))
    write_table(
        "generations", [*sampled_generations, bpe_row(demo_tokenizer)], config.run_dir / "generations" / "part-00000.parquet"
    )
    rebuilt = reconstruct_flow(config)
    assert rebuilt["rows"] == len(sampled_generations) + 1 and rebuilt["quarantined"] == 0
    assert rebuilt["methods"] == {"server_ids": len(sampled_generations) + 1}
    summary = validate_flow(config)
    assert summary["classes"] == {"exact": len(sampled_generations) + 1, "bpe_only": 0, "semantic": 0, "unverified": 0}
    simulated = read_table("validation", config.run_dir / "validation").to_pandas().query("mode == 'simulate'")
    assert simulated.set_index("id").loc["bpe-0", "klass"] == "bpe_only"  # the text API loses the id choice
    assert {"reconstruct-summary", "validation-report", "gate-reconstruct", "gate-validate"} <= artifact_keys()


def test_validate_flow_gate_stops_on_bpe_only_rate(prefect_harness, tmp_path, demo_tokenizer):
    config = RunConfig(
        runs_dir=tmp_path,
        name="strict",
        reconstruct=ReconstructConfig(methods=["reencode"]),
        validation=ValidationConfig(max_bpe_only_rate=0.0, simulate=False),
    )
    write_table("generations", [bpe_row(demo_tokenizer)], config.run_dir / "generations" / "part-00000.parquet")
    reconstruct_flow(config)
    with pytest.raises(GateError, match="bpe_only_rate"):
        validate_flow(config)
    rows = read_table("validation", config.run_dir / "validation").to_pylist()
    assert [(r["klass"], r["first_divergence"]) for r in rows] == [("bpe_only", rows[0]["first_divergence"])]
    assert "'\\n\\n'" in rows[0]["truth_context"]
