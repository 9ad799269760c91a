"""Stage records: what makes a rerun of the same config a no-op, and a changed input rerun downstream.

Each finished stage leaves `<run_dir>/<stage dir>/_stage.json` with a key (the stage's config
sections plus the output digests of the stages it reads, plus fingerprints of external inputs)
and a digest of its own outputs. A stage is current when its key is unchanged and its outputs
are exactly as it left them.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from tasks import __version__
from tasks.config import RunConfig
from tasks.stages import stage as stage_info
from tasks.stages import stage_dir
from tasks.storage import read_json, write_bytes_atomic

RECORD_NAME = "_stage.json"


def output_digest(directory: Path) -> str:
    """Digest of every output file's relative path, size and modification time (not the record)."""
    digest = hashlib.sha256()
    if directory.exists():
        for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != RECORD_NAME):
            stat = path.stat()
            digest.update(f"{path.relative_to(directory)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def external_inputs(config: RunConfig, stage: str) -> list[str]:
    """Fingerprints of files a stage reads from outside the run (prompt files, extra merge sources)."""
    paths: list[str] = []
    if stage == "generate":
        paths = [s.path for s in config.generate.sources]
    elif stage == "merge":
        paths = [str(s.path) for s in config.merge.sources if s.path is not None]
    prints = []
    for raw in paths:
        if raw.startswith("pypi:"):  # pinned by version and checksum
            prints.append(raw)
            continue
        path = Path(raw)
        if path.is_dir():
            prints.append(f"{raw}:{output_digest(path)}")
        elif path.exists():
            stat = path.stat()
            prints.append(f"{raw}:{stat.st_size}:{stat.st_mtime_ns}")
        else:
            prints.append(f"{raw}:missing")
    return prints


def stage_key(config: RunConfig, stage: str) -> str:
    """Hash of what the stage's result depends on."""
    sections, reads = stage_info(stage).sections, stage_info(stage).upstream
    payload = {
        "stage": stage,
        "version": __version__,
        "config": {s: getattr(config, s).model_dump(mode="json") for s in sections},
        "upstream": {u: output_digest(stage_dir(config, u)) for u in reads},
        "external": external_inputs(config, stage),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def load_record(config: RunConfig, stage: str) -> dict | None:
    return read_json(stage_dir(config, stage) / RECORD_NAME)


def current_summary(config: RunConfig, stage: str) -> dict | None:
    """The recorded summary when the stage is up to date, else None."""
    record = load_record(config, stage)
    if record is None or record.get("key") != stage_key(config, stage):
        return None
    if record.get("outputs") != output_digest(stage_dir(config, stage)):
        return None
    return record["summary"]


def save_record(config: RunConfig, stage: str, summary: dict, started: float) -> None:
    directory = stage_dir(config, stage)
    record = {
        "stage": stage,
        "key": stage_key(config, stage),
        "outputs": output_digest(directory),
        "summary": summary,
        "seconds": round(time.time() - started, 3),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_bytes_atomic(directory / RECORD_NAME, json.dumps(record, indent=2, default=str).encode())
