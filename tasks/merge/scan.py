"""The single pass over the inputs: filters, digests and seeded priorities per row, kept rows spilled
to shuffle buckets, rejected rows to quarantine. Only scalar digests and ids stay in memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.config import MergeSourceConfig
from tasks.contracts import COUNT_VERDICTS, REPLY_COUNT_MISMATCH, TURN_ID, UNCOUNTED, ContractError, schema
from tasks.merge.filters import KEPT, BatchView, check_rows, quarantine_records
from tasks.merge.hashing import hash_strings, hash_token_lists, normalise_prompts, shuffle_key
from tasks.merge.shuffle import BUCKET_SCHEMA, BucketStore
from tasks.merge.sources import CLASSES, UNVERIFIED, ClassIndex, InputDir, route_rows

COLUMNS = ["id", "source", "input_ids", "loss_mask", "num_tokens", "finish_reason", "prompt_text"]
ORIGINS = ("target", "dataset")  # `origin` codes in the index; a table written before the column reads as target
OPTIONAL = ("origin", "count_verdict")  # read where the table has them (tables written before them do not)
# Bytes the scan keeps per row: five 8-byte digests/ids, small codes, and the id string (~24 bytes).
INDEX_BYTES_PER_ROW = 73
INDEX_DTYPES = {
    "source_index": np.int16,
    "reasons": np.uint8,
    "id_keys": np.uint64,
    "sequence_keys": np.uint64,
    "prompt_keys": np.uint64,
    "has_prompt": np.bool_,
    "priority": np.uint64,
    "num_tokens": np.int64,
    "origin": np.uint8,
    "count_verdict": np.uint8,
    "truncated": np.bool_,
}


@dataclass
class ScanIndex:
    """Per-row scalars of every routed input row, in scan order (the global row index)."""

    source_index: list[np.ndarray] = field(default_factory=list)
    reasons: list[np.ndarray] = field(default_factory=list)
    id_keys: list[np.ndarray] = field(default_factory=list)
    sequence_keys: list[np.ndarray] = field(default_factory=list)
    prompt_keys: list[np.ndarray] = field(default_factory=list)
    has_prompt: list[np.ndarray] = field(default_factory=list)
    priority: list[np.ndarray] = field(default_factory=list)
    num_tokens: list[np.ndarray] = field(default_factory=list)
    origin: list[np.ndarray] = field(default_factory=list)
    count_verdict: list[np.ndarray] = field(default_factory=list)
    truncated: list[np.ndarray] = field(default_factory=list)  # cut at max_tokens (finish_reason length)
    ids: list[pa.Array] = field(default_factory=list)
    rows: int = 0
    unrouted: int = 0

    def columns(self) -> dict[str, np.ndarray]:
        """Each per-row list joined into one array."""
        return {
            name: np.concatenate(getattr(self, name)) if getattr(self, name) else np.empty(0, dtype)
            for name, dtype in INDEX_DTYPES.items()
        }

    def id_column(self) -> pa.ChunkedArray:
        return pa.chunked_array(self.ids, type=pa.string())


def check_columns(path, parquet: pq.ParquetFile) -> None:
    """Raise naming the file and column when a shard lacks a contract column or has the wrong type."""
    want, have = schema("reconstructed"), parquet.schema_arrow
    for name in COLUMNS:
        if name not in have.names:
            raise ContractError(f"table 'reconstructed': {path}: missing column {name!r}")
        if not have.field(name).type.equals(want.field(name).type):
            raise ContractError(
                f"table 'reconstructed': {path}: column {name!r} has type {have.field(name).type}, "
                f"expected {want.field(name).type}"
            )


def origins_of(batch: pa.RecordBatch) -> np.ndarray:
    """Each row's origin as an index into ORIGINS; missing or null reads as target, anything else is refused."""
    if "origin" not in batch.schema.names:
        return np.zeros(batch.num_rows, np.uint8)
    values = pc.fill_null(batch.column("origin"), ORIGINS[0])
    codes = pc.index_in(values, pa.array(ORIGINS))
    if codes.null_count:
        bad = values.filter(pc.is_null(codes))[0].as_py()
        raise ContractError(f"table 'reconstructed': column 'origin' has {bad!r}, expected one of {list(ORIGINS)}")
    return codes.to_numpy().astype(np.uint8)


def verdicts_of(batch: pa.RecordBatch) -> np.ndarray:
    """Each row's count verdict as an index into COUNT_VERDICTS; missing or null reads as uncounted."""
    if "count_verdict" not in batch.schema.names:
        return np.full(batch.num_rows, COUNT_VERDICTS.index(UNCOUNTED), np.uint8)
    codes = pc.index_in(pc.fill_null(batch.column("count_verdict"), UNCOUNTED), pa.array(COUNT_VERDICTS))
    return pc.fill_null(codes, COUNT_VERDICTS.index(UNCOUNTED)).to_numpy().astype(np.uint8)


def priorities(ids: pa.Array, source_index: np.ndarray, keys: list[bytes]) -> np.ndarray:
    """Seeded shuffle digest per row, keyed by its source so that each source draws independently. The turns of a
    conversation regenerated turn by turn (`<id>#t<k>`) share their conversation's digest: one split holds them all,
    so no held-out prompt carries a trained reply."""
    out = np.zeros(len(ids), dtype=np.uint64)
    conversations = pc.replace_substring_regex(ids, TURN_ID.pattern, "")
    for index in np.unique(source_index).tolist():
        mine = source_index == index
        out[mine] = hash_strings(conversations.filter(pa.array(mine)), key=keys[index])
    return out


def scan_inputs(
    dirs: list[InputDir],
    sources: list[MergeSourceConfig],
    seed: int,
    batch_rows: int,
    buckets: BucketStore,
    quarantine: Callable[[list[dict]], None],
) -> ScanIndex:
    """Read every input batch once; return the per-row index (the buckets hold the kept rows)."""
    index = ScanIndex()
    keys = [shuffle_key(seed, s.name) for s in sources]
    for entry in dirs:
        strict = any(set(sources[i].allowed_classes) != set(CLASSES) for i in _sources_of(entry))
        classes = ClassIndex(entry.validation_files()) if strict else None
        for path in entry.files:
            parquet = pq.ParquetFile(path)
            check_columns(path, parquet)
            columns = COLUMNS + [name for name in OPTIONAL if name in parquet.schema_arrow.names]
            for batch in parquet.iter_batches(batch_size=batch_rows, columns=columns):
                _scan_batch(batch, entry, sources, keys, classes, index, buckets, quarantine)
    return index


def _sources_of(entry: InputDir) -> list[int]:
    return [entry.take_all] if entry.take_all is not None else list(entry.routes.values())


def _scan_batch(batch, entry, sources, keys, classes, index, buckets, quarantine) -> None:
    source_index = route_rows(entry, batch.column("source"))
    routed = source_index >= 0
    index.unrouted += int((~routed).sum())
    if not routed.all():
        batch, source_index = batch.filter(pa.array(routed)), source_index[routed]
    if not batch.num_rows:
        return
    ids = batch.column("id")
    id_keys = hash_strings(ids)
    klass = classes.lookup(id_keys) if classes is not None else np.full(len(ids), UNVERIFIED, np.uint8)
    verdict = verdicts_of(batch)
    view = BatchView.from_batch(batch, source_index, klass, verdict == COUNT_VERDICTS.index(REPLY_COUNT_MISMATCH))
    reasons = check_rows(view, sources)
    records = quarantine_records(reasons, view, sources)
    if records:
        quarantine(records)
    prompts = normalise_prompts(batch.column("prompt_text"))
    has_prompt = pc.fill_null(pc.greater(pc.utf8_length(prompts), 0), False).to_numpy(zero_copy_only=False)
    priority = priorities(ids, source_index, keys)
    origin = origins_of(batch)
    rows = np.arange(index.rows, index.rows + batch.num_rows, dtype=np.int64)

    index.source_index.append(source_index)
    index.reasons.append(reasons)
    index.id_keys.append(id_keys)
    index.sequence_keys.append(hash_token_lists(batch.column("input_ids")))
    index.prompt_keys.append(hash_strings(prompts))
    index.has_prompt.append(has_prompt)
    index.priority.append(priority)
    index.num_tokens.append(view.num_tokens)
    index.origin.append(origin)
    index.count_verdict.append(verdict)
    index.truncated.append(view.truncated)
    index.ids.append(ids.cast(pa.string()))
    index.rows += batch.num_rows

    kept = reasons == KEPT
    spilled = pa.Table.from_arrays(
        [
            pa.array(rows[kept]),
            pa.array(priority[kept]),
            pa.array(source_index[kept]),
            ids.filter(pa.array(kept)),
            batch.column("input_ids").filter(pa.array(kept)),
            batch.column("loss_mask").filter(pa.array(kept)),
            batch.column("num_tokens").filter(pa.array(kept)),
            pa.array(view.mask_sums[kept].astype(np.int32)),
            pa.array(np.array(ORIGINS)[origin[kept]]),
        ],
        schema=BUCKET_SCHEMA,
    )
    buckets.add(spilled)
