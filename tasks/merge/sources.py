"""Resolve merge sources to input directories, route rows to sources, and fingerprint the inputs."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.config import MergeSourceConfig, RunConfig
from tasks.contracts import ContractError, schema
from tasks.merge.hashing import hash_strings
from tasks.stages import stage_dir

CLASSES = ("exact", "bpe_only", "semantic", "unverified")
UNVERIFIED = CLASSES.index("unverified")


class MergeInputError(ValueError):
    """A merge source that cannot be read or routed; the message names the source and path."""


@dataclass
class InputDir:
    """One reconstructed/ directory and the sources whose rows it holds."""

    path: Path
    files: list[Path]
    # Row label in the `source` column -> index into the run's source list.
    routes: dict[str, int] = field(default_factory=dict)
    # Index of the one source that takes every row regardless of label, or None.
    take_all: int | None = None

    @property
    def validation_dir(self) -> Path:
        return self.path.parent / "validation"

    def validation_files(self) -> list[Path]:
        return sorted(self.validation_dir.glob("part-*.parquet")) if self.validation_dir.is_dir() else []


def list_shards(path: Path) -> list[Path]:
    """`part-*.parquet` shards of a table directory (or the file itself)."""
    path = Path(path)
    if path.is_dir():
        return sorted(path.glob("part-*.parquet"))
    if path.is_file():
        return [path]
    raise MergeInputError(f"reconstructed input {path} does not exist")


def source_labels(files: list[Path]) -> list[str]:
    """Distinct `source` values across shards, sorted, reading only that column."""
    labels: set[str] = set()
    for f in files:
        column = pq.ParquetFile(f).read(columns=["source"]).column("source")
        labels.update(v for v in pc.unique(column).to_pylist() if v is not None)
    return sorted(labels)


def resolve_sources(config: RunConfig) -> tuple[list[MergeSourceConfig], list[InputDir]]:
    """The configured sources (or every source of this run's reconstruct output) and their directories."""
    own = stage_dir(config, "reconstruct")
    sources = list(config.merge.sources)
    if not sources:
        sources = [MergeSourceConfig(name=label) for label in source_labels(list_shards(own))]
    dirs: dict[Path, InputDir] = {}
    for index, source in enumerate(sources):
        path = Path(source.path) if source.path is not None else own
        if path not in dirs:
            dirs[path] = InputDir(path=path, files=list_shards(path))
        dirs[path].routes[source.name] = index
    for entry in dirs.values():
        _route_unlabelled(entry, sources)
    return sources, list(dirs.values())


def _route_unlabelled(entry: InputDir, sources: list[MergeSourceConfig]) -> None:
    """A source named differently from the only label in its directory takes every row of it."""
    labels = source_labels(entry.files)
    missing = [name for name in entry.routes if name not in labels]
    if not missing:
        return
    if len(missing) == 1 and len(entry.routes) == 1 and len(labels) <= 1:
        entry.take_all = entry.routes[missing[0]]
        return
    raise MergeInputError(
        f"merge source(s) {missing}: no rows with that source name in {entry.path}; "
        f"it holds {labels} (name one of them, or point the source at a directory with one source)"
    )


def route_rows(entry: InputDir, labels: pa.Array) -> np.ndarray:
    """Source index per row (-1 for rows no configured source asked for)."""
    if entry.take_all is not None:
        return np.full(len(labels), entry.take_all, dtype=np.int16)
    names = list(entry.routes)
    positions = pc.index_in(labels, value_set=pa.array(names, type=pa.string())).to_numpy(zero_copy_only=False)
    lookup = np.array([entry.routes[n] for n in names] + [-1], dtype=np.int16)
    positions = np.where(np.isnan(positions.astype(float)), len(names), positions).astype(np.int64)
    return lookup[positions]


class ClassIndex:
    """Validation class per row id (one `check` row per id), as sorted 64-bit id digests."""

    def __init__(self, files: list[Path]):
        digests, codes = [], []
        want = schema("validation")
        for f in files:
            parquet = pq.ParquetFile(f)
            for name in ("id", "mode", "klass"):
                if name not in parquet.schema_arrow.names:
                    raise ContractError(f"table 'validation': {f}: missing column {name!r}")
            for batch in parquet.iter_batches(columns=["id", "mode", "klass"], batch_size=65_536):
                batch = batch.filter(pc.equal(batch.column("mode"), "check"))
                klass = batch.column("klass").cast(want.field("klass").type)
                code = pc.index_in(klass, value_set=pa.array(CLASSES)).to_numpy(zero_copy_only=False)
                code = np.where(np.isnan(code.astype(float)), UNVERIFIED, code).astype(np.uint8)
                digests.append(hash_strings(batch.column("id")))
                codes.append(code)
        keys = np.concatenate(digests) if digests else np.empty(0, np.uint64)
        values = np.concatenate(codes) if codes else np.empty(0, np.uint8)
        order = np.argsort(keys, kind="stable")
        keys, values = keys[order], values[order]
        first = np.ones(len(keys), dtype=bool)
        first[1:] = keys[1:] != keys[:-1]  # the first check row per id counts
        self.keys, self.codes = keys[first], values[first]

    def lookup(self, id_digests: np.ndarray) -> np.ndarray:
        """Class code per id digest; ids without a check row are unverified."""
        if not len(self.keys):
            return np.full(len(id_digests), UNVERIFIED, dtype=np.uint8)
        at = np.minimum(np.searchsorted(self.keys, id_digests), len(self.keys) - 1)
        return np.where(self.keys[at] == id_digests, self.codes[at], UNVERIFIED).astype(np.uint8)


def file_digest(path: Path) -> dict:
    """Name, size and sha256 of one input file."""
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    return {"file": path.name, "bytes": path.stat().st_size, "sha256": digest}


def fingerprint_inputs(dirs: list[InputDir]) -> list[dict]:
    """Content hashes of every reconstructed and validation shard, per input directory."""
    return [
        {
            "path": str(entry.path),
            "reconstructed": [file_digest(f) for f in entry.files],
            "validation": [file_digest(f) for f in entry.validation_files()],
        }
        for entry in dirs
    ]
