"""Where training reads the target's hidden states: the plan (`train.hidden_states`, auto's choice and the byte count
behind it) and the streamed source, which asks the run's vLLM server for each batch's states while the batch before
it trains, so disk never holds more than a few batches (or, in `cache` mode, the budget).

Offline shards cost 8·H bytes per token (three aux states and the final state, bf16): 4.6 KB at the demo target's
H = 576, 57 KB at Kimi-K2.5's H = 7,168, so 57 GB per million tokens. Streaming trades that disk for engine time:
every epoch asks the engine again, unless the cache keeps what it can.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import shutil
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc
from safetensors.torch import save

from tasks.config import RunConfig
from tasks.extract.backend import RowStates
from tasks.extract.plan import read_merged, read_target_info
from tasks.extract.shards import StoredStates, bytes_per_token, decode_states, encode_states
from tasks.failpoints import failpoint
from tasks.stages import stage_dir
from tasks.storage import atomic_path

log = logging.getLogger(__name__)

GB = 10**9
STREAMED = ("stream", "cache")
HOW = {
    "offline": "from the extract stage's shards",
    "stream": "from the run's vLLM server, batch by batch",
    "cache": "from the run's vLLM server, keeping what the disk budget allows",
    "online": "from the target run inside training",
}


@dataclass(frozen=True)
class StatesPlan:
    """What training will read, and the offline bytes the choice was made on."""

    mode: str  # offline | stream | cache | online
    configured: str  # train.hidden_states as written (auto included)
    tokens: int  # merged tokens (train and eval splits: what extract stores)
    hidden_size: int
    storage_dtype: str
    offline_bytes: int  # the shards offline would write
    budget_bytes: int
    free_bytes: int  # free disk under the run directory, plus the shards already there

    @property
    def extracts(self) -> bool:
        return self.mode == "offline"

    def line(self) -> str:
        per_token = bytes_per_token(self.hidden_size, self.storage_dtype)
        need = (
            f"offline shards: {self.tokens:,} merged tokens × {per_token:,} B/token (H = {self.hidden_size:,},"
            f" {self.storage_dtype}) = {self.offline_bytes:,} B ({_size(self.offline_bytes)})"
        )
        room = f"disk budget {_size(self.budget_bytes)}, free {_size(self.free_bytes)}"
        if self.configured != "auto":
            return f"hidden states: {self.mode} (train.hidden_states); {need}; {room}"
        fits = "fit" if self.mode == "offline" else "do not fit"
        return f"hidden states: {self.mode} (auto: the shards {fits}); {need}; {room}"


def _size(n: int) -> str:
    for unit, scale in (("TB", 10**12), ("GB", GB), ("MB", 10**6)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1e3:.1f} kB"


def free_disk(path: Path) -> int:
    """Free bytes on the file system that holds `path` (or its nearest existing parent)."""
    path = Path(path).resolve()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def plan_hidden_states(config: RunConfig, hidden_size: int | None = None) -> StatesPlan:
    """`train.hidden_states`, with auto resolved: offline when the shards of every merged token fit both the disk
    budget and the free disk (shards already written count as room: they are what would be rewritten), else stream.
    `hidden_size` overrides the target's width (to plan for a larger model on the same rows)."""
    tc = config.train
    tokens = int(pc.sum(read_merged(config, ["num_tokens"]).column("num_tokens")).as_py() or 0)  # not the rows' ids
    width = hidden_size or read_target_info(config).hidden_size
    storage = config.extract.storage_dtype
    need = tokens * bytes_per_token(width, storage)
    shards = stage_dir(config, "extract")
    present = sum(p.stat().st_size for p in shards.glob("shard-*.safetensors")) if shards.exists() else 0
    free = free_disk(config.run_dir) + present
    budget = int(tc.disk_budget_gb * GB)
    mode = tc.hidden_states
    if mode == "auto":
        mode = "offline" if need <= min(budget, free) else "stream"
    return StatesPlan(mode, tc.hidden_states, tokens, width, storage, need, budget, free)


def _disk_full(error: OSError) -> bool:
    return error.errno in (errno.ENOSPC, errno.EDQUOT)


def _raise_disk_full() -> None:
    raise OSError(errno.ENOSPC, "No space left on device (failpoint)")


class StateCache:
    """Rows' states kept on disk within a byte budget, oldest evicted first (`cache` mode); one safetensors file per
    row in the storage dtype. The folder is cleared when what its states depend on changes. A full disk turns the
    cache off for the rest of the run (a warning; training goes on streaming)."""

    def __init__(self, directory: Path, budget_bytes: int, storage_dtype: str, settings: dict):
        self.directory, self.budget, self.storage_dtype = Path(directory), budget_bytes, storage_dtype
        stamp = self.directory / "settings.json"
        wanted = json.dumps(settings | {"storage_dtype": storage_dtype}, sort_keys=True)
        if not stamp.exists() or stamp.read_text(encoding="utf-8") != wanted:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory.mkdir(parents=True)
            stamp.write_text(wanted, encoding="utf-8")
        for leftover in self.directory.glob(".*"):  # a write cut off by a crash
            leftover.unlink()
        kept = sorted(self.directory.glob("*.safetensors"), key=lambda p: p.stat().st_mtime_ns)
        self.entries: OrderedDict[str, int] = OrderedDict((p.name, p.stat().st_size) for p in kept)
        self.full = False
        self.hits = self.evicted = 0

    @property
    def bytes(self) -> int:
        return sum(self.entries.values())

    @staticmethod
    def _name(row) -> str:
        """A row's file: named by its id and tokens, so a row merged anew under the same id never reads old states."""
        digest = hashlib.sha256(f"{row.id}\0{','.join(map(str, row.input_ids))}".encode())
        return digest.hexdigest()[:32] + ".safetensors"

    def has(self, row) -> bool:
        return self._name(row) in self.entries

    def get(self, row) -> dict | None:
        name = self._name(row)
        if name not in self.entries:
            return None
        self.hits += 1
        stored = StoredStates(self.directory / name)
        aux, final = stored.span(0, stored.tokens)
        return {"aux": aux, "final": final}

    def put(self, row, states: RowStates) -> dict:
        """Keep the row if the budget allows; returns its features as every epoch reads them (stored, then decoded)."""
        tensors = encode_states(states.aux, states.final, self.storage_dtype)
        data = save(tensors)  # the file's bytes, so the budget counts what the disk holds
        if not self.full and len(data) <= self.budget:
            while self.entries and self.bytes + len(data) > self.budget:
                oldest, _ = self.entries.popitem(last=False)
                (self.directory / oldest).unlink(missing_ok=True)
                self.evicted += 1
            self._write(self._name(row), data)
        return decode_states(tensors)

    def _write(self, name: str, data: bytes) -> None:
        try:
            with atomic_path(self.directory / name) as tmp:
                failpoint("train.cache.write", on_fire=_raise_disk_full)
                tmp.write_bytes(data)
        except OSError as error:
            if not _disk_full(error):
                raise
            self.full = True
            log.warning("cache: the disk is full (%s); the cache stops growing and training goes on streaming", error)
            return
        self.entries[name] = len(data)


@dataclass
class _Pending:
    indices: list[int]
    asked: dict[int, Future]  # row index -> the engine's file path


class StreamSource:
    """The rows of one merged split; their states come from the run's vLLM server as training asks for them.

    `start(upcoming)` takes the batches training will read, in order; the source keeps `train.prefetch_batches` of them
    asked ahead, and `features(indices)` (which must name the next one) waits for its files, reads them and deletes
    them. In cache mode rows kept by the cache are read from it and never asked."""

    def __init__(self, config: RunConfig, rows, cache: bool):
        from tasks.extract.vllm_backend import VllmBackend

        self.config, self.rows = config, rows
        self.store = stage_dir(config, "train") / "stream"
        shutil.rmtree(self.store, ignore_errors=True)  # a killed run's files: never read, asked again
        tc = config.train
        log_path = stage_dir(config, "train") / "engine.log"
        self.engine = VllmBackend(config, self.store, restarts=tc.engine_restarts, log=log_path)
        self.aux_layer_ids = self.engine.aux_layer_ids
        self.cache = None
        if cache:
            from tasks.extract.plan import extraction_settings

            settings = extraction_settings(config, self.engine.info)  # what the states' numbers depend on
            directory = stage_dir(config, "train") / "states-cache"
            self.cache = StateCache(directory, int(tc.disk_budget_gb * GB), config.extract.storage_dtype, settings)
        self.pool = ThreadPoolExecutor(config.vllm.concurrency)
        self.queue: deque[_Pending] = deque()
        self.upcoming: Iterator[list[int]] = iter(())
        self.asked_rows = self.asked_tokens = 0
        self.peak_files = self.peak_bytes = 0

    def start(self, upcoming: Iterable[list[int]]) -> None:
        self.upcoming = iter(upcoming)
        self._fill()

    def _fill(self) -> None:
        while len(self.queue) < self.config.train.prefetch_batches:
            indices = next(self.upcoming, None)
            if indices is None:
                return
            missing = [i for i in indices if self.cache is None or not self.cache.has(self.rows[i])]
            self.queue.append(_Pending(list(indices), {i: self._ask(i) for i in missing}))

    def _ask(self, i: int) -> Future:
        self.asked_rows += 1
        self.asked_tokens += len(self.rows[i].input_ids)
        return self.pool.submit(self.engine.ask, self.rows[i].input_ids)

    def features(self, indices: list[int]) -> list[dict]:
        if not self.queue or self.queue[0].indices != list(indices):
            raise RuntimeError(f"stream: training asked for rows {indices[:4]}… out of the planned order")
        pending = self.queue.popleft()
        paths = {i: future.result() for i, future in pending.asked.items()}
        self._measure()  # the most files on disk: this batch's and those asked ahead that are done
        out = {i: self._read(i, path) for i, path in paths.items()}
        for i in pending.indices:
            if i not in out:
                out[i] = self.cache.get(self.rows[i]) if self.cache else None
                if out[i] is None:  # evicted since it was planned: ask now
                    out[i] = self._read(i, self._ask(i).result())
        self._fill()
        return [out[i] for i in pending.indices]

    def _read(self, i: int, path: Path) -> dict:
        states = self.engine.states(path, self.rows[i].input_ids)  # the file is removed once read
        if self.cache is not None:
            return self.cache.put(self.rows[i], states)
        return {"aux": states.aux.float(), "final": states.final.float()}

    def _measure(self) -> None:
        """Sample the disk the states take: the engine's files not yet read, and the cache."""
        files = list(self.store.glob("*.safetensors"))
        size = sum(p.stat().st_size for p in files if p.exists()) + (self.cache.bytes if self.cache else 0)
        self.peak_files = max(self.peak_files, len(files))
        self.peak_bytes = max(self.peak_bytes, size)

    def report(self) -> dict:
        return {
            "hidden_states": "cache" if self.cache else "stream",
            "asked_rows": self.asked_rows,
            "asked_tokens": self.asked_tokens,
            "cache_hits": self.cache.hits if self.cache else 0,
            "cache_evicted": self.cache.evicted if self.cache else 0,
            "cache_full": self.cache.full if self.cache else False,
            "peak_files": self.peak_files,
            "peak_bytes": self.peak_bytes,
            "engine_busy_s": round(self.engine.busy_s, 3),
            "engine_restarts": self.engine.restarts,
        }

    def close(self) -> None:
        for pending in self.queue:
            for future in pending.asked.values():
                future.cancel()
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.engine.close()
        shutil.rmtree(self.store, ignore_errors=True)
