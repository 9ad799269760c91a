"""Reconstruct stage: generations/part-* -> reconstructed/part-* by row-range shards, resumable."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from prefect import task

from tasks.completions import file_fingerprint, fingerprint
from tasks.config import RunConfig
from tasks.contracts import COUNT_VERDICTS, REPLY_COUNT_MISMATCH, UNCOUNTED, schema
from tasks.gates import enforce
from tasks.reconstruct.counts import count_policy, recount_rows
from tasks.reconstruct.engine_scoring import guided_search, stop_engines
from tasks.reconstruct.guided import guide_table, guided_runs, text_methods
from tasks.reconstruct.rebuild import rebuild_rows
from tasks.sharded import Shard, ShardedStage
from tasks.stages import stage_dir
from tasks.storage import read_table, write_table
from tasks.target_model.chat import resolve_end_of_turn
from tasks.target_model.loader import load_tokenizer, model_placement

GATE_COLUMNS = ["id", "num_tokens", "num_trained", "last_trained_id", "round_trip", "finish_reason", "count_verdict"]


def plan_shards(config: RunConfig) -> list[Shard]:
    """One shard per `shard_rows` rows of each generations part; output names follow the input names.

    A shard's outputs depend on its input file and slice, the target and the rebuild options.
    """
    size = config.reconstruct.shard_rows
    options = config.reconstruct.model_dump(mode="json", include={"echoed_reasoning"}) | {"methods": text_methods(config)}
    if guided_runs(config):  # the re-split depends on its settings and on the model's numerics
        options |= {"guided": config.reconstruct.guided.model_dump(mode="json"), "placement": model_placement(config.compute)}
    target = config.target.model_dump(mode="json")
    shards = []
    for path in sorted(stage_dir(config, "generate").glob("part-*.parquet")):
        rows = pq.ParquetFile(path).metadata.num_rows
        for k in range(math.ceil(rows / size)):
            start, stop = k * size, min(rows, (k + 1) * size)
            name = f"{path.stem}-{k:04d}.parquet"
            key = fingerprint(file_fingerprint(path), start, stop, target, options)
            shards.append(Shard(name, str(path), (name, f"quarantine-{name}"), key, start, stop))
    return shards


def build_shard(config: RunConfig, shard: Shard) -> dict:
    """Rebuild one shard's rows: the reconstructed rows and the quarantined ones, as two files."""
    tokenizer = load_tokenizer(config.target)
    rows = read_table("generations", Path(shard.source)).slice(shard.start, shard.stop - shard.start).to_pylist()
    methods = config.reconstruct.model_copy(update={"methods": text_methods(config)})
    conventions = config.generate.count_convention
    result = rebuild_rows(tokenizer, rows, config.target, methods, conventions, whitespace_scorer(config))
    table, guided, changed = result.table, None, set()
    if guided_runs(config):
        search = guided_search(config, tokenizer, stage_dir(config, "reconstruct"))
        table, guided, changed = guide_table(search, tokenizer, table, result.end_of_turn, config.reconstruct.guided)
    rebuilt = table.to_pylist()
    recount_rows(rebuilt, changed, tokenizer, result.spans, lambda source: conventions(source).reasoning_markers)
    rebuilt, refused = count_policy(rebuilt, config.reconstruct.count_mismatch, "reconstruct")
    out = stage_dir(config, "reconstruct")
    output, quarantine = shard.outputs
    write_table("quarantine", result.quarantine + refused, out / quarantine)
    write_table("reconstructed", pa.Table.from_pylist(rebuilt, schema=table.schema), out / output)
    return {"rows": len(rebuilt), "quarantined": len(result.quarantine) + len(refused), "guided": guided}


def whitespace_scorer(config: RunConfig):
    """The target's likelihood for whitespace restorations, where guided runs it in this process (None elsewhere)."""
    if not guided_runs(config) or config.reconstruct.guided.backend != "transformers":
        return None
    from tasks.reconstruct.whitespace import likelihood
    from tasks.target_model.loader import model_placement, shared_model

    # Loaded when a restoration is first weighed (shared with guided's search, so once per process).
    return lambda prompt, replies: likelihood(shared_model(config.target, *model_placement(config.compute)))(prompt, replies)


def collect_quarantine(config: RunConfig, shards: list[Shard]) -> tuple[Path, int]:
    """Concatenate the shards' quarantine records into reconstructed/quarantine.parquet."""
    out = stage_dir(config, "reconstruct")
    tables = [pq.read_table(out / s.outputs[1]) for s in shards if (out / s.outputs[1]).exists()]
    table = pa.concat_tables(tables) if tables else schema("quarantine").empty_table()
    path = write_table("quarantine", table, stage_dir(config, "reconstruct") / "quarantine.parquet")
    return path, table.num_rows


def gate_frame(config: RunConfig) -> pd.DataFrame:
    """Scalar columns of the reconstructed table for the `reconstructed` suite; `count_masked` marks the rows kept with
    their loss mask off (reconstruct.count_mismatch: mask), which train nothing by design."""
    frame = read_table("reconstructed", stage_dir(config, "reconstruct"), columns=GATE_COLUMNS).to_pandas()
    masking = config.reconstruct.count_mismatch == "mask"
    frame["count_masked"] = masking & (frame.pop("count_verdict") == REPLY_COUNT_MISMATCH) & (frame["num_trained"] == 0)
    return frame


def gate_parameters(config: RunConfig) -> dict:
    tokenizer = load_tokenizer(config.target)
    end_of_turn = resolve_end_of_turn(tokenizer, config.target)
    return {"end_of_turn_ids": list(end_of_turn.ids), "max_length": config.target.max_length}


def summarize(config: RunConfig, shards: list[Shard], markers: list[dict]) -> dict:
    """Finish the stage: quarantine collected, counts by method; an engine guided scored with is stopped."""
    stop_engines()
    quarantine_path, quarantined = collect_quarantine(config, shards)
    table = read_table("reconstructed", stage_dir(config, "reconstruct"), columns=["method", "origin", "count_verdict"])
    methods = table.column("method").to_pylist()
    origins = [o or "target" for o in table.column("origin").to_pylist()]
    verdicts = [v or UNCOUNTED for v in table.column("count_verdict").to_pylist()]
    return {
        "reconstructed": str(stage_dir(config, "reconstruct")),
        "quarantine": str(quarantine_path),
        "rows": sum(m["rows"] for m in markers),
        "quarantined": quarantined,
        "shards": len(shards),
        "shards_skipped": sum(m["skipped"] for m in markers),
        "methods": {m: methods.count(m) for m in sorted(set(methods))},
        "by_origin": {o: origins.count(o) for o in sorted(set(origins))},
        "count_verdicts": {v: verdicts.count(v) for v in COUNT_VERDICTS if v in verdicts},
        "guided": sum_guided([m.get("guided") for m in markers]),
    }


def sum_guided(parts: list[dict | None]) -> dict | None:
    """The guided re-split over every shard: rows, rows changed, edits, nats gained, tokens, seconds."""
    parts = [p for p in parts if p]
    if not parts:
        return None
    return {k: round(sum(p[k] for p in parts), 3) for k in parts[0]}


def summary_markdown(summary: dict) -> str:
    methods = ", ".join(f"{m}: {n}" for m, n in summary["methods"].items()) or "none"
    origins = ", ".join(f"{n} {o}" for o, n in summary.get("by_origin", {}).items())
    text = f"# Reconstruct\n\n{summary['rows']} rows rebuilt ({methods}; origin {origins or 'none'}); "
    text += f"{summary['quarantined']} quarantined.\n"
    if verdicts := summary.get("count_verdicts"):
        text += "\nThe provider's token counts against the rebuilt ids: "
        text += ", ".join(f"{n} {verdict}" for verdict, n in verdicts.items()) + ".\n"
    if g := summary.get("guided"):
        text += (
            f"\nGuided: {g['searched']} of {g['rows']} text-only rows searched, {g['changed']} re-split ({g['edits']} "
            f"edits, {g['nats']:.1f} nats gained); {g['to_count']} of {g['off_count']} rows off the provider's count "
            f"brought to it; {g['at_count_changed']} of {g['at_count']} rows already at their count re-split all the "
            f"same; {1000 * g['seconds'] / max(1, g['tokens']):.2f} s per 1,000 searched tokens.\n"
        )
    return text


@task(name="gate-reconstruct", persist_result=False)
def gate_task(config: RunConfig) -> int:
    """Gate the reconstructed table before validate and merge read it; returns the rows checked."""
    return enforce("reconstructed", gate_frame(config), parameters=gate_parameters(config)).rows


OUTPUTS = ("part-*.parquet", "quarantine-part-*.parquet")
RECONSTRUCT = ShardedStage("reconstruct", plan_shards, build_shard, summarize, summary_markdown, OUTPUTS)
TASKS = RECONSTRUCT.tasks()
