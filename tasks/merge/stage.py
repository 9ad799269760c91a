"""Merge stage entry point: `run_merge(config)` does the work (Prefect wrappers live in `task.py`)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import tasks
from tasks.config import MergeConfig, MergeSourceConfig, RunConfig
from tasks.contracts import COUNT_VERDICTS, quarantine_row, schema, to_table
from tasks.failpoints import failpoint
from tasks.merge.dedup import drop_duplicates
from tasks.merge.filters import KEPT, REASONS, STAGE
from tasks.merge.manifest import (
    QUARANTINE,
    clear_staging,
    config_hash,
    fingerprint,
    is_current,
    publish_directory,
    read_manifest,
    staging_prefix,
    write_manifest,
)
from tasks.merge.mix import EVAL, SPLITS, TRAIN, SourcePlan, draw_rows, plan_mix, realised_shares, requested_shares
from tasks.merge.scan import INDEX_BYTES_PER_ROW, ORIGINS, ScanIndex, scan_inputs
from tasks.merge.shards import ShardWriter
from tasks.merge.shuffle import BucketStore, bucket_count, shuffled_rows
from tasks.merge.sources import InputDir, fingerprint_inputs, resolve_sources
from tasks.stages import stage_dir

MIB = 1 << 20
NORMALISATION = "NFKC, lower-cased, whitespace runs collapsed to one space, trimmed"
# Share of the memory budget for one shuffle bucket in memory (it is copied about twice when sorted)
# and for one input batch (decoded lists plus digests).
BUCKET_SHARE, BATCH_SHARE = 0.2, 0.01
QUARANTINE_CHUNK = 50_000


class MergeBudgetError(MemoryError):
    """The configured memory budget cannot hold the merge's per-row index."""


def run_merge(config: RunConfig, force: bool = False) -> dict:
    """Merge, dedup, mix and split the reconstructed sources into `run_dir/merged/`; a no-op when
    the inputs and config are unchanged (unless forced). Returns a small summary (paths and counts)."""
    target = stage_dir(config, "merge")
    sources, dirs = resolve_sources(config)
    inputs = fingerprint_inputs(dirs)
    key = fingerprint(config_hash(config.merge, config.compute.seed, sources), inputs)
    existing = read_manifest(target)
    if not force and is_current(existing, target, key):
        return summarise(existing, target, skipped=True)
    config.run_dir.mkdir(parents=True, exist_ok=True)
    clear_staging(target)
    staging = Path(tempfile.mkdtemp(prefix=staging_prefix(target), dir=config.run_dir))
    try:
        manifest = build_merged(staging, config.merge, config.compute.seed, sources, dirs)
        manifest |= {"fingerprint": key, "inputs": inputs}
        write_manifest(staging, manifest)
        failpoint("merge.publish")
        publish_directory(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return summarise(manifest, target, skipped=False)


def summarise(manifest: dict, target: Path, skipped: bool) -> dict:
    return {
        "merged_dir": str(target),
        "train_rows": manifest["rows"]["train"],
        "eval_rows": manifest["rows"]["eval"],
        "train_shards": len(manifest["splits"]["train"]["shards"]),
        "eval_shards": len(manifest["splits"]["eval"]["shards"]),
        "dropped": sum(sum(v.values()) for v in manifest["drops"].values()),
        "skipped": skipped,
    }


def input_size(dirs: list[InputDir]) -> tuple[int, int]:
    """Rows (from Parquet footers) and estimated in-memory bytes of every input shard.

    Footer sizes undercount dictionary-encoded token ids, so bytes per row come from decoding the
    first row group of the first shard.
    """
    files = [path for entry in dirs for path in entry.files]
    rows = sum(pq.ParquetFile(path).metadata.num_rows for path in files)
    if not rows:
        return 0, 0
    sample = next((pq.ParquetFile(p) for p in files if pq.ParquetFile(p).metadata.num_rows), None)
    head = sample.read_row_group(0, columns=["id", "input_ids", "loss_mask"])
    return rows, rows * max(1, head.nbytes // max(1, head.num_rows))


def build_merged(staging: Path, merge: MergeConfig, seed: int, sources: list[MergeSourceConfig], dirs: list[InputDir]) -> dict:
    """Write train/eval shards and quarantine into `staging` (shuffle and split by `seed`); return the manifest body."""
    budget = merge.memory_budget_mb * MIB
    rows, size = input_size(dirs)
    if rows * INDEX_BYTES_PER_ROW > budget // 2:
        raise MergeBudgetError(
            f"merge.memory_budget_mb={merge.memory_budget_mb} cannot hold the dedup index of {rows} rows "
            f"(~{rows * INDEX_BYTES_PER_ROW * 2 // MIB + 1} MiB needed with working room)"
        )
    row_bytes = max(1, size // max(1, rows))
    batch_rows = int(np.clip(budget * BATCH_SHARE // row_bytes, 256, 4096))
    buckets = BucketStore(staging / ".buckets", bucket_count(size, int(budget * BUCKET_SHARE)))
    quarantine = pq.ParquetWriter(staging / QUARANTINE, schema("quarantine"), compression="zstd")
    try:
        index = scan_inputs(dirs, sources, seed, batch_rows, buckets, lambda r: quarantine.write_table(to_table("quarantine", r)))
        buckets.close()
        columns = index.columns()
        reasons = columns["reasons"]
        duplicates = drop_duplicates(
            reasons, columns["id_keys"], columns["sequence_keys"], columns["prompt_keys"], columns["has_prompt"]
        )
        ids = index.id_column()
        for found in duplicates:
            _quarantine_duplicates(quarantine, found, ids, columns["source_index"], sources)
        available = np.bincount(columns["source_index"][reasons == KEPT], minlength=len(sources)).tolist()
        plans = plan_mix(sources, available, merge.eval_size)
        split, not_drawn = draw_rows(plans, columns["source_index"], columns["priority"], reasons)
        reasons[not_drawn] = REASONS.index("not_sampled")
        _quarantine_not_drawn(quarantine, not_drawn, ids, columns["source_index"], plans)
    finally:
        quarantine.close()
    shard_files = _write_shards(staging, buckets, split, merge.rows_per_shard, [s.name for s in sources])
    return _manifest(merge, seed, sources, plans, index, columns, split, shard_files)


def _write_shards(staging: Path, buckets: BucketStore, split: np.ndarray, rows_per_shard: int, names: list[str]):
    writers = {code: ShardWriter(staging / name, rows_per_shard) for code, name in SPLITS.items()}
    name_array = pa.array(names, type=pa.string())
    for bucket in range(buckets.count):
        table = buckets.read(bucket)
        for code, positions in shuffled_rows(table, split).items():
            part = table.take(pa.array(positions))
            writers[code].add(
                pa.table(
                    {
                        "id": part.column("id"),
                        "source": name_array.take(part.column("source_index").cast(pa.int32())),
                        "split": pa.array([SPLITS[code]] * part.num_rows, type=pa.string()),
                        "input_ids": part.column("input_ids"),
                        "loss_mask": part.column("loss_mask"),
                        "num_tokens": part.column("num_tokens"),
                        "num_trained": part.column("num_trained"),
                        "origin": part.column("origin"),
                    }
                )
            )
            del part
        del table
        buckets.remove(bucket)
    buckets.directory.rmdir()
    return {name: writers[code].close() for code, name in SPLITS.items()}


def _write_records(quarantine: pq.ParquetWriter, records: list[dict]) -> None:
    if records:
        quarantine.write_table(to_table("quarantine", records))


def _quarantine_duplicates(quarantine, found, ids: pa.ChunkedArray, source_index, sources) -> None:
    field = {"duplicate_id": "id", "duplicate_sequence": "input_ids", "duplicate_prompt": "prompt_text"}[found.reason]
    what = {
        "duplicate_id": "same id as",
        "duplicate_sequence": "same input_ids as",
        "duplicate_prompt": "same normalised prompt_text as",
    }[found.reason]
    for start in range(0, len(found.dropped), QUARANTINE_CHUNK):
        dropped = found.dropped[start : start + QUARANTINE_CHUNK]
        kept = found.kept[start : start + QUARANTINE_CHUNK]
        dropped_ids = ids.take(pa.array(dropped)).to_pylist()
        kept_ids = ids.take(pa.array(kept)).to_pylist()
        records = [
            quarantine_row(
                STAGE,
                row_id,
                sources[source_index[row]].name,
                found.reason,
                f"{what} row {kept_id!r} of source {sources[source_index[first]].name!r}, which is kept",
                field=field,
            )
            for row, first, row_id, kept_id in zip(dropped.tolist(), kept.tolist(), dropped_ids, kept_ids, strict=True)
        ]
        _write_records(quarantine, records)


def _quarantine_not_drawn(quarantine, not_drawn, ids: pa.ChunkedArray, source_index, plans: list[SourcePlan]) -> None:
    for start in range(0, len(not_drawn), QUARANTINE_CHUNK):
        rows = not_drawn[start : start + QUARANTINE_CHUNK]
        records = []
        for row, row_id in zip(rows.tolist(), ids.take(pa.array(rows)).to_pylist(), strict=True):
            plan = plans[source_index[row]]
            limit = "weight" if plan.weight is not None else "max_rows"
            detail = (
                f"source {plan.name!r} draws {plan.selected} of its {plan.available} kept rows "
                f"(weight {plan.weight}, max_rows {plan.max_rows}); this row was not drawn for seed order"
            )
            records.append(quarantine_row(STAGE, row_id, plan.name, "not_sampled", detail, field=limit))
        _write_records(quarantine, records)


def _manifest(merge, seed, sources, plans, index: ScanIndex, columns, split, shard_files) -> dict:
    source_index, reasons, tokens = columns["source_index"], columns["reasons"], columns["num_tokens"]
    n = len(sources)
    drops: dict[str, dict[str, int]] = {}
    table = np.zeros((len(REASONS), n), dtype=np.int64)
    np.add.at(table, (reasons, source_index), 1)
    for code, reason in enumerate(REASONS[1:], start=1):
        if table[code].any():
            drops[reason] = {sources[i].name: int(table[code, i]) for i in range(n) if table[code, i]}
    counts = {}
    for i, plan in enumerate(plans):
        mine = source_index == i
        counts[plan.name] = {
            "input": int(mine.sum()),
            "available": plan.available,
            "selected": plan.selected,
            "train": plan.train_rows,
            "eval": plan.eval_rows,
            "train_tokens": int(tokens[mine & (split == TRAIN)].sum()),
            "eval_tokens": int(tokens[mine & (split == EVAL)].sum()),
            "train_truncated": int((mine & (split == TRAIN) & columns["truncated"]).sum()),  # cut at max_tokens
        }
    by_origin = {}
    for code, origin in enumerate(ORIGINS):
        mine = columns["origin"] == code
        if mine.any():
            train, evals = mine & (split == TRAIN), mine & (split == EVAL)
            by_origin[origin] = {
                "train": int(train.sum()),
                "eval": int(evals.sum()),
                "train_tokens": int(tokens[train].sum()),
                "eval_tokens": int(tokens[evals].sum()),
            }
    by_count_verdict = {}
    for code, verdict in enumerate(COUNT_VERDICTS):
        train, evals = (columns["count_verdict"] == code) & (split == TRAIN), (columns["count_verdict"] == code) & (split == EVAL)
        if train.any() or evals.any():
            by_count_verdict[verdict] = {"train": int(train.sum()), "eval": int(evals.sum())}
    selected = {p.name: p.selected for p in plans}
    requested, realised = requested_shares(plans), realised_shares(selected, plans)
    total = sum(selected.values())
    pairs = list(zip(sources, plans, strict=True))
    eval_rows = {split: [p.eval_rows for s, p in pairs if s.split == split] for split in ("eval", "mixed")}
    mixed = int(merge.eval_size) if merge.eval_size >= 1 and eval_rows["mixed"] else sum(eval_rows["mixed"])
    expected_eval = sum(eval_rows["eval"]) + mixed  # held-out sources whole, plus merge.eval_size of the mixed ones
    return {
        "draftsmith_version": tasks.__version__,
        "config": merge.model_dump(mode="json") | {"seed": seed},
        "config_hash": config_hash(merge, seed, sources),
        "sources": [s.model_dump(mode="json") for s in sources],
        "prompt_normalisation": NORMALISATION,
        "rows": {
            "input": index.rows,
            "unrouted": index.unrouted,
            "train": sum(p.train_rows for p in plans),
            "eval": sum(p.eval_rows for p in plans),
        },
        "expected": {"total_rows": total, "eval_rows": expected_eval},
        "counts": counts,
        "by_origin": by_origin,
        "by_count_verdict": by_count_verdict,
        "drops": drops,
        "mix": {
            p.name: {
                "weight": p.weight,
                "max_rows": p.max_rows,
                "requested_share": requested[p.name],
                "realised_share": realised[p.name],
                "share_of_set": p.selected / total if total else 0.0,
            }
            for p in plans
        },
        "splits": {
            name: {"rows": sum(getattr(p, f"{name}_rows") for p in plans), "shards": files} for name, files in shard_files.items()
        },
    }
