"""Plan an extraction: screen merged rows, order them, cut shards, fingerprint each shard's input."""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pyarrow.compute as pc

from tasks.config import RunConfig
from tasks.contracts import quarantine_row
from tasks.extract.backend import TargetInfo, check_aux_layer_ids, default_aux_layer_ids
from tasks.extract.batching import cut_shards, order_rows
from tasks.extract.shards import shard_name
from tasks.extract.transformers_backend import resolve_dtype
from tasks.sharded import Shard
from tasks.stages import stage_dir
from tasks.storage import read_table, write_table
from tasks.target_model.loader import model_dir, pick_device

STAGE = "extract"
FORMAT_VERSION = 1  # bump when the bytes written for the same input change
SPLITS = ("train", "eval")


def read_target_info(config: RunConfig) -> TargetInfo:
    """Shape facts from the target's config.json (no weights loaded)."""
    from transformers import AutoConfig

    outer = AutoConfig.from_pretrained(str(model_dir(config.target)), trust_remote_code=config.target.trust_remote_code)
    cfg = getattr(outer, "text_config", None) or outer
    return TargetInfo(
        model=config.target.model,
        num_hidden_layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size,
        vocab_size=cfg.vocab_size,
        max_positions=getattr(cfg, "max_position_embeddings", None) or 1 << 30,
        architecture=(getattr(outer, "architectures", None) or [""])[0],
    )


def aux_layer_ids(config: RunConfig, info: TargetInfo) -> list[int]:
    ids = config.extract.aux_layer_ids or default_aux_layer_ids(info.num_hidden_layers)
    return check_aux_layer_ids(ids, info.num_hidden_layers)


def read_merged(config: RunConfig, columns: list[str] | None = None) -> pa.Table:
    """Train and eval rows of the merge stage (a missing eval split reads as empty); `columns`: only those."""
    root = stage_dir(config, "merge")
    if not (root / "train").exists():
        raise FileNotFoundError(f"extract: no merged train split at {root / 'train'}; run the merge stage first")
    tables = [read_table("merged", root / split, columns=columns) for split in SPLITS if (root / split).exists()]
    return pa.concat_tables(tables)


def screen_rows(table: pa.Table, info: TargetInfo) -> tuple[list[int], list[dict]]:
    """Positions of rows the target can run, and a quarantine record for each other row."""
    keep, dropped, seen = [], [], set()
    for i, row in enumerate(table.select(["id", "source", "split", "input_ids", "loss_mask", "num_tokens"]).to_pylist()):
        ids, mask, rid = row["input_ids"] or [], row["loss_mask"] or [], row["id"]
        problem = None
        if rid in seen:
            problem = ("duplicate_id", "id", f"id {rid!r} appears more than once in merged/")
        elif not ids:
            problem = ("empty_row", "input_ids", "input_ids is empty")
        elif len(mask) != len(ids):
            problem = ("mask_length", "loss_mask", f"loss_mask has {len(mask)} entries, input_ids {len(ids)}")
        elif row["num_tokens"] != len(ids):
            problem = ("num_tokens_mismatch", "num_tokens", f"num_tokens={row['num_tokens']}, input_ids has {len(ids)}")
        elif min(ids) < 0 or max(ids) >= info.vocab_size:
            problem = ("token_out_of_vocab", "input_ids", f"ids must lie in 0..{info.vocab_size - 1}")
        elif len(ids) > info.max_positions:
            problem = ("too_long", "input_ids", f"{len(ids)} tokens > the target's {info.max_positions} positions")
        seen.add(rid)
        if problem is None:
            keep.append(i)
        else:
            reason, field, detail = problem
            dropped.append(quarantine_row(STAGE, rid, row["source"], reason, f"row {rid}: {detail}", field))
    return keep, dropped


def fingerprint(shard: pa.Table, settings: dict) -> str:
    """Hash of everything a shard's bytes depend on: its rows, in order, and the extraction settings."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for row in shard.select(["id", "split", "input_ids"]).to_pylist():
        digest.update(f"{row['id']}\0{row['split']}\0".encode())
        digest.update(pa.array(row["input_ids"], pa.int32()).buffers()[1].to_pybytes())
    return digest.hexdigest()


def extraction_settings(config: RunConfig, info: TargetInfo) -> dict:
    """The settings that change stored bytes (the device does not pick the bytes, the dtype does)."""
    device = pick_device(config.compute.device)
    return {
        "format": FORMAT_VERSION,
        "target": config.target.model_dump(mode="json"),
        "backend": config.extract.backend,
        "aux_layer_ids": aux_layer_ids(config, info),
        "dtype": resolve_dtype(config.compute.dtype, device),
        "batch_tokens": config.extract.batch_tokens,
        "storage_dtype": config.extract.storage_dtype,
    }


def plan_extract(config: RunConfig) -> list[Shard]:
    """Screen and order the merged rows, write each shard's input table (plan/), drop inputs of older plans.

    A shard's fingerprint covers its rows, in order, and the settings that change the stored bytes.
    """
    out = stage_dir(config, "extract")
    info = read_target_info(config)
    merged = read_merged(config)
    keep, dropped = screen_rows(merged, info)
    write_table("quarantine", dropped, out / "quarantine.parquet")
    rows = merged.take(pa.array(keep, pa.int64())) if keep else merged.slice(0, 0)
    lengths = pc.list_value_length(rows.column("input_ids")).to_pylist()
    keys = [f"{s}\0{i}" for s, i in zip(rows.column("split").to_pylist(), rows.column("id").to_pylist(), strict=True)]
    order = order_rows(lengths, keys)
    rows = rows.take(pa.array(order, pa.int64()))
    lengths = [lengths[i] for i in order]
    settings = extraction_settings(config, info)
    plans = []
    for number, positions in enumerate(cut_shards(lengths, config.extract.shard_tokens)):
        name = shard_name(number)
        shard = rows.slice(positions[0], len(positions))
        path = write_table("merged", shard, out / "plan" / name.replace(".safetensors", ".parquet"))
        plans.append(Shard(name, str(path), (name,), fingerprint(shard, settings)))
    keep_names = {p.name for p in plans}
    for path in (out / "plan").glob("shard-*.parquet"):
        if path.stem + ".safetensors" not in keep_names:
            path.unlink()
    return plans
