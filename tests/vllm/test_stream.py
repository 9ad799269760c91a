"""Training on hidden states streamed from a real vLLM (the demo target, CPU build): the same weights as offline
shards, disk bounded by the prefetch depth or the cache budget, and recovery from kill -9, a dead engine and a full disk.

Run by `make test-vllm` (DRAFTSMITH_VLLM_PYTHON names .venv-vllm's Python).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tasks.config import RunConfig
from tasks.draft.states import plan_hidden_states
from tasks.draft.train import train_draft
from tasks.extract.vllm_backend import EngineDied
from tests.tasks.extract_inputs import write_merged

VLLM_PYTHON = os.environ.get("DRAFTSMITH_VLLM_PYTHON", "")
pytestmark = [pytest.mark.timeout(3600), pytest.mark.skipif(not VLLM_PYTHON, reason="needs DRAFTSMITH_VLLM_PYTHON")]

PREFETCH = 2
# vLLM's CPU kernels round a row's states the same way only for the same batch around it, and which rows share a
# forward depends on when their requests arrive: two uninterrupted streamed runs of this module have differed by up
# to 2e-7 in a weight (fp32). Runs that must agree are held to this; the batches and their order, exactly.
ENGINE_TOLERANCE = 1e-5
TRAIN = {
    "draft_vocab_size": 512,
    "ttt_steps": 3,
    "batch_tokens": 256,
    "lr": 3e-3,
    "warmup_steps": 2,
    "max_steps": 14,  # two epochs and a bit of the 24 rows
    "checkpoint_every": 4,
    "prefetch_batches": PREFETCH,
    "draft_overrides": {"intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1},
}


@pytest.fixture(scope="module")
def merged(tmp_path_factory, demo_tokenizer):
    """One set of merged rows every run here trains on."""
    root = tmp_path_factory.mktemp("stream-rows")
    rows = write_merged(root, demo_tokenizer, train=24, eval_=4)
    return root / "merged", rows


def run_config(tmp_path: Path, name: str, merged, hidden_states: str, **train) -> RunConfig:
    (tmp_path / name).mkdir(parents=True, exist_ok=True)
    if not (tmp_path / name / "merged").exists():
        (tmp_path / name / "merged").symlink_to(merged[0])
    vllm = {"python": VLLM_PYTHON, "args": ["--enforce-eager"], "concurrency": 4}
    return RunConfig.model_validate(
        {
            "name": name,
            "runs_dir": str(tmp_path),
            "compute": {"dtype": "float32"},
            "extract": {"backend": "vllm", "shard_tokens": 400},
            "vllm": vllm,
            "train": TRAIN | {"hidden_states": hidden_states} | train,
        }
    )


def weights(config: RunConfig) -> dict:
    found = sorted((config.run_dir / "draft" / "checkpoints").glob("step-*.pt"))
    return torch.load(found[-1], weights_only=False)["model"]


def assert_same_training(a: RunConfig, b: RunConfig) -> None:
    """The same batches in the same order (tokens and positions per step, exactly), the same losses and weights to
    the engine's rounding."""
    steps = [[json.loads(m) for m in (c.run_dir / "draft" / "metrics.jsonl").read_text().splitlines()] for c in (a, b)]
    order = [[(m["step"], m["tokens"], m["positions"]) for m in run] for run in steps]
    assert order[0] == order[1]
    for x, y in zip(*steps, strict=True):
        assert abs(x["loss"] - y["loss"]) <= ENGINE_TOLERANCE * abs(y["loss"]), x["step"]
    ours, theirs = weights(a), weights(b)
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=ENGINE_TOLERANCE, atol=ENGINE_TOLERANCE, msg=name)


def largest_batch(config: RunConfig, epochs: int = 3) -> int:
    """The most rows a batch of the run's first epochs holds."""
    from tasks.draft.data import merged_rows, plan_batches

    lengths = [len(r.input_ids) for r in merged_rows(config.run_dir)]
    seed, budget = config.compute.seed, config.train.batch_tokens
    return max(len(b) for epoch in range(epochs) for b in plan_batches(lengths, budget, seed, epoch))


@pytest.fixture(scope="module")
def streamed(tmp_path_factory, merged):
    """One streamed run to the end: its config and summary (the reference the other runs are held to)."""
    config = run_config(tmp_path_factory.mktemp("streamed"), "stream", merged, "stream")
    return config, train_draft(config)


def test_streamed_training_reaches_the_offline_weights_and_keeps_few_files(tmp_path, merged, streamed, prefect_harness):
    """Offline (vLLM's states in shards) and streamed (the same states, asked batch by batch) train the same draft;
    the stream's files never exceed the prefetch depth and are gone once read."""
    from flows.extract import extract_flow

    config, summary = streamed
    assert summary["hidden_states"] == "stream" and summary["step"] == TRAIN["max_steps"]
    assert summary["peak_files"] <= PREFETCH * largest_batch(config)  # asked ahead, read, deleted
    assert summary["peak_files"] >= 1 and not list((config.run_dir / "draft" / "stream").glob("*"))
    trained = json.loads((config.run_dir / "draft" / "metrics.jsonl").read_text().splitlines()[-1])["tokens"]
    assert summary["asked_tokens"] == trained  # every epoch asks again; nothing asked that was not trained on
    assert summary["engine_busy_s"] > 0 and summary["engine_restarts"] == 0

    offline = run_config(tmp_path, "offline", merged, "offline")
    extract_flow(offline)
    assert train_draft(offline)["hidden_states"] == "offline"
    assert_same_training(offline, config)


def test_cache_keeps_the_budget_and_asks_only_what_it_lacks(tmp_path, merged, streamed):
    """A cache smaller than the set: later epochs read what it kept and ask the engine for the rest; the draft is the
    streamed one. A disk that fills while caching leaves the run streaming, with a warning."""
    config, summary = streamed
    per_token = 8 * 576
    total = sum(len(r["input_ids"]) for r in merged[1] if r["split"] == "train") * per_token
    budget = total // 2
    cached = run_config(tmp_path, "cache", merged, "cache", disk_budget_gb=budget / 1e9)
    result = train_draft(cached)
    assert result["cache_hits"] > 0 and result["cache_evicted"] > 0 and not result["cache_full"]
    assert result["asked_tokens"] < summary["asked_tokens"]
    kept = sum(p.stat().st_size for p in (cached.run_dir / "draft" / "states-cache").glob("*.safetensors"))
    assert 0 < kept <= budget
    longest = max(len(r["input_ids"]) for r in merged[1])
    engine_files = PREFETCH * max(TRAIN["batch_tokens"], longest) * 4 * 576 * 4  # the connector's (T, 4, H) in fp32
    assert result["peak_bytes"] <= budget + engine_files
    assert_same_training(cached, config)


def test_a_full_disk_while_caching_falls_back_to_streaming(tmp_path, merged, streamed, monkeypatch, caplog):
    monkeypatch.setenv("DRAFTSMITH_FAILPOINTS", "train.cache.write=fire@3")
    monkeypatch.setattr("tasks.failpoints._reached", {})
    full = run_config(tmp_path, "full", merged, "cache")
    result = train_draft(full)
    assert result["cache_full"] and result["step"] == TRAIN["max_steps"]
    assert "the disk is full" in caplog.text
    assert len(list((full.run_dir / "draft" / "states-cache").glob("*.safetensors"))) == 2  # the two written before
    assert_same_training(full, streamed[0])


def test_kill_9_mid_stream_resumes_at_the_same_batch_to_the_same_weights(tmp_path, merged, streamed):
    config = run_config(tmp_path, "killed", merged, "stream")
    launch = tmp_path / "killed.json"
    launch.write_text(config.model_dump_json())
    env = dict(os.environ, DRAFTSMITH_FAILPOINTS="train.checkpoint=kill")  # SIGKILL right after the first checkpoint
    command = [sys.executable, "-m", "tasks.draft.train", str(launch)]
    died = subprocess.run(command, env=env, cwd=Path(__file__).parents[2], timeout=900)
    assert died.returncode == -9
    pid_file = config.run_dir / "draft" / "engine.log.pid"
    orphan = int(pid_file.read_text())  # the killed trainer's server, left running
    assert Path(f"/proc/{orphan}").exists()
    result = train_draft(config)  # kills the orphan, starts its own server, resumes after the first checkpoint
    assert not Path(f"/proc/{orphan}").exists() or b"vllm" not in Path(f"/proc/{orphan}/cmdline").read_bytes()
    assert result["step"] == TRAIN["max_steps"]
    steps = [json.loads(m)["step"] for m in (config.run_dir / "draft" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, TRAIN["max_steps"] + 1))
    assert result["asked_tokens"] < streamed[1]["asked_tokens"]  # the batches before the checkpoint are not asked again
    assert_same_training(config, streamed[0])


def test_a_dead_engine_is_restarted_and_the_batch_asked_again(tmp_path, merged, streamed, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_FAILPOINTS", "extract.engine=fire@20")
    monkeypatch.setattr("tasks.failpoints._reached", {})
    config = run_config(tmp_path, "restarted", merged, "stream")
    result = train_draft(config)
    assert result["engine_restarts"] == 1 and result["step"] == TRAIN["max_steps"]
    assert (config.run_dir / "draft" / "engine.died-1.log").stat().st_size > 0
    assert_same_training(config, streamed[0])

    # An engine that dies every time: one restart allowed, then a failure that names the engine's log.
    monkeypatch.setenv("DRAFTSMITH_FAILPOINTS", "extract.engine=fire@2+")
    monkeypatch.setattr("tasks.failpoints._reached", {})
    doomed = run_config(tmp_path, "doomed", merged, "stream", engine_restarts=1)
    with pytest.raises(EngineDied, match=r"after 1 restart\(s\).*engine\.log"):
        train_draft(doomed)
    assert not list((doomed.run_dir / "draft" / "stream").glob("*.safetensors"))


def test_auto_streams_when_the_shards_do_not_fit_and_says_so(tmp_path, merged, streamed, prefect_harness):
    """auto: the pipeline skips extract and training streams; its plan line names the bytes offline would take."""
    config = run_config(tmp_path, "auto", merged, "auto", disk_budget_gb=1e-6)
    plan = plan_hidden_states(config)
    assert plan.mode == "stream" and f"{plan.offline_bytes:,} B" in plan.line()
    assert train_draft(config)["hidden_states"] == "stream"
    assert_same_training(config, streamed[0])
