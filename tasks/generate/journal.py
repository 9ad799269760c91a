"""The durable journal: one JSON line per finished request, fsynced in small batches.

A reply counts as done only once its line is on disk. A rerun reads the journal, drops a torn last
line (a kill mid-write), truncates the file back to the last whole line, and skips every id in it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from tasks.failpoints import failpoint

log = logging.getLogger(__name__)


@dataclass
class JournalState:
    """What a journal already holds: finished records by id and failures that will not be retried."""

    done: dict[str, dict] = field(default_factory=dict)
    failed: dict[str, dict] = field(default_factory=dict)
    torn_lines: int = 0
    duplicate_lines: int = 0

    @property
    def settled(self) -> set[str]:
        """Ids a rerun must never ask for again."""
        return set(self.done) | {i for i, r in self.failed.items() if not r.get("retryable")}


def read_journal(path: Path, repair: bool = False) -> JournalState:
    """Parse the journal; with `repair`, cut a torn tail so later appends start on a fresh line."""
    state = JournalState()
    path = Path(path)
    if not path.exists():
        return state
    data = path.read_bytes()
    good_end = data.rfind(b"\n") + 1
    if good_end < len(data):
        state.torn_lines += 1
        log.warning("journal %s: dropped a torn last line (%d bytes)", path, len(data) - good_end)
    for number, line in enumerate(data[:good_end].splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            row_id = record["id"]
        except (ValueError, KeyError, TypeError):
            state.torn_lines += 1
            log.warning("journal %s:%d: unreadable line dropped", path, number)
            continue
        if record.get("status") == "done":
            if row_id in state.done:
                state.duplicate_lines += 1
                continue
            state.done[row_id] = record
            state.failed.pop(row_id, None)
        elif row_id not in state.done:
            state.failed[row_id] = record
    if repair and good_end < len(data):
        with open(path, "rb+") as f:
            f.truncate(good_end)
            os.fsync(f.fileno())
    return state


class JournalWriter:
    """Appends records; flushes and fsyncs every `batch` records or `max_delay_s` seconds."""

    def __init__(self, path: Path, batch: int = 8, max_delay_s: float = 0.5):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.batch = batch
        self.max_delay_s = max_delay_s
        self._file = open(self.path, "ab")
        self._pending = 0
        self._oldest = 0.0
        self.synced = 0

    def append(self, record: dict) -> None:
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
        self._file.write(line)
        if self._pending == 0:
            self._oldest = time.monotonic()
        self._pending += 1
        if self._pending >= self.batch:
            self.sync()

    def sync_if_due(self) -> None:
        """Sync a partial batch that has waited `max_delay_s` (called on a timer)."""
        if self._pending and time.monotonic() - self._oldest >= self.max_delay_s:
            self.sync()

    def sync(self) -> None:
        if not self._pending:
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        self.synced += self._pending
        self._pending = 0
        failpoint("generate.journal")

    def close(self) -> None:
        self.sync()
        self._file.close()

    def __enter__(self) -> JournalWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
