"""Atomic file I/O for every stage, and the only way hand-off tables are read and written.

A reader never sees a half-written file; a full or read-only disk raises `StorageError` naming the path.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tasks.contracts import LATER_COLUMNS, ContractError, conform, schema, to_table


class StorageError(OSError):
    """A write that could not complete (read-only or full disk); no partial file is left behind."""


def fsync_dir(directory: Path) -> None:
    """Make a rename inside `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_json(path: Path) -> dict | None:
    """A small JSON record (marker, stage record), or None when it is missing or unreadable (torn)."""
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temp path beside `path`; on success fsync and rename it into place.

    A reader never sees a half-written file: it sees the old file, or none, or the whole new one.
    """
    path = Path(path)
    tmp_path: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp_path = Path(tmp)
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
        fsync_dir(path.parent)
    except OSError as e:
        if isinstance(e, StorageError):
            raise
        raise StorageError(e.errno, f"cannot write {path}: {e.strerror or e}") from e
    finally:
        if tmp_path is not None:
            try:
                tmp_path.unlink(missing_ok=True)
            except OSError:
                pass


def write_bytes_atomic(path: Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_table(name: str, table: pa.Table | list[dict], path: Path) -> Path:
    """Check `table` against contract `name` and write it atomically as Parquet."""
    if isinstance(table, list):
        table = to_table(name, table)
    table = conform(name, table)
    with atomic_path(Path(path)) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return Path(path)


def _read_file(name: str, path: Path, columns: list[str] | None) -> pa.Table:
    """One Parquet file; asked-for columns added to the contract after it was written come back null."""
    later = LATER_COLUMNS.get(name, set())
    if columns is None or not later & set(columns):
        return pq.read_table(path, columns=columns)
    present = set(pq.read_schema(path).names)
    table = pq.read_table(path, columns=[c for c in columns if c in present])
    for column in columns:
        if column not in present and column in later:
            table = table.append_column(column, pa.nulls(table.num_rows, schema(name).field(column).type))
    return table.select(columns)


def read_table(name: str, path: Path, columns: list[str] | None = None) -> pa.Table:
    """Read a Parquet file, or a directory's `part-*.parquet` shards, checked against contract `name`."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("part-*.parquet"))
        if not files:
            return schema(name).empty_table() if columns is None else schema(name).empty_table().select(columns)
        table = pa.concat_tables([_read_file(name, f, columns) for f in files])
    elif path.exists():
        table = _read_file(name, path, columns)
    else:
        raise ContractError(f"table {name!r}: {path} does not exist")
    if columns is None:
        return conform(name, table)
    want = schema(name)
    for col in columns:
        if col not in want.names:
            raise ContractError(f"table {name!r}: no column {col!r}")
        if not table.schema.field(col).type.equals(want.field(col).type):
            raise ContractError(
                f"table {name!r}: column {col!r} has type {table.schema.field(col).type}, expected {want.field(col).type}"
            )
    return table
