"""extract_flow under Prefect: shards, index, meta, artifact and gate from a small merged table."""

import json

import pytest
import torch

from tasks.config import ComputeConfig, ExtractConfig, RunConfig
from tasks.storage import read_table
from tests.tasks.extract_inputs import write_merged

torch.set_num_threads(1)


@pytest.mark.slow
def test_extract_flow_writes_gated_hidden_states(prefect_harness, tmp_path, demo_tokenizer):
    from flows.extract import extract_flow

    config = RunConfig(
        name="flow",
        runs_dir=tmp_path,
        extract=ExtractConfig(shard_tokens=150, cpu_threads=1),
        compute=ComputeConfig(dtype="float32"),
    )
    rows = write_merged(config.run_dir, demo_tokenizer, train=4, eval_=2)
    summary = extract_flow(config)
    assert summary["rows"] == 6 and summary["shards"] >= 2 and summary["gate"]["rows"] == 6
    assert summary["tokens"] == sum(r["num_tokens"] for r in rows)
    out = config.run_dir / "hidden_states"
    meta = json.loads((out / "meta.json").read_text())
    assert [s["name"] for s in meta["shards"]] == sorted(p.name for p in out.glob("shard-*.safetensors"))
    index = read_table("hidden_index", out / "index.parquet")
    assert sorted(index.column("split").to_pylist()) == ["eval"] * 2 + ["train"] * 4
    again = extract_flow(config)
    assert again["shards_skipped"] == again["shards"]
