"""The extract stage: run the target over planned shards, then write the index and metadata."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from tasks.config import RunConfig
from tasks.extract.backend import (
    FINAL_CONVENTION,
    LAYER_CONVENTION,
    HiddenStateBackend,
    layer_id_forms,
)
from tasks.extract.batching import pack_batches, padding_tokens
from tasks.extract.plan import aux_layer_ids, plan_extract, read_target_info
from tasks.extract.shards import bytes_per_token, write_shard
from tasks.extract.transformers_backend import load_transformers_backend, resolve_dtype
from tasks.sharded import Shard, ShardedStage
from tasks.stages import stage_dir
from tasks.storage import read_table, write_bytes_atomic, write_table
from tasks.target_model.loader import pick_device

_backends: dict[str, HiddenStateBackend] = {}
_backend_lock = threading.Lock()


def backend_key(config: RunConfig) -> str:
    loads = {"target": True, "compute": True, "extract": {"backend", "aux_layer_ids", "cpu_threads"}, "vllm": True}
    return json.dumps(config.model_dump(mode="json", include=loads), sort_keys=True)


def use_backend(config: RunConfig, backend: HiddenStateBackend) -> None:
    """Make shard tasks of this config use an already loaded backend (a model the caller holds)."""
    with _backend_lock:
        _backends[backend_key(config)] = backend


def get_backend(config: RunConfig) -> HiddenStateBackend:
    """The configured backend, loaded once per process and shared by the shard tasks."""
    key = backend_key(config)
    with _backend_lock:
        if key not in _backends:
            if config.extract.backend == "vllm":
                from tasks.extract.vllm_backend import VllmBackend

                _backends[key] = VllmBackend(config)
            else:
                _backends[key] = load_transformers_backend(config.target, config.extract, config.compute)
        return _backends[key]


def release_backend(config: RunConfig) -> None:
    """Stop a backend that holds a server (vLLM); an in-process model stays loaded for the stages after."""
    with _backend_lock:
        backend = _backends.get(backend_key(config))
        if hasattr(backend, "close"):
            _backends.pop(backend_key(config)).close()


def build_shard(config: RunConfig, shard: Shard) -> dict:
    """Run the target over one shard's rows, length-sorted into batches; returns where each row's states lie."""
    backend = get_backend(config)
    table = read_table("merged", Path(shard.source), columns=["id", "split", "input_ids"]).to_pylist()
    lengths = [len(r["input_ids"]) for r in table]
    batches = pack_batches(lengths, config.extract.batch_tokens)
    started = time.perf_counter()
    states = []
    for batch in batches:
        states += backend.extract([table[i]["input_ids"] for i in batch])
    seconds = time.perf_counter() - started
    written = write_shard(stage_dir(config, "extract") / shard.name, states, config.extract.storage_dtype)
    offsets = [0]
    for n in lengths[:-1]:
        offsets.append(offsets[-1] + n)
    return {
        "shard": shard.name,
        "rows": [[r["id"], r["split"], o, n] for r, o, n in zip(table, offsets, lengths, strict=True)],
        "batches": len(batches),
        "padding_tokens": padding_tokens(lengths, batches),
        "forward_seconds": round(seconds, 4),
        **written,
    }


def build_index(plans: list[Shard], markers: list[dict]) -> list[dict]:
    """One hidden_index row per stored row, with its ids and loss mask from the shard's input."""
    rows = []
    for plan, marker in zip(plans, markers, strict=True):
        source = read_table("merged", Path(plan.source), columns=["id", "input_ids", "loss_mask"]).to_pylist()
        by_id = {r["id"]: r for r in source}
        for rid, split, offset, length in marker["rows"]:
            src = by_id[rid]
            rows.append(
                {
                    "id": rid,
                    "split": split,
                    "shard": plan.name,
                    "offset": offset,
                    "length": length,
                    "input_ids": src["input_ids"],
                    "loss_mask": src["loss_mask"],
                }
            )
    return rows


def finalize_extract(config: RunConfig, plans: list[Shard], markers: list[dict]) -> dict:
    """Write index.parquet and meta.json; return the run summary."""
    release_backend(config)
    out = stage_dir(config, "extract")
    info = read_target_info(config)
    ids = aux_layer_ids(config, info)
    index = build_index(plans, markers)
    write_table("hidden_index", index, out / "index.parquet")
    tokens = sum(m["tokens"] for m in markers)
    size = sum(m["bytes"] for m in markers)
    fresh = [m for m in markers if not m["skipped"]]
    fresh_tokens = sum(m["tokens"] for m in fresh)
    fresh_seconds = sum(m["forward_seconds"] for m in fresh)
    all_seconds = sum(m["forward_seconds"] for m in markers)
    computed = sum(m["tokens"] + m["padding_tokens"] for m in markers)
    meta = {
        "target": info.model,
        "num_hidden_layers": info.num_hidden_layers,
        "hidden_size": info.hidden_size,
        "vocab_size": info.vocab_size,
        "aux_layer_ids": ids,
        "aux_layer_convention": LAYER_CONVENTION,
        "architecture": info.architecture,
        "aux_layer_id_forms": layer_id_forms(ids, info.architecture),
        "final": FINAL_CONVENTION,
        "tensors": {"aux": f"[T, {3 * info.hidden_size}]", "final": f"[T, {info.hidden_size}]"},
        "dtype": config.extract.storage_dtype,
        "backend": config.extract.backend,
        "compute_dtype": resolve_dtype(config.compute.dtype, pick_device(config.compute.device)),
        "rows": len(index),
        "tokens": tokens,
        "bytes_per_token": round(size / tokens, 3) if tokens else None,
        "shards": [
            {"name": m["shard"], "rows": len(m["rows"]), "tokens": m["tokens"], "bytes": m["bytes"], "sha256": m["sha256"]}
            for m in markers
        ],
    }
    write_bytes_atomic(out / "meta.json", json.dumps(meta, indent=1).encode())
    quarantined = read_table("quarantine", out / "quarantine.parquet", columns=["id"]).num_rows
    return {
        "hidden_states": str(out),
        "index": str(out / "index.parquet"),
        "rows": len(index),
        "quarantined": quarantined,
        "shards": len(markers),
        "shards_skipped": len(markers) - len(fresh),
        "tokens": tokens,
        "tokens_this_run": fresh_tokens,
        "tokens_per_s": round(fresh_tokens / fresh_seconds, 1) if fresh_seconds else None,
        "tokens_per_s_all_shards": round(tokens / all_seconds, 1) if all_seconds else None,
        "padding_share": round(1 - tokens / computed, 4) if computed else 0.0,
        "bytes": size,
        "bytes_per_token": meta["bytes_per_token"],
        "bytes_per_token_ideal": bytes_per_token(info.hidden_size, config.extract.storage_dtype),
    }


def summary_markdown(summary: dict) -> str:
    rows = "\n".join(f"| {k} | {v} |" for k, v in summary.items() if k not in ("hidden_states", "index"))
    return f"# Extract: hidden states\n\n`{summary['hidden_states']}`\n\n| measure | value |\n|---|---|\n{rows}"


EXTRACT = ShardedStage("extract", plan_extract, build_shard, finalize_extract, summary_markdown, ("shard-*.safetensors",))
TASKS = EXTRACT.tasks()
