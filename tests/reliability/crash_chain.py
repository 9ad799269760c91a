"""The crash-and-resume runs: one uninterrupted pipeline, and one killed inside every stage in turn.

The uninterrupted run spreads its shards over a local Dask cluster (one worker process), the killed runs use the
default thread runner: equal outputs show both that a resumed run finishes what an uninterrupted one would, and
that the runner does not change what a run writes. The uninterrupted run is a plain `draftsmith run` process; the
killed and resumed ones are forked from a parent that imported what a run imports (tests/support/forked_cli.py),
each a process of its own that SIGKILL ends alone."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
import yaml

from tasks.failpoints import ENV as FAILPOINTS_ENV
from tests.pipeline_runs import ROOT, TINY
from tests.support.faults import CannedServer, canned_reply
from tests.support.forked_cli import ForkedCli

# (stage, failpoint placed after that stage's first durable unit of work)
CHAIN = [
    ("generate", "generate.journal"),
    ("reconstruct", "reconstruct.shard"),
    ("validate", "validate.shard"),
    ("merge", "merge.publish"),
    ("extract", "extract.shard"),
    ("train", "train.checkpoint"),
    ("evaluate", "evaluate.prompt"),
]
KEY_ENV = "DRAFTSMITH_RELIABILITY_KEY"
SENTINEL = "sk-draftsmith-SENTINEL-7f3a9c0e5d"
ROWS, JOURNAL_BATCH = 6, 2
# Values that measure time, not content: they differ between any two runs and are left out of the comparison.
TIMING_KEYS = {
    "latency_s",
    "latency_p50_s",
    "latency_p95_s",
    "server_queue_s",
    "server_queue_p50_s",
    "server_queue_p95_s",
    "server_s",
    "server_p50_s",
    "server_p95_s",
    "elapsed_s",
    "forward_seconds",
    "greedy_s",
    "speculative_s",
    "tokens_per_s",
    "greedy_tokens_per_s",
    "speculative_tokens_per_s",
    "seconds",
}
# How many rows this run asked for versus found in the journal: differs by design after a resume.
RUN_KEYS = {"requested_this_run", "from_journal"}
# Digests over the absolute paths of the stage's inputs, which differ between the two run directories.
PATH_KEYS = {"fingerprint"}
# Stage records hold when each stage ran and how long it took; the curves are drawn from metrics.jsonl, which is
# compared to a tolerance below (a 1e-8 difference can move a pixel).
SKIPPED_FILES = {"_stage.json", "curves.png", ".lock"}
# Training is not bit-reproducible between two processes (weights differ by ~1e-8 after two steps even with
# no kill), so the draft's tensors and metrics are compared to a tolerance instead of by hash.
NUMERIC_FILES = ("draft/checkpoints/", "draft/export/model.safetensors", "draft/metrics.jsonl")
RTOL, ATOL = 1e-4, 1e-6


def echo_reply(request: dict) -> dict:
    """A canned reply that differs per prompt and never changes between runs."""
    reply = canned_reply(request)
    last = request["messages"][-1].get("content") or ""
    reply["choices"][0]["message"]["content"] = f"Here is my answer to: {last[:60]}"
    return reply


def reliable_config(path: Path, base_url: str) -> Path:
    """The tiny config, smaller still, asking a canned local server (deterministic replies) with a key."""
    data = yaml.safe_load(TINY.read_text())
    gen = data["generate"]
    gen["sources"][0]["limit"], gen["sources"][1]["limit"] = 4, 2
    gen["journal_batch"] = JOURNAL_BATCH
    gen["api"] |= {"base_url": base_url, "provider": "openai", "concurrency": 1, "api_key_env": KEY_ENV}
    # Canned text replies carry no token ids, logprobs or counts: nothing can be verified, by design here.
    data["validation"]["min_verified_share"] = 0.0
    path.write_text(yaml.safe_dump(data))
    return path


# One worker process: every shard still crosses a process boundary through Dask, and the run pays one worker
# start-up (torch, transformers, the target) per sharded stage instead of two.
DASK = ["--set", "orchestration.task_runner=dask", "--set", "orchestration.max_workers=1"]


def cli_args(config: Path, runs_dir: Path) -> list[str]:
    return ["run", "--config", str(config), "--set", f"runs_dir={runs_dir}"]


def finished_stages(run_dir: Path) -> list[str]:
    from tasks.stage_record import RECORD_NAME
    from tasks.stages import BY_NAME

    return [s for s, _ in CHAIN if (run_dir / BY_NAME[s].out_dir / RECORD_NAME).exists()]


@dataclass
class KilledRun:
    stage: str
    returncode: int
    finished_before: list[str]
    journal_lines: int


@dataclass
class CrashRuns:
    """Everything the crash tests check, gathered once per module."""

    clean_dir: Path
    resumed_dir: Path
    runs_dir_names: tuple[str, str]
    clean_rc: int
    final_rc: int
    requests: dict[str, int]  # per prompt, over every run of the killed-and-resumed chain
    killed: list[KilledRun] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)


def run_crash_chain(root: Path, api_url: str) -> CrashRuns:
    clean_server, chain_server = CannedServer(reply=echo_reply).start(), CannedServer(reply=echo_reply).start()
    try:
        return _run_chain(root, api_url, clean_server, chain_server)
    finally:
        clean_server.stop()
        chain_server.stop()


def _run_chain(root: Path, api_url: str, clean_server: CannedServer, chain_server: CannedServer) -> CrashRuns:
    clean_config = reliable_config(root / "clean.yaml", clean_server.base_url)
    config = reliable_config(root / "reliable.yaml", chain_server.base_url)
    env = {KEY_ENV: SENTINEL, "PREFECT_API_URL": api_url}
    clean_log = root / "clean.log"
    with open(clean_log, "wb") as out:  # the uninterrupted run, alongside the killed ones
        clean = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", *cli_args(clean_config, root / "clean"), *DASK],
            cwd=ROOT,
            env=os.environ | env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    runs = CrashRuns(root / "clean" / "tiny", root / "resumed" / "tiny", (str(root / "clean"), str(root / "resumed")), 0, 0, {})
    runs.logs.append(clean_log)
    journal = runs.resumed_dir / "generations" / "journal.jsonl"
    with ForkedCli(env) as cli:
        for stage, point in CHAIN:
            log = root / f"killed-{stage}.log"
            returncode = cli.run(cli_args(config, root / "resumed"), log, {FAILPOINTS_ENV: f"{point}=kill"})
            runs.logs.append(log)
            lines = journal.read_bytes().count(b"\n") if journal.exists() else 0
            runs.killed.append(KilledRun(stage, returncode, finished_stages(runs.resumed_dir), lines))
        runs.final_rc = cli.run(cli_args(config, root / "resumed"), root / "final.log")
        runs.logs.append(root / "final.log")
    runs.clean_rc = clean.wait(timeout=900)
    runs.requests = dict(chain_server.requests)
    return runs


def _strip(value, runs_dir: str):
    if isinstance(value, dict):
        return {k: _strip(v, runs_dir) for k, v in value.items() if k not in TIMING_KEYS | RUN_KEYS | PATH_KEYS}
    if isinstance(value, list):
        return [_strip(v, runs_dir) for v in value]
    if isinstance(value, str):
        return value.replace(runs_dir, "<runs_dir>")
    return value


def content_digest(path: Path, runs_dir: str) -> str:
    """sha256 of a file's content with timing values dropped and the run's own directory replaced by a placeholder."""
    if path.suffix == ".parquet":
        table = pq.read_table(path)
        table = table.drop_columns([c for c in table.column_names if c in TIMING_KEYS])
        rows = json.dumps([str(table.schema), table.to_pylist()], sort_keys=True, default=repr)
        return hashlib.sha256(rows.replace(runs_dir, "<runs_dir>").encode()).hexdigest()
    if path.suffix in (".json", ".jsonl"):
        text = path.read_text(encoding="utf-8")
        docs = [json.loads(line) for line in text.splitlines() if line.strip()] if path.suffix == ".jsonl" else [json.loads(text)]
        return hashlib.sha256(json.dumps(_strip(docs, runs_dir), sort_keys=True).encode()).hexdigest()
    data = path.read_bytes()
    if path.suffix in (".yaml", ".md"):
        data = data.replace(runs_dir.encode(), b"<runs_dir>")
    return hashlib.sha256(data).hexdigest()


def output_digests(run_dir: Path, runs_dir: str) -> dict[str, str]:
    """Content digest of every output file, except the draft's numeric files (listed, compared by `numeric_mismatches`)."""
    digests = {}
    for path in sorted(run_dir.rglob("*")):
        relative = str(path.relative_to(run_dir))
        if path.is_file() and path.name not in SKIPPED_FILES:
            numeric = relative.startswith(NUMERIC_FILES)
            digests[relative] = "numeric" if numeric else content_digest(path, runs_dir)
    return digests


def _close(a, b, where: str) -> list[str]:
    import torch

    if isinstance(a, torch.Tensor):
        # A 16-bit export rounds: a 1e-8 difference in training can flip the last bit of a value.
        rtol = 1e-2 if a.dtype in (torch.bfloat16, torch.float16) else RTOL
        same = a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=rtol, atol=ATOL)
        return [] if same else [where]
    if isinstance(a, float):
        return [] if math.isclose(a, b, rel_tol=RTOL, abs_tol=ATOL) else [f"{where}: {a} != {b}"]
    if isinstance(a, dict):
        if set(a) != set(b):
            return [f"{where}: keys {sorted(set(a) ^ set(b))}"]
        return [m for k in a if k not in TIMING_KEYS for m in _close(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return [f"{where}: length {len(a)} != {len(b)}"]
        return [m for i, (x, y) in enumerate(zip(a, b, strict=True)) for m in _close(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def numeric_mismatches(clean_dir: Path, resumed_dir: Path) -> list[str]:
    """The draft's checkpoints, export and metrics, equal to a tolerance (the Python RNG state is per process)."""
    import torch
    from safetensors.torch import load_file

    found = []
    for path in sorted(clean_dir.rglob("*")):
        relative = str(path.relative_to(clean_dir))
        other = resumed_dir / relative
        if not relative.startswith(NUMERIC_FILES) or not path.is_file():
            continue
        if path.suffix == ".pt":
            a, b = (torch.load(p, map_location="cpu", weights_only=False) for p in (path, other))
            a["rng"].pop("python", None), b["rng"].pop("python", None)
        elif path.suffix == ".safetensors":
            a, b = load_file(path), load_file(other)
        else:
            a, b = ([json.loads(line) for line in p.read_text().splitlines() if line.strip()] for p in (path, other))
        found += _close(a, b, relative)
    return found
