"""Per-row filters of one input batch: every rejected row gets one reason (the first that applies)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.config import MergeSourceConfig
from tasks.contracts import quarantine_row
from tasks.merge.hashing import list_sums
from tasks.merge.sources import CLASSES

STAGE = "merge"
KEPT = 0
# Reason codes in the order they are checked; code i is REASONS[i].
REASONS = (
    "kept",
    "missing_id",
    "malformed",
    "count_masked",
    "empty_loss_mask",
    "too_short",
    "too_long",
    "truncated",
    "class_not_allowed",
    # Set after the scan, over all sources at once (dedup.py, mix.py).
    "duplicate_id",
    "duplicate_sequence",
    "duplicate_prompt",
    "not_sampled",
)
CODE = {name: code for code, name in enumerate(REASONS)}


@dataclass
class BatchView:
    """The columns of one input batch that the filters read, as numpy arrays (one row per entry)."""

    ids: pa.Array
    source_index: np.ndarray  # int16, -1 = not asked for
    num_tokens: np.ndarray  # int64, as recorded
    id_lengths: np.ndarray  # int64, len(input_ids)
    mask_lengths: np.ndarray  # int64, len(loss_mask)
    mask_sums: np.ndarray  # int64, trained tokens
    truncated: np.ndarray  # bool, finish_reason == "length"
    klass: np.ndarray  # uint8 class code
    count_mismatch: np.ndarray  # bool, the rebuilt reply length is not the provider's count

    @classmethod
    def from_batch(
        cls, batch: pa.RecordBatch, source_index: np.ndarray, klass: np.ndarray, count_mismatch: np.ndarray
    ) -> BatchView:
        input_ids, loss_mask = batch.column("input_ids"), batch.column("loss_mask")
        finish = batch.column("finish_reason")
        return cls(
            ids=batch.column("id"),
            source_index=source_index,
            num_tokens=batch.column("num_tokens").to_numpy(zero_copy_only=False).astype(np.int64),
            id_lengths=pc.fill_null(pc.list_value_length(input_ids), 0).to_numpy().astype(np.int64),
            mask_lengths=pc.fill_null(pc.list_value_length(loss_mask), 0).to_numpy().astype(np.int64),
            mask_sums=list_sums(loss_mask),
            truncated=pc.fill_null(pc.equal(finish, "length"), False).to_numpy(zero_copy_only=False),
            klass=klass,
            count_mismatch=count_mismatch,
        )


def check_rows(view: BatchView, sources: list[MergeSourceConfig]) -> np.ndarray:
    """Reason code per row (KEPT = passes); rows with source index -1 are left KEPT and ignored later."""
    reasons = np.zeros(len(view.source_index), dtype=np.uint8)

    def reject(code: int, bad: np.ndarray) -> None:
        reasons[(reasons == KEPT) & bad] = code

    id_lengths = pc.fill_null(pc.utf8_length(view.ids), 0).to_numpy(zero_copy_only=False)
    reject(CODE["missing_id"], id_lengths == 0)
    reject(CODE["malformed"], (view.id_lengths != view.mask_lengths) | (view.id_lengths != view.num_tokens))
    reject(CODE["count_masked"], view.count_mismatch & (view.mask_sums == 0))
    reject(CODE["empty_loss_mask"], view.mask_sums == 0)
    for index, source in enumerate(sources):
        mine = view.source_index == index
        reject(CODE["too_short"], mine & (view.num_tokens < source.min_tokens))
        if source.max_tokens is not None:
            reject(CODE["too_long"], mine & (view.num_tokens > source.max_tokens))
        if source.drop_truncated:
            reject(CODE["truncated"], mine & view.truncated)
        allowed = np.array([name in source.allowed_classes for name in CLASSES])
        reject(CODE["class_not_allowed"], mine & ~allowed[view.klass])
    return reasons


def explain(code: int, row: int, view: BatchView, source: MergeSourceConfig) -> tuple[str, str]:
    """(field, detail) for a rejected row."""
    tokens = int(view.num_tokens[row])
    if code == CODE["missing_id"]:
        return "id", "row has no id"
    if code == CODE["malformed"]:
        return "input_ids", (
            f"len(input_ids)={view.id_lengths[row]}, len(loss_mask)={view.mask_lengths[row]}, "
            f"num_tokens={tokens}: all three must agree"
        )
    if code == CODE["count_masked"]:
        return "loss_mask", "reply length is not the provider's count: its loss mask is off (reconstruct.count_mismatch: mask)"
    if code == CODE["empty_loss_mask"]:
        return "loss_mask", "no trained token: the draft would learn nothing from this row"
    if code == CODE["too_short"]:
        return "num_tokens", f"num_tokens {tokens} < min_tokens {source.min_tokens}"
    if code == CODE["too_long"]:
        return "num_tokens", f"num_tokens {tokens} > max_tokens {source.max_tokens}"
    if code == CODE["truncated"]:
        return "finish_reason", "finish_reason 'length': the reply was cut before its end-of-turn token"
    return "klass", f"validation class {CLASSES[view.klass[row]]!r} not in allowed_classes {source.allowed_classes}"


def quarantine_records(reasons: np.ndarray, view: BatchView, sources: list[MergeSourceConfig]) -> list[dict]:
    """Quarantine records for the rejected, routed rows of one batch."""
    rows = np.flatnonzero((reasons != KEPT) & (view.source_index >= 0))
    ids = view.ids.take(pa.array(rows, type=pa.int64())).to_pylist() if len(rows) else []
    records = []
    for row, row_id in zip(rows.tolist(), ids, strict=True):
        source = sources[view.source_index[row]]
        code = int(reasons[row])
        field, detail = explain(code, row, view, source)
        records.append(quarantine_row(STAGE, row_id, source.name, REASONS[code], detail, field=field))
    return records
