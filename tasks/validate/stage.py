"""Validate stage: one `check` row per reconstructed row, `simulate` rows, per-source rates and a report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
from prefect import task

from tasks.config import RunConfig
from tasks.contracts import atomic_path, read_table, write_table
from tasks.failpoints import failpoint
from tasks.reconstruct.methods import truth_ids
from tasks.reconstruct.tokens import resolve_end_of_turn
from tasks.target.loader import load_tokenizer
from tasks.validate.classify import UNVERIFIED, Verdict, classify_ids, through_turn_end
from tasks.validate.report import rates_frame, report_markdown
from tasks.validate.simulate import simulate_rows

STAGE_DIR = "validation"
TRUTH_COLUMNS = ["id", "source", "messages", "tools", "finish_reason", "prompt_token_ids", "token_ids"]


def out_dir(config: RunConfig) -> Path:
    return config.run_dir / STAGE_DIR


def _record(row_id: str, source: str, method: str, mode: str, verdict: Verdict, round_trip: bool) -> dict:
    return {
        "id": row_id,
        "source": source,
        "method": method,
        "mode": mode,
        "klass": verdict.klass,
        "first_divergence": verdict.first_divergence,
        "truth_context": verdict.truth_context,
        "rebuilt_context": verdict.rebuilt_context,
        "round_trip": round_trip,
    }


def load_truth(config: RunConfig, ids: set[str]) -> dict[str, dict]:
    """Generations rows (prompt, ids) for the given ids, read column-wise from every generations part."""
    out = {}
    for path in sorted((config.run_dir / "generations").glob("part-*.parquet")):
        table = read_table("generations", path, columns=TRUTH_COLUMNS)
        for row in table.to_pylist():
            if row["id"] in ids:
                out[row["id"]] = row
    return out


def validate_part(config: RunConfig, part: Path) -> dict:
    """Check (and simulate) the rows of one reconstructed part; writes validation/<same name>."""
    tokenizer = load_tokenizer(config.target)
    end_of_turn = resolve_end_of_turn(tokenizer, config.target.end_of_turn, config.target.chat_format)
    context = config.validation.context_tokens
    rebuilt = read_table("reconstructed", part, columns=["id", "source", "input_ids", "loss_mask", "method", "round_trip"])
    truth_rows = load_truth(config, set(rebuilt.column("id").to_pylist()))
    records = []
    for row in rebuilt.to_pylist():
        generation = truth_rows.get(row["id"])
        truth = truth_ids(generation, end_of_turn) if generation else None
        if truth is None:
            verdict = Verdict(UNVERIFIED)
        else:
            ids = through_turn_end(np.asarray(row["input_ids"]), np.asarray(row["loss_mask"]))
            verdict = classify_ids(tokenizer, truth, ids, context)
        records.append(_record(row["id"], row["source"], row["method"], "check", verdict, row["round_trip"]))
    if config.validation.simulate:
        for generation, verdict in simulate_rows(tokenizer, list(truth_rows.values()), config.target, end_of_turn, context):
            records.append(_record(generation["id"], generation["source"], "reencode", "simulate", verdict, True))
    output = out_dir(config) / part.name
    write_table("validation", records, output)
    failpoint("validate.part")
    return {"output": str(output), "rows": len(records)}


def remove_stale(config: RunConfig, parts: list[Path]) -> None:
    keep = {p.name for p in parts}
    for path in out_dir(config).glob("part-*.parquet"):
        if path.name not in keep:
            path.unlink()


def is_done(config: RunConfig, part: Path) -> bool:
    output = out_dir(config) / part.name
    forced = "validate" in config.orchestration.force or STAGE_DIR in config.orchestration.force
    return not forced and output.exists() and output.stat().st_mtime >= part.stat().st_mtime


def plan_parts(config: RunConfig) -> list[Path]:
    return sorted((config.run_dir / "reconstructed").glob("part-*.parquet"))


def summarize(config: RunConfig, parts: list[Path]) -> dict:
    """Rates table and markdown report from every validation part; returns paths, counts and the report."""
    remove_stale(config, parts)
    rows = read_table("validation", out_dir(config)).to_pandas()
    rates = rates_frame(rows)
    rates_path = out_dir(config) / "rates.parquet"
    with atomic_path(rates_path) as tmp:
        rates.to_parquet(tmp, index=False)
    markdown = report_markdown(rates, rows, config.validation.examples)
    report_path = out_dir(config) / "report.md"
    with atomic_path(report_path) as tmp:
        tmp.write_text(markdown, encoding="utf-8")
    check = rates[rates["mode"] == "check"]
    return {
        "validation": str(out_dir(config)),
        "rates": str(rates_path),
        "report": str(report_path),
        "rows": int(check["rows"].sum()),
        "classes": {k: int(check[k].sum()) for k in ("exact", "bpe_only", "semantic", "unverified")},
        "markdown": markdown,
    }


def gate_frame(config: RunConfig) -> pd.DataFrame:
    """Per-source scalar rates of the `check` rows (what the merge stage trusts) for the `validation` suite."""
    rates = pd.read_parquet(out_dir(config) / "rates.parquet")
    return rates[rates["mode"] == "check"][["source", "rows", "semantic_rate", "bpe_only_rate"]].reset_index(drop=True)


def gate_parameters(config: RunConfig) -> dict:
    return {
        "max_semantic_rate": config.validation.max_semantic_rate,
        "max_bpe_only_rate": config.validation.max_bpe_only_rate,
    }


def run_validate(config: RunConfig) -> dict:
    """The whole stage in-process, part by part (the flow runs the same parts as tasks and gates them)."""
    parts = plan_parts(config)
    for part in parts:
        if not is_done(config, part):
            validate_part(config, part)
    return summarize(config, parts)


@task(name="validate-part", task_run_name="validate-{part.name}", persist_result=False)
def validate_part_task(config: RunConfig, part: Path) -> dict:
    """One reconstructed part as a Prefect task; done parts are skipped by their output file."""
    if is_done(config, part):
        out = out_dir(config) / part.name
        return {"output": str(out), "rows": pq.ParquetFile(out).metadata.num_rows, "skipped": True}
    return validate_part(config, part)
