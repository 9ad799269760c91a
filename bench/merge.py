"""Merge benchmark: draftsmith's streaming merge vs a naive pandas merge on the same synthetic sources.

    .venv/bin/python bench/merge.py            # 1,000,000 rows
    .venv/bin/python bench/merge.py --quick    # 100,000 rows

Three sources with log-normal token counts (chat ~300, code ~600, tool ~150 tokens; int32 ids) and ~5%
duplicates (half exact sequence copies, half the same prompt in other case and spacing) are written once
with pyarrow in batches. Each merge then runs in its own subprocess so its peak RSS is its own.
The table lands in bench/results/merge.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.publish import Table, save  # noqa: E402

# name: (share of rows, median tokens, log-normal sigma)
SOURCES = {"chat": (0.5, 300, 0.6), "code": (0.3, 600, 0.5), "tool": (0.2, 150, 0.4)}
# Rows generated at once, and rows per input shard (the reconstruct stage's default shard size).
CHUNK_ROWS = 50_000
SHARD_ROWS = 5_000
VOCAB = 49_152
SEED = 0
EVAL_FRACTION = 0.05


def synth_shard(rng: np.random.Generator, start: int, rows: int) -> pa.Table:
    """One input shard: mixed sources, ~2.5% exact copies and ~2.5% prompt repeats of earlier rows."""
    names = list(SOURCES)
    source = rng.choice(len(names), size=rows, p=[SOURCES[n][0] for n in names])
    medians = np.array([SOURCES[n][1] for n in names])[source]
    sigmas = np.array([SOURCES[n][2] for n in names])[source]
    lengths = np.clip(rng.lognormal(np.log(medians), sigmas), 16, 4096).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = rng.integers(3, VOCAB, size=int(offsets[-1]), dtype=np.int32)
    prompt_len = (lengths * rng.uniform(0.2, 0.6, size=rows)).astype(np.int32)
    position = np.arange(offsets[-1], dtype=np.int32) - np.repeat(offsets[:-1], lengths)
    mask = (position >= np.repeat(prompt_len, lengths)).astype(np.int8)
    prompts = [f"{names[s]} prompt number {start + i} about topic {i % 97}" for i, s in enumerate(source.tolist())]

    order = np.arange(rows)
    copies = rng.choice(np.arange(1, rows), size=rows // 40, replace=False)
    order[copies] = (copies * rng.uniform(0, 1, size=len(copies))).astype(np.int64)  # an earlier row
    repeats = rng.choice(np.arange(1, rows), size=rows // 40, replace=False)
    for j in repeats.tolist():
        prompts[j] = "  " + prompts[int(j * 0.5)].upper().replace(" ", "   ")
    table = pa.table(
        {
            "source": pa.array([names[s] for s in source.tolist()]),
            "input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)),
            "loss_mask": pa.ListArray.from_arrays(pa.array(offsets), pa.array(mask)),
            "num_tokens": pa.array(lengths),
            "num_trained": pa.array(lengths - prompt_len),
            "prompt_text": pa.array(prompts),
        }
    ).take(pa.array(order))
    table = table.set_column(table.schema.get_field_index("prompt_text"), "prompt_text", pa.array(prompts))
    ids = pa.array([f"row-{start + i:08d}" for i in range(rows)])
    last = pa.array(np.zeros(rows, dtype=np.int32))
    return pa.table(
        {
            "id": ids,
            "source": table["source"],
            "input_ids": table["input_ids"],
            "loss_mask": table["loss_mask"],
            "num_tokens": table["num_tokens"],
            "num_trained": table["num_trained"],
            "last_trained_id": last,
            "method": pa.array(["reencode"] * rows),
            "round_trip": pa.array(np.ones(rows, dtype=bool)),
            "finish_reason": pa.array(["stop"] * rows),
            "prompt_text": table["prompt_text"],
        }
    )


def generate(run_dir: Path, rows: int) -> None:
    from tasks.storage import write_table

    rng = np.random.default_rng(SEED)
    shard = 0
    for start in range(0, rows, CHUNK_ROWS):
        table = synth_shard(rng, start, min(CHUNK_ROWS, rows - start))
        for offset in range(0, table.num_rows, SHARD_ROWS):
            part = table.slice(offset, SHARD_ROWS)
            write_table("reconstructed", part, run_dir / "reconstructed" / f"part-{shard:05d}.parquet")
            shard += 1


def run_draftsmith(runs_dir: Path, budget_mb: int) -> dict:
    from tasks.config import ComputeConfig, MergeConfig, RunConfig
    from tasks.merge.stage import run_merge

    config = RunConfig(
        name="bench",
        runs_dir=runs_dir,
        merge=MergeConfig(eval_size=EVAL_FRACTION, memory_budget_mb=budget_mb),
        compute=ComputeConfig(seed=SEED),
    )
    summary = run_merge(config)
    return {"kept": summary["train_rows"] + summary["eval_rows"]}


def run_baseline(runs_dir: Path) -> dict:
    """The naive way: read everything into pandas, concat, drop_duplicates, sample, write."""
    import pandas as pd

    files = sorted((runs_dir / "bench" / "reconstructed").glob("part-*.parquet"))
    frame = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    frame = frame[(frame["finish_reason"] != "length") & (frame["num_trained"] > 0)]
    frame["prompt_key"] = frame["prompt_text"].str.normalize("NFKC").str.lower().str.split().str.join(" ")
    frame["sequence_key"] = frame["input_ids"].map(lambda ids: ids.tobytes())
    frame = frame.drop_duplicates("id").drop_duplicates("sequence_key").drop_duplicates("prompt_key")
    frame = frame.sample(frac=1.0, random_state=SEED)
    evaluation = frame.groupby("source").sample(frac=EVAL_FRACTION, random_state=SEED)
    train = frame.drop(evaluation.index)
    columns = ["id", "source", "input_ids", "loss_mask", "num_tokens", "num_trained"]
    out = runs_dir / "baseline-merged"
    out.mkdir(parents=True, exist_ok=True)
    train[columns].to_parquet(out / "train.parquet", compression="zstd", index=False)
    evaluation[columns].to_parquet(out / "eval.parquet", compression="zstd", index=False)
    return {"kept": len(train) + len(evaluation)}


def child(which: str, runs_dir: Path, budget_mb: int) -> None:
    """Run one merge in this process and print its timing and peak RSS as JSON."""
    start = time.perf_counter()
    result = run_draftsmith(runs_dir, budget_mb) if which == "draftsmith" else run_baseline(runs_dir)
    seconds = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    print(json.dumps(result | {"seconds": seconds, "peak_mib": peak_mib}))


def measure(which: str, runs_dir: Path, budget_mb: int) -> dict:
    cmd = [sys.executable, __file__, "--child", which, "--dir", str(runs_dir), "--budget-mb", str(budget_mb)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="100,000 rows")
    parser.add_argument("--budget-mb", type=int, default=512, help="draftsmith's merge.memory_budget_mb")
    parser.add_argument("--dir", type=Path, help="work directory (default: a temp dir, removed after)")
    parser.add_argument("--child", choices=["draftsmith", "baseline"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.dir, args.budget_mb)
        return

    rows = 100_000 if args.quick else args.rows
    work = args.dir or Path(tempfile.mkdtemp(prefix="draftsmith-bench-merge-"))
    try:
        started = time.perf_counter()
        generate(work / "bench", rows)
        generate_s = time.perf_counter() - started
        size = sum(f.stat().st_size for f in (work / "bench" / "reconstructed").glob("*.parquet"))
        print(f"generated {rows:,} rows ({size / 2**20:,.0f} MiB Parquet) in {generate_s:.0f} s")
        results = {
            "baseline (pandas)": measure("baseline", work, args.budget_mb),
            "draftsmith": measure("draftsmith", work, args.budget_mb),
        }
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    raw = {"rows": rows, "parquet_mib": size / 2**20, "generate_s": generate_s, "budget_mb": args.budget_mb}
    raw["results"] = results
    save("merge", [merge_table(raw)], raw=raw)


def merge_table(raw: dict) -> Table:
    """Each merge's rows kept, time, rows/s and peak memory, beside the pandas baseline's."""
    rows, results = raw["rows"], raw["results"]
    title = f"Merge of {rows:,} synthetic rows ({raw['parquet_mib']:,.0f} MiB Parquet)"
    table = Table(title, ["merge", "rows kept", "seconds", "rows/s", "peak RSS MiB", "speed vs baseline", "memory vs baseline"])
    base = results["baseline (pandas)"]
    for name, r in results.items():
        speed, memory = base["seconds"] / r["seconds"], r["peak_mib"] / base["peak_mib"]
        table.add(name, r["kept"], r["seconds"], rows / r["seconds"], r["peak_mib"], speed, memory)
    table.note = f"draftsmith's merge.memory_budget_mb: {raw['budget_mb']}."
    return table


if __name__ == "__main__":
    main()
