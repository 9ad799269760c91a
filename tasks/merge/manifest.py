"""The merge manifest: what went in (hashes, config), what came out (counts, mix, drops), and the
fingerprint that makes an unchanged rerun a no-op.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path

import tasks
from tasks.config import MergeConfig, MergeSourceConfig
from tasks.storage import fsync_dir, write_bytes_atomic

MANIFEST = "manifest.json"
QUARANTINE = "quarantine.parquet"
# Settings that change how the merge runs but never what it writes.
OUTPUT_NEUTRAL = {"memory_budget_mb", "share_tolerance"}


def config_hash(merge: MergeConfig, seed: int, sources: list[MergeSourceConfig]) -> str:
    """sha256 of everything that decides the output: the merge settings and seed, resolved sources, version."""
    settings = merge.model_dump(mode="json", exclude=OUTPUT_NEUTRAL | {"sources"}) | {"seed": seed}
    payload = {
        "settings": settings,
        "sources": [s.model_dump(mode="json") for s in sources],
        "draftsmith": tasks.__version__,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def fingerprint(config_digest: str, inputs: list[dict]) -> str:
    """One hash over the config hash and every input file's content hash."""
    payload = json.dumps({"config": config_digest, "inputs": inputs}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def read_manifest(directory: Path) -> dict | None:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return None


def is_current(manifest: dict | None, directory: Path, key: str) -> bool:
    """True when `directory` already holds the output of these inputs and config, every file present."""
    if manifest is None or manifest.get("fingerprint") != key:
        return False
    directory = Path(directory)
    files = [directory / QUARANTINE]
    for split, entry in manifest.get("splits", {}).items():
        files += [directory / split / name for name in entry.get("shards", [])]
    return all(f.is_file() for f in files)


def write_manifest(directory: Path, manifest: dict) -> Path:
    path = Path(directory) / MANIFEST
    write_bytes_atomic(path, (json.dumps(manifest, indent=2) + "\n").encode())
    return path


def staging_prefix(target: Path) -> str:
    return f".{Path(target).name}."


def clear_staging(target: Path) -> None:
    """Remove half-built directories a crashed run left beside `target` (never the live output)."""
    target = Path(target)
    if target.parent.is_dir():
        for leftover in target.parent.glob(staging_prefix(target) + "*"):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)


def publish_directory(staging: Path, target: Path) -> None:
    """Swap a fully built `staging` directory into `target` by rename; the old output is removed after."""
    staging, target = Path(staging), Path(target)
    retired = None
    if target.exists():
        retired = target.with_name(f"{staging_prefix(target)}old-{uuid.uuid4().hex[:8]}")
        os.rename(target, retired)
    os.rename(staging, target)
    fsync_dir(target.parent)
    if retired is not None:
        shutil.rmtree(retired, ignore_errors=True)
