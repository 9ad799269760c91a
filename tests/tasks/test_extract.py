"""Extract stage end to end on the demo target: storage format, fidelity, resume after SIGKILL, gate."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tasks.completions import marker_path
from tasks.config import ComputeConfig, ExtractConfig, RunConfig
from tasks.extract.checks import gate_extract
from tasks.extract.shards import read_rows
from tasks.extract.stage import EXTRACT, use_backend
from tasks.extract.transformers_backend import TransformersBackend
from tasks.gates import GateError
from tasks.prefect_env import PROJECT_ROOT
from tasks.storage import read_table, write_table
from tests.tasks.extract_inputs import chat_row, write_merged

torch.set_num_threads(1)
H = 576


def small_config(runs_dir: Path, name: str) -> RunConfig:
    # fp32 compute so a fresh forward pass is a tight reference; small shards so a run has several.
    return RunConfig(
        name=name,
        runs_dir=runs_dir,
        extract=ExtractConfig(shard_tokens=200, batch_tokens=256, cpu_threads=1),
        compute=ComputeConfig(dtype="float32"),
    )


@pytest.fixture(scope="module")
def backend(demo_model):
    return TransformersBackend(demo_model, name="HuggingFaceTB/SmolLM2-135M-Instruct")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, demo_tokenizer, backend):
    """One uninterrupted run over 8 train + 2 eval rows."""
    config = small_config(tmp_path_factory.mktemp("runs"), "reference")
    rows = write_merged(config.run_dir, demo_tokenizer, train=8, eval_=2)
    use_backend(config, backend)
    summary = EXTRACT.run(config)
    return config, rows, summary


def shard_bytes(config: RunConfig) -> dict[str, bytes]:
    directory = config.run_dir / "hidden_states"
    return {p.name: p.read_bytes() for p in sorted(directory.glob("shard-*.safetensors"))}


def test_storage_layout_shapes_and_dtype(reference):
    config, rows, summary = reference
    out = config.run_dir / "hidden_states"
    meta = json.loads((out / "meta.json").read_text())
    assert meta["aux_layer_ids"] == [2, 15, 27]
    assert meta["aux_layer_id_forms"]["sglang"] == [1, 14, 26] and meta["aux_layer_id_forms"]["vllm"] == [2, 15, 27]
    assert meta["aux_layer_convention"].startswith("hf_hidden_states_index")
    assert (meta["num_hidden_layers"], meta["hidden_size"], meta["vocab_size"]) == (30, H, 49152)
    assert meta["dtype"] == "bfloat16" and meta["compute_dtype"] == "float32"
    assert summary["shards"] == len(meta["shards"]) >= 3
    index = read_table("hidden_index", out / "index.parquet").to_pylist()
    assert sorted(r["id"] for r in index) == sorted(r["id"] for r in rows)
    by_id = {r["id"]: r for r in rows}
    for entry in index:
        assert entry["input_ids"] == by_id[entry["id"]]["input_ids"]
        assert entry["loss_mask"] == by_id[entry["id"]]["loss_mask"]
        assert entry["length"] == len(entry["input_ids"]) and entry["split"] == by_id[entry["id"]]["split"]
    total = 0
    for shard in meta["shards"]:
        with safe_open(str(out / shard["name"]), framework="pt") as f:
            aux, final = f.get_tensor("aux"), f.get_tensor("final")
        assert aux.dtype == final.dtype == torch.bfloat16
        assert aux.shape == (shard["tokens"], 3 * H) and final.shape == (shard["tokens"], H)
        spans = sorted((r["offset"], r["length"]) for r in index if r["shard"] == shard["name"])
        assert spans[0][0] == 0 and sum(n for _, n in spans) == shard["tokens"]  # no padding stored
        assert all(a + n == b for (a, n), (b, _) in zip(spans, spans[1:], strict=False))
        total += shard["tokens"]
    assert total == sum(r["num_tokens"] for r in rows) == meta["tokens"]
    assert 8 * H <= summary["bytes_per_token"] < 8 * H * 1.01  # three aux + final, bf16, ~nothing else


def test_saved_states_equal_a_fresh_forward_pass(reference, demo_model):
    config, rows, _ = reference
    out = config.run_dir / "hidden_states"
    index = {r["id"]: r for r in read_table("hidden_index", out / "index.parquet").to_pylist()}
    for rid in ("train-000", "train-006", "eval-001"):  # shortest, longest, an eval row
        entry = index[rid]
        (stored,) = read_rows(out / entry["shard"], [(entry["offset"], entry["length"])])
        with torch.no_grad():
            ref = demo_model(torch.tensor([entry["input_ids"]]), output_hidden_states=True).hidden_states
        aux = torch.cat([ref[2][0], ref[15][0], ref[27][0]], dim=-1)  # (T, 3*H)
        torch.testing.assert_close(stored.aux.float(), aux, rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(stored.final.float(), ref[-1][0], rtol=2e-2, atol=2e-2)


def test_rerun_skips_every_shard_and_gate_passes(reference, backend):
    config, _, _ = reference
    before = shard_bytes(config)
    use_backend(config, backend)
    summary = EXTRACT.run(config)
    assert summary["shards_skipped"] == summary["shards"] and summary["tokens_this_run"] == 0
    assert shard_bytes(config) == before
    result = gate_extract(config)
    assert result.success and result.rows == 10


@pytest.mark.slow
def test_resume_after_sigkill_is_byte_identical(reference, tmp_path, backend):
    ref_config, rows, ref_summary = reference
    config = small_config(tmp_path, "killed")
    write_table("merged", [r for r in rows if r["split"] == "train"], config.run_dir / "merged/train/part-00000.parquet")
    write_table("merged", [r for r in rows if r["split"] == "eval"], config.run_dir / "merged/eval/part-00000.parquet")
    script = (
        "import sys; from tasks.config import RunConfig; from tasks.extract.stage import EXTRACT; "
        "EXTRACT.run(RunConfig.model_validate_json(sys.argv[1]))"
    )
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", script, config.model_dump_json()],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    first = marker_path(config.run_dir / "hidden_states", "shard-00000.safetensors")
    deadline = time.time() + 240
    while not first.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    out = config.run_dir / "hidden_states"
    done = sorted(p.name for p in (out / "completions").glob("shard-*.json"))
    assert 1 <= len(done) < ref_summary["shards"], f"kill landed outside the run: {done}"
    # A half-written shard with no marker, and a temp file of a killed write, as a crash would leave them.
    last = f"shard-{ref_summary['shards'] - 1:05d}.safetensors"
    (out / last).write_bytes(b"\x00" * 100)
    (out / f".{last}.abc123.tmp").write_bytes(b"partial")
    use_backend(config, backend)
    summary = EXTRACT.run(config)
    assert summary["shards_skipped"] == len(done)
    assert shard_bytes(config) == shard_bytes(ref_config)
    assert not list(out.glob(".*.tmp"))
    assert read_table("hidden_index", out / "index.parquet").equals(
        read_table("hidden_index", ref_config.run_dir / "hidden_states/index.parquet")
    )


def test_gate_fails_on_a_corrupted_shard(reference, tmp_path):
    ref_config, _, _ = reference
    config = small_config(tmp_path, "corrupt")
    shutil.copytree(ref_config.run_dir, config.run_dir)
    out = config.run_dir / "hidden_states"
    index = read_table("hidden_index", out / "index.parquet").to_pylist()
    victim = next(r for r in index if r["shard"] == "shard-00001.safetensors")
    with safe_open(str(out / victim["shard"]), framework="pt") as f:
        aux, final = f.get_tensor("aux"), f.get_tensor("final")
    final[victim["offset"] + 1, 7] = float("nan")
    save_file({"aux": aux, "final": final}, str(out / victim["shard"]))
    with pytest.raises(GateError) as err:
        gate_extract(config)
    failed = {(f.expectation, f.column) for f in err.value.result.failures}
    assert ("expect_column_values_to_be_between", "nonfinite_tokens") in failed
    assert victim["id"] in str(err.value)


def test_bad_rows_are_quarantined_and_still_accounted(tmp_path, demo_tokenizer, backend):
    config = small_config(tmp_path, "bad")
    good = [chat_row(demo_tokenizer, i, "train") for i in range(3)]
    short_mask = chat_row(demo_tokenizer, 3, "train") | {"loss_mask": [1]}
    out_of_vocab = chat_row(demo_tokenizer, 4, "train")
    out_of_vocab["input_ids"] = out_of_vocab["input_ids"][:-1] + [60_000]
    write_table("merged", good + [short_mask, out_of_vocab], config.run_dir / "merged/train/part-00000.parquet")
    use_backend(config, backend)
    summary = EXTRACT.run(config)
    assert summary["rows"] == 3 and summary["quarantined"] == 2
    quarantine = read_table("quarantine", config.run_dir / "hidden_states/quarantine.parquet").to_pylist()
    reasons = {r["id"]: r["reason"] for r in quarantine}
    assert reasons == {"train-003": "mask_length", "train-004": "token_out_of_vocab"}
    assert gate_extract(config).success
