"""Validate stage: one `check` row per reconstructed row, `simulate` rows, per-source rates and a report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from prefect import task

from tasks.completions import file_fingerprint, fingerprint
from tasks.config import RunConfig
from tasks.contracts import COUNT_COLUMNS, UNCOUNTED
from tasks.gates import enforce
from tasks.reconstruct.counts import CountCheck, row_check
from tasks.reconstruct.engine_scoring import guided_search, stop_engines
from tasks.reconstruct.guided import GUIDED, guided_runs
from tasks.reconstruct.methods import truth_ids
from tasks.sharded import Shard, ShardedStage
from tasks.stages import stage_dir
from tasks.storage import atomic_path, read_table, write_table
from tasks.target_model.chat import resolve_end_of_turn
from tasks.target_model.loader import load_tokenizer, model_placement
from tasks.validate.classify import EXACT, UNVERIFIED, Verdict, classify_ids, through_turn_end
from tasks.validate.report import HINT_COLUMNS, SIMULATE, SIMULATE_GUIDED, convention_hints, rates_frame, report_markdown
from tasks.validate.simulate import GUIDED_STATS, replay_rows, simulate_guided

TRUTH_COLUMNS = [
    "id",
    "source",
    "messages",
    "tools",
    "finish_reason",
    "prompt_token_ids",
    "token_ids",
    "template_kwargs",
    "prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cached_tokens",
]


def _record(
    row_id: str, source: str, method: str, mode: str, verdict: Verdict, round_trip: bool, counts: CountCheck | None
) -> dict:
    counted = counts is not None and counts.verdict != UNCOUNTED
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
        "count_verdict": counts.verdict if counts is not None else None,
        "prompt_count_ok": counts.prompt_ok if counted else None,
        "reply_count_ok": counts.reply_ok if counted else None,
    }


def load_truth(config: RunConfig, ids: set[str]) -> dict[str, dict]:
    """Generations rows (prompt, ids) for the given ids, read column-wise from every generations part."""
    out = {}
    for path in sorted(stage_dir(config, "generate").glob("part-*.parquet")):
        table = read_table("generations", path, columns=TRUTH_COLUMNS)
        for row in table.to_pylist():
            if row["id"] in ids:
                out[row["id"]] = row
    return out


def with_logprob_truth(generation: dict, rebuilt: dict) -> dict:
    """A logprobs row's ids come from the model's own token stream: they serve as its truth for simulate."""
    ids, mask = np.asarray(rebuilt["input_ids"]), np.asarray(rebuilt["loss_mask"])
    trained = np.flatnonzero(mask)
    return {**generation, "prompt_token_ids": ids[: trained[0]].tolist(), "token_ids": ids[trained[0] : trained[-1] + 1].tolist()}


def build_part(config: RunConfig, part: Shard) -> dict:
    """Check (and simulate) the rows of one reconstructed part; writes validation/<same name>."""
    tokenizer = load_tokenizer(config.target)
    end_of_turn = resolve_end_of_turn(tokenizer, config.target)
    context = config.validation.context_tokens
    columns = ["id", "source", "input_ids", "loss_mask", "method", "round_trip", *COUNT_COLUMNS]
    rebuilt = read_table("reconstructed", Path(part.source), columns=columns)
    conventions = config.generate.count_convention
    truth_rows = load_truth(config, set(rebuilt.column("id").to_pylist()))
    records, playable = [], []
    for row in rebuilt.to_pylist():
        generation = truth_rows.get(row["id"])
        truth = truth_ids(generation, end_of_turn) if generation else None
        if row["method"] == "logprobs" and generation:
            verdict = Verdict(EXACT)  # the ids are the model's own tokens, checked against the text when rebuilt
            playable.append(with_logprob_truth(generation, row))
        elif truth is None:
            verdict = Verdict(UNVERIFIED)
        else:
            ids = through_turn_end(np.asarray(row["input_ids"]), np.asarray(row["loss_mask"]))
            verdict = classify_ids(tokenizer, truth, ids, context)
            playable.append(generation)
        counts = row_check(row) if row["count_verdict"] is not None else None
        records.append(_record(row["id"], row["source"], row["method"], "check", verdict, row["round_trip"], counts))
    guided = None
    if config.validation.simulate:
        replayed = replay_rows(tokenizer, playable, config.target, end_of_turn, conventions)
        for r in replayed:
            verdict = r.canonical(tokenizer, context)
            records.append(_record(r.row["id"], r.row["source"], "reencode", SIMULATE, verdict, True, r.counts))
        if guided_runs(config):
            search = guided_search(config, tokenizer, stage_dir(config, "validate"))
            cfg = config.reconstruct.guided
            verdicts, guided = simulate_guided(search, tokenizer, replayed, cfg, context, conventions)
            for row, verdict, counts in verdicts:
                records.append(_record(row["id"], row["source"], GUIDED, SIMULATE_GUIDED, verdict, True, counts))
    write_table("validation", records, stage_dir(config, "validate") / part.name)
    return {"rows": len(records), "guided": guided}


def guided_by_source(parts: list[dict | None]) -> dict[str, dict]:
    """Per source, the guided simulate figures summed over every part."""
    out: dict[str, dict] = {}
    for part in parts:
        for source, figures in (part or {}).items():
            mine = out.setdefault(source, dict.fromkeys(GUIDED_STATS, 0))
            for key in GUIDED_STATS:
                mine[key] += figures[key]
    return out


def plan_parts(config: RunConfig) -> list[Shard]:
    """One shard per reconstructed part. Its verdicts depend on it, on the generations (the truth), the
    target and the validation options."""
    truth = [file_fingerprint(p) for p in sorted(stage_dir(config, "generate").glob("part-*.parquet"))]
    options = config.validation.model_dump(mode="json", include={"context_tokens", "simulate"})
    if guided_runs(config):  # simulate also plays guided, with these settings
        options |= {"guided": config.reconstruct.guided.model_dump(mode="json"), "placement": model_placement(config.compute)}
    target = config.target.model_dump(mode="json")
    return [
        Shard(part.name, str(part), (part.name,), fingerprint(file_fingerprint(part), truth, target, options))
        for part in sorted(stage_dir(config, "reconstruct").glob("part-*.parquet"))
    ]


def summarize(config: RunConfig, parts: list[Shard], markers: list[dict]) -> dict:
    """Rates table and markdown report from every validation part; returns paths, counts and the report."""
    stop_engines()  # the engine simulate-guided scored with, if any
    rows = read_table("validation", stage_dir(config, "validate")).to_pandas()
    rates = rates_frame(rows)
    rates_path = stage_dir(config, "validate") / "rates.parquet"
    with atomic_path(rates_path) as tmp:
        rates.to_parquet(tmp, index=False)
    guided = guided_by_source([m.get("guided") for m in markers])
    hints = convention_hints(read_table("reconstructed", stage_dir(config, "reconstruct"), columns=HINT_COLUMNS).to_pandas())
    report_path = stage_dir(config, "validate") / "report.md"
    with atomic_path(report_path) as tmp:
        text = report_markdown(rates, rows, config.validation.examples, guided, borrowed_sources(config), hints)
        tmp.write_text(text, encoding="utf-8")
    check = rates[rates["mode"] == "check"]
    return {
        "validation": str(stage_dir(config, "validate")),
        "rates": str(rates_path),
        "report": str(report_path),
        "rows": int(check["rows"].sum()),
        "classes": {k: int(check[k].sum()) for k in ("exact", "bpe_only", "semantic", "unverified")},
    }


def borrowed_sources(config: RunConfig) -> set[str]:
    """Sources of a dataset's own replies (`replies: dataset`)."""
    return {s.name for s in config.generate.sources if s.replies == "dataset"}


def gate_frame(config: RunConfig) -> pd.DataFrame:
    """One row per source for the `validation` suite: check rates, simulate rates and the verified share.

    A text-only source has no check truth; its simulate rates (the rebuild error of its own format with the
    configured text method, measured on its verified rows) and `verified_share` are what gate it. A source of a
    dataset's own replies (`origin` dataset) has no target tokens to verify: the verified share is not asked of it.
    """
    rates = pd.read_parquet(stage_dir(config, "validate") / "rates.parquet")
    check = rates[rates["mode"] == "check"].set_index("source")
    text_mode = SIMULATE_GUIDED if guided_runs(config) else SIMULATE  # what text-only rows get
    simulate = rates[rates["mode"] == text_mode].set_index("source").reindex(check.index)
    borrowed = borrowed_sources(config)
    frame = pd.DataFrame(
        {
            "source": check.index,
            "origin": ["dataset" if name in borrowed else "target" for name in check.index],
            "rows": check["rows"].to_numpy(),
            "verified_share": (check["verified"] / check["rows"].where(check["rows"] > 0, 1)).to_numpy(dtype="float64"),
            "semantic_rate": check["semantic_rate"].to_numpy(),
            "bpe_only_rate": check["bpe_only_rate"].to_numpy(),
            "simulate_semantic_rate": simulate["semantic_rate"].fillna(0.0).to_numpy(),
            "simulate_bpe_only_rate": simulate["bpe_only_rate"].fillna(0.0).to_numpy(),
            # Where nothing was counted, nothing contradicts the counts.
            "count_agreement": check["count_agreement"].fillna(1.0).to_numpy(dtype="float64"),
            "text_count_verified": check["text_count_verified"].fillna(1.0).to_numpy(dtype="float64"),
            "prompt_mismatch_rate": check["prompt_mismatch_rate"].fillna(0.0).to_numpy(dtype="float64"),
        }
    )
    return frame.reset_index(drop=True)


def gate_parameters(config: RunConfig) -> dict:
    v = config.validation
    return {
        "max_semantic_rate": v.max_semantic_rate,
        "max_bpe_only_rate": v.max_bpe_only_rate,
        "max_simulate_semantic_rate": v.max_simulate_semantic_rate,
        "max_simulate_bpe_only_rate": v.max_simulate_bpe_only_rate,
        "min_verified_share": v.min_verified_share,
        "min_count_agreement": v.min_count_agreement,
        "min_count_verified_share": v.min_count_verified_share,
        "max_prompt_mismatch_rate": v.max_prompt_mismatch_rate,
    }


@task(name="gate-validate", persist_result=False)
def gate_task(config: RunConfig) -> int:
    """Gate each source's check and simulate rates and its verified share; returns the sources checked."""
    return enforce("validation", gate_frame(config), id_column="source", parameters=gate_parameters(config)).rows


def report(summary: dict) -> str:
    return Path(summary["report"]).read_text(encoding="utf-8")


VALIDATE = ShardedStage("validate", plan_parts, build_part, summarize, report, ("part-*.parquet",))
TASKS = VALIDATE.tasks()
