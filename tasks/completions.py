"""Completion markers: the one resume rule of every sharded stage (reconstruct, validate, extract).

A shard is done when `<stage dir>/completions/<name>.json` exists, names the same input fingerprint
(everything the shard's bytes depend on: its input files, its slice, the config sections it reads),
and every output it lists is on disk with the recorded size. The marker is written after the outputs,
atomically, so a crash between them leaves the shard to be redone, never half-trusted.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tasks.storage import read_json, write_bytes_atomic

COMPLETIONS = "completions"


def file_fingerprint(path: Path) -> str:
    """A file as an input: its name, size and modification time (rewriting it changes the fingerprint)."""
    stat = Path(path).stat()
    return f"{Path(path).name}:{stat.st_size}:{stat.st_mtime_ns}"


def fingerprint(*parts) -> str:
    """Hash of JSON-able parts (file fingerprints, slices, config sections)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def marker_path(directory: Path, name: str) -> Path:
    return Path(directory) / COMPLETIONS / (Path(name).stem + ".json")


def mark_done(directory: Path, name: str, input_fingerprint: str, outputs: list[Path], record: dict) -> dict:
    """Record that shard `name` finished for this input; `outputs` are checked by size when resuming."""
    marker = {**record, "fingerprint": input_fingerprint, "outputs": {Path(p).name: Path(p).stat().st_size for p in outputs}}
    write_bytes_atomic(marker_path(directory, name), json.dumps(marker, indent=1, sort_keys=True).encode())
    return marker


def finished(directory: Path, name: str, input_fingerprint: str) -> dict | None:
    """The shard's marker when it is complete for exactly this input, else None (to be redone)."""
    marker = read_json(marker_path(directory, name))
    if marker is None or marker.get("fingerprint") != input_fingerprint:
        return None
    for output, size in (marker.get("outputs") or {}).items():
        path = Path(directory) / output
        if not path.exists() or path.stat().st_size != size:
            return None
    return marker


def remove_stale_markers(directory: Path, keep: set[str]) -> None:
    """Drop markers of shards no longer planned, and temp files of killed marker writes."""
    folder = Path(directory) / COMPLETIONS
    keep_stems = {Path(n).stem for n in keep}
    for path in sorted(folder.glob("*.json")):
        if path.stem not in keep_stems:
            path.unlink()
    for path in sorted(folder.glob(".*.tmp")):
        path.unlink(missing_ok=True)
