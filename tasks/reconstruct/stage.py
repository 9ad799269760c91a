"""Reconstruct stage: generations/part-* -> reconstructed/part-* by row-range shards, resumable."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from prefect import task

from tasks.completions import file_fingerprint, fingerprint, finished, mark_done, remove_stale_markers
from tasks.config import RunConfig
from tasks.contracts import schema
from tasks.failpoints import failpoint
from tasks.gates import enforce
from tasks.reconstruct.rebuild import rebuild_rows
from tasks.stages import stage_dir
from tasks.storage import read_table, write_table
from tasks.target.chat import resolve_end_of_turn
from tasks.target.loader import load_tokenizer

GATE_COLUMNS = ["id", "num_tokens", "num_trained", "last_trained_id", "round_trip", "finish_reason"]


@dataclass(frozen=True)
class Shard:
    """Rows [start, stop) of one generations file, and where their output goes."""

    source_file: str
    start: int
    stop: int
    output: str
    quarantine: str


def plan_shards(config: RunConfig) -> list[Shard]:
    """One shard per `shard_rows` rows of each generations part; output names follow the input names."""
    out = stage_dir(config, "reconstruct")
    shards = []
    for path in sorted(stage_dir(config, "generate").glob("part-*.parquet")):
        rows = pq.ParquetFile(path).metadata.num_rows
        for k in range(math.ceil(rows / config.reconstruct.shard_rows)):
            start = k * config.reconstruct.shard_rows
            name = f"{path.stem}-{k:04d}.parquet"
            shards.append(
                Shard(
                    str(path),
                    start,
                    min(rows, start + config.reconstruct.shard_rows),
                    str(out / name),
                    str(out / f"quarantine-{name}"),
                )
            )
    return shards


def shard_fingerprint(config: RunConfig, shard: Shard) -> str:
    """Everything a shard's outputs depend on: its input file and slice, the target, the rebuild options."""
    options = config.reconstruct.model_dump(mode="json", include={"methods", "echoed_reasoning"})
    return fingerprint(
        file_fingerprint(Path(shard.source_file)), shard.start, shard.stop, config.target.model_dump(mode="json"), options
    )


def reconstruct_shard(config: RunConfig, shard: Shard) -> dict:
    """Rebuild one shard (skipped when its completion marker matches); returns counts, never the rows."""
    out, name = stage_dir(config, "reconstruct"), Path(shard.output).name
    key = shard_fingerprint(config, shard)
    done = None if "reconstruct" in config.orchestration.force else finished(out, name, key)
    if done is not None:
        return {"output": shard.output, "rows": done["rows"], "quarantined": done["quarantined"], "skipped": True}
    tokenizer = load_tokenizer(config.target)
    rows = read_table("generations", Path(shard.source_file)).slice(shard.start, shard.stop - shard.start).to_pylist()
    result = rebuild_rows(tokenizer, rows, config.target, config.reconstruct)
    write_table("quarantine", result.quarantine, Path(shard.quarantine))
    write_table("reconstructed", result.table, Path(shard.output))
    counts = {"rows": result.table.num_rows, "quarantined": len(result.quarantine)}
    mark_done(out, name, key, [Path(shard.output), Path(shard.quarantine)], counts)
    failpoint("reconstruct.shard")
    return {"output": shard.output, **counts, "skipped": False}


def remove_stale(config: RunConfig, shards: list[Shard]) -> None:
    """Drop outputs of shards no longer planned (fewer generations, another shard size)."""
    keep = {Path(s.output).name for s in shards} | {Path(s.quarantine).name for s in shards}
    out = stage_dir(config, "reconstruct")
    for path in list(out.glob("part-*.parquet")) + list(out.glob("quarantine-part-*.parquet")):
        if path.name not in keep:
            path.unlink()
    remove_stale_markers(out, {Path(s.output).name for s in shards})


def collect_quarantine(config: RunConfig, shards: list[Shard]) -> tuple[Path, int]:
    """Concatenate the shards' quarantine records into reconstructed/quarantine.parquet."""
    tables = [pq.read_table(s.quarantine) for s in shards if Path(s.quarantine).exists()]
    table = pa.concat_tables(tables) if tables else schema("quarantine").empty_table()
    path = write_table("quarantine", table, stage_dir(config, "reconstruct") / "quarantine.parquet")
    return path, table.num_rows


def gate_frame(config: RunConfig) -> pd.DataFrame:
    """Scalar columns of the reconstructed table for the `reconstructed` suite."""
    return read_table("reconstructed", stage_dir(config, "reconstruct"), columns=GATE_COLUMNS).to_pandas()


def gate_parameters(config: RunConfig) -> dict:
    tokenizer = load_tokenizer(config.target)
    end_of_turn = resolve_end_of_turn(tokenizer, config.target)
    return {"end_of_turn_ids": list(end_of_turn.ids), "max_length": config.target.max_length}


def summarize(config: RunConfig, shards: list[Shard], results: list[dict]) -> dict:
    """Finish the stage: stale outputs removed, quarantine collected, counts by method."""
    remove_stale(config, shards)
    quarantine_path, quarantined = collect_quarantine(config, shards)
    methods = read_table("reconstructed", stage_dir(config, "reconstruct"), columns=["method"]).column("method").to_pylist()
    return {
        "reconstructed": str(stage_dir(config, "reconstruct")),
        "quarantine": str(quarantine_path),
        "rows": sum(r["rows"] for r in results),
        "quarantined": quarantined,
        "shards": len(shards),
        "shards_skipped": sum(r["skipped"] for r in results),
        "methods": {m: methods.count(m) for m in sorted(set(methods))},
    }


def run_reconstruct(config: RunConfig) -> dict:
    """The whole stage in-process, shard by shard (the flow runs the same shards as tasks and gates them)."""
    shards = plan_shards(config)
    return summarize(config, shards, [reconstruct_shard(config, s) for s in shards])


def summary_markdown(summary: dict) -> str:
    methods = ", ".join(f"{m}: {n}" for m, n in summary["methods"].items()) or "none"
    return f"# Reconstruct\n\n{summary['rows']} rows rebuilt ({methods}); {summary['quarantined']} quarantined.\n"


@task(name="reconstruct-finalize", persist_result=False)
def finalize_task(config: RunConfig, shards: list[Shard], results: list[dict]) -> dict:
    """Collect the shards' outputs and quarantine, and publish the summary."""
    from prefect.artifacts import create_markdown_artifact

    summary = summarize(config, shards, results)
    create_markdown_artifact(
        key="reconstruct-summary", markdown=summary_markdown(summary), description="Reconstruct stage summary"
    )
    return summary


@task(name="gate-reconstructed", persist_result=False)
def gate_task(config: RunConfig) -> int:
    """Gate the reconstructed table before validate and merge read it; returns the rows checked."""
    return enforce("reconstructed", gate_frame(config), parameters=gate_parameters(config)).rows


@task(name="reconstruct-shard", task_run_name="reconstruct-rows-{shard.start}-{shard.stop}", persist_result=False)
def reconstruct_shard_task(config: RunConfig, shard: Shard) -> dict:
    """One shard as a Prefect task; resume is by its completion marker, not a result cache."""
    return reconstruct_shard(config, shard)
