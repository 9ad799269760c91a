"""External shuffle: rows go to bucket files by the range of their seeded priority digest, so that
reading buckets in order, each sorted by priority, yields the whole set in shuffled order while only
one bucket is ever in memory.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa

from tasks.contracts import MASK, TOKEN_IDS

BUCKET_SCHEMA = pa.schema(
    [
        ("row", pa.int64()),  # global row index in scan order (ties in priority, lookups)
        ("priority", pa.uint64()),  # seeded shuffle digest
        ("source_index", pa.int16()),
        ("id", pa.string()),
        ("input_ids", TOKEN_IDS),
        ("loss_mask", MASK),
        ("num_tokens", pa.int32()),
        ("num_trained", pa.int32()),
        ("origin", pa.string()),
    ]
)


def bucket_count(total_bytes: int, bucket_bytes: int) -> int:
    """Buckets needed so that each holds about `bucket_bytes` of rows (priorities are uniform)."""
    return max(1, math.ceil(total_bytes / max(1, bucket_bytes)))


class BucketStore:
    """Arrow IPC bucket files under one directory, written batch by batch, read back one at a time."""

    def __init__(self, directory: Path, count: int):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.count = count
        self._writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}

    def path(self, bucket: int) -> Path:
        return self.directory / f"bucket-{bucket:05d}.arrow"

    def bucket_of(self, priority: np.ndarray) -> np.ndarray:
        """Bucket per priority: equal-width ranges of the 64-bit digest space, in ascending order."""
        return ((priority >> np.uint64(32)) * np.uint64(self.count)) >> np.uint64(32)

    def add(self, table: pa.Table) -> None:
        """Append rows (BUCKET_SCHEMA) to their buckets."""
        if not table.num_rows:
            return
        buckets = self.bucket_of(table.column("priority").to_numpy())
        order = np.argsort(buckets, kind="stable")
        table = table.take(pa.array(order))
        edges = np.searchsorted(buckets[order], np.arange(self.count + 1))
        for bucket in range(self.count):
            start, end = int(edges[bucket]), int(edges[bucket + 1])
            if end > start:
                self._writer(bucket).write_table(table.slice(start, end - start))

    def _writer(self, bucket: int) -> pa.ipc.RecordBatchStreamWriter:
        if bucket not in self._writers:
            self._writers[bucket] = pa.ipc.new_stream(str(self.path(bucket)), BUCKET_SCHEMA)
        return self._writers[bucket]

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    def read(self, bucket: int) -> pa.Table:
        """One bucket's rows, memory-mapped (pages load as they are used; nothing is copied)."""
        path = self.path(bucket)
        if not path.exists():
            return BUCKET_SCHEMA.empty_table()
        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_stream(source).read_all()

    def remove(self, bucket: int) -> None:
        self.path(bucket).unlink(missing_ok=True)


def shuffled_rows(table: pa.Table, split: np.ndarray) -> dict[int, np.ndarray]:
    """Positions in a bucket table of the drawn rows of each split code, in (priority, row) order."""
    rows = table.column("row").to_numpy()
    priority = table.column("priority").to_numpy()
    drawn = np.flatnonzero(split[rows] > 0)
    ordered = drawn[np.lexsort((rows[drawn], priority[drawn]))]
    codes = split[rows[ordered]]
    return {int(code): ordered[codes == code] for code in np.unique(codes)}
