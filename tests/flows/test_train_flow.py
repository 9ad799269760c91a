"""Train and evaluate flows on the fixture run: metrics, export, artifacts, gates."""

import asyncio
import json

import pytest

from flows.evaluate import evaluate_flow
from flows.train import train_flow
from tasks.config import RunConfig
from tests.tasks.draft_fixture import write_run


@pytest.mark.slow
def test_train_then_evaluate_flows(prefect_harness, tmp_path, demo_tokenizer, demo_model):
    from prefect.client.orchestration import get_client

    write_run(tmp_path / "flow", demo_tokenizer, demo_model)
    config = RunConfig.model_validate(
        {
            "name": "flow",
            "runs_dir": str(tmp_path),
            "train": {
                "draft_vocab_size": 512,
                "ttt_steps": 2,
                "batch_tokens": 256,
                "lr": 3e-3,
                "warmup_steps": 1,
                "max_steps": 8,
                "checkpoint_every": 4,
                "draft_overrides": {"intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1},
            },
            # 8 steps on 12 chats cannot beat the untrained draft on one prompt: no comparison here.
            "evaluate": {"num_prompts": 1, "max_new_tokens": 8, "num_draft_tokens": 2, "min_tau_gain": None},
        }
    )
    trained = train_flow(config)
    assert trained["steps"] == 8
    exported = json.loads((config.run_dir / "draft" / "export" / "config.json").read_text())
    assert exported["architectures"] == ["LlamaForCausalLMEagle3"]
    evaluated = evaluate_flow(config)
    assert evaluated["identical"] == evaluated["prompts"] == 1

    async def artifact_keys():
        async with get_client() as client:
            return {a.key for a in await client.read_artifacts()}

    assert {"train-metrics", "train-summary", "gate-train", "eval-acceptance", "gate-evaluate"} <= asyncio.run(artifact_keys())
