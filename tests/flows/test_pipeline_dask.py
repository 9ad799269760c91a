"""The same chain on a local Dask cluster gives the same outputs as the default thread runner."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from tests.pipeline_runs import run_tiny, tree_hashes

pytestmark = pytest.mark.slow

# Data outputs must match byte for byte; completion markers, manifests and results also hold
# paths and timings, so they are compared through what they record about the data.
DATA_DIRS = ("reconstructed", "validation", "merged/train", "merged/eval", "hidden_states")


def data_hashes(run_dir):
    hashes = {}
    for sub in DATA_DIRS:
        for name, digest in tree_hashes(run_dir / sub).items():
            if name.endswith((".parquet", ".safetensors")) and not name.startswith("plan/"):
                hashes[f"{sub}/{name}"] = digest
    return hashes


def test_dask_runner_matches_threads(tiny_run, prefect_server, tmp_path):
    run_dir, _, _ = tiny_run
    shutil.copytree(run_dir / "generations", tmp_path / "tiny" / "generations")  # same replies, no requests
    # One worker process per local cluster: every shard still crosses a process boundary through Dask, and the
    # suite pays one worker start-up (torch, transformers, the target) per sharded stage instead of two.
    dask = ["--set", "orchestration.task_runner=dask", "--set", "orchestration.max_workers=1"]
    done = run_tiny(tmp_path, api_url=prefect_server, extra=dask)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "distributed.scheduler" in done.stdout + done.stderr  # the shards really went through Dask
    dask_dir = tmp_path / "tiny"

    expected = data_hashes(run_dir)
    assert expected and data_hashes(dask_dir) == expected

    # Training in two processes is reproducible to ~1e-8 in fp32, not bit for bit; the export is bf16.
    ours, theirs = (load_file(d / "draft" / "export" / "model.safetensors") for d in (dask_dir, run_dir))
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.allclose(ours[name].float(), theirs[name].float(), rtol=1e-2, atol=1e-3), name

    results = [json.loads((d / "eval" / "results.json").read_text())["summary"] for d in (dask_dir, run_dir)]
    assert results[0]["prompts"] == results[1]["prompts"] and results[0]["identical"] == results[1]["identical"]
