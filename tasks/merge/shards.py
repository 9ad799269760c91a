"""Fixed-size Parquet shards of the `merged` contract, written in row order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from tasks.storage import write_table


class ShardWriter:
    """Buffers rows and writes `part-NNNNN.parquet` every `rows_per_shard` rows (the last may be short)."""

    def __init__(self, directory: Path, rows_per_shard: int):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.rows_per_shard = rows_per_shard
        self.files: list[str] = []
        self.rows = 0
        self._pending: list[pa.Table] = []
        self._pending_rows = 0

    def add(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        self._pending.append(table)
        self._pending_rows += table.num_rows
        while self._pending_rows >= self.rows_per_shard:
            buffered = pa.concat_tables(self._pending)
            self._write(buffered.slice(0, self.rows_per_shard))
            rest = buffered.slice(self.rows_per_shard)
            # A slice pins its parent's buffers; copy the short remainder so the parent can go.
            rest = rest.take(pa.array(np.arange(rest.num_rows))) if rest.num_rows else rest
            self._pending, self._pending_rows = ([rest] if rest.num_rows else []), rest.num_rows

    def close(self) -> list[str]:
        """Write the last partial shard; returns the shard file names in order."""
        if self._pending_rows:
            self._write(pa.concat_tables(self._pending))
            self._pending, self._pending_rows = [], 0
        return self.files

    def _write(self, table: pa.Table) -> None:
        # One contiguous chunk per column: page boundaries, hence bytes, then depend only on the rows.
        name = f"part-{len(self.files):05d}.parquet"
        write_table("merged", table.combine_chunks(), self.directory / name)
        self.files.append(name)
        self.rows += table.num_rows
