"""The generate stage: load prompts, ask the API for what the journal lacks, build the output from the journal."""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from prefect import task

from tasks.config import ApiConfig, RunConfig, UserError
from tasks.contracts import quarantine_row, schema
from tasks.failpoints import failpoint
from tasks.generate.client import ChatClient, dataset_record, has_reply
from tasks.generate.journal import JournalState, JournalWriter, read_journal
from tasks.generate.progress import GenerationProgress
from tasks.generate.runner import RunTally, run_requests
from tasks.generate.sources import STAGE, load_sources
from tasks.generate.summary import publish_summary, summarize, write_summary
from tasks.generate.turns import walk
from tasks.stages import stage_dir
from tasks.storage import write_table
from tasks.target_model.serve.embedded import embedded_server

log = logging.getLogger(__name__)
ROWS_PER_PART = 50_000
OUTPUT_FIELDS = schema("generations").names  # every contract column, read once rather than per row
NO_SOURCES = "a run that generates needs at least one prompt source (configs/demo.yaml has two)"


class MissingApiKeyError(UserError, RuntimeError):
    """No API key where the config says to find one (the message names where, never a value)."""


class NoRowsError(RuntimeError):
    """The run would end with an empty generations table: nothing is written, earlier outputs stay as they were."""


def why_no_rows(prompts: int, quarantine: list[dict]) -> str:
    """What became of every prompt, by reason, with a few row ids each."""
    reasons: dict[str, list[str]] = {}
    for q in quarantine:
        reasons.setdefault(q["reason"], []).append(q["id"])
    shown = "; ".join(f"{len(ids)} {reason} (e.g. {', '.join(map(str, ids[:3]))})" for reason, ids in sorted(reasons.items()))
    return f"{prompts} prompt(s) to answer, none answered" + (f"; refused: {shown}" if shown else "")


def missing_api_key(api: ApiConfig) -> str | None:
    """What is missing for the endpoint to get a key (None: nothing, or it needs none)."""
    needs_key = api.api_key_env and api.provider != "embedded"
    if needs_key and not os.environ.get(api.api_key_env) and not api.api_key_secret_block:
        return f"environment variable {api.api_key_env} is not set and no api_key_secret_block"
    return None


def resolve_api_key(api: ApiConfig) -> str | None:
    """The key from `api.api_key_env`, else the Prefect Secret block; None when neither is configured."""
    if api.api_key_env and os.environ.get(api.api_key_env):
        return os.environ[api.api_key_env]
    if api.api_key_secret_block:
        from prefect.blocks.system import Secret

        return Secret.load(api.api_key_secret_block).get()
    if missing := missing_api_key(api):
        raise MissingApiKeyError(missing)
    return None


def check_api_key(config: RunConfig, force: bool = False) -> None:
    """Before a run that generates starts: MissingApiKeyError, saying how to give the key, when the endpoint needs one
    and none is set, unless the generate stage is up to date (then it requests nothing; `force` reruns it)."""
    from tasks.stage_record import current_summary

    api = config.generate.api
    missing = missing_api_key(api)
    if missing is None or (not force and current_summary(config, "generate") is not None):
        return
    raise MissingApiKeyError(
        f"generate.api.api_key_env: {missing}; export {api.api_key_env}=<your {api.provider} key> in this shell, "
        "or name a Prefect Secret block holding it in generate.api.api_key_secret_block"
    )


@contextmanager
def endpoint(config: RunConfig, workdir: Path) -> Iterator[str]:
    """The configured base URL, or that of a server started for the run: the embedded one, or vLLM on the target with
    the `vllm` section's arguments (`base_url: vllm`)."""
    if config.generate.api.provider == "embedded" or config.generate.api.base_url == "embedded":
        with embedded_server(config, workdir) as base_url:
            yield base_url
    elif config.generate.api.base_url == "vllm":
        from tasks.vllm_server import VllmServer

        longest = config.target.max_length + config.generate.request.max_tokens
        with VllmServer(config, workdir / "vllm.log", [], longest) as server:
            yield f"{server.url}/v1"
    else:
        yield config.generate.api.base_url


def output_row(record: dict) -> dict:
    """A journal record as a `generations` row (logprob bytes: int lists -> bytes)."""
    row = {k: record.get(k) for k in OUTPUT_FIELDS}
    if row["logprob_tokens"]:
        row["logprob_tokens"] = [
            {"token": e["token"], "bytes": bytes(e["bytes"]) if e.get("bytes") is not None else None, "logprob": e["logprob"]}
            for e in row["logprob_tokens"]
        ]
    return row


def prompt_limits(config: RunConfig) -> dict[str, int | None]:
    """max_prompt_chars by source name (each_turn checks every later turn against it as it is built)."""
    return {s.name: s.max_prompt_chars for s in config.generate.sources}


def conversation_rows(
    prompt: dict, state: JournalState, limit: int | None, tally: RunTally | None, stops: Counter
) -> tuple[list[dict], list[dict], list[dict]]:
    """An each_turn conversation's rows (one per journaled turn), its failure, and why it stopped short, if it did."""
    walked = walk(prompt, state, limit)
    rows = [output_row(r) for r in walked.records]
    failures, quarantine = [], []
    if walked.stop:
        stops[walked.stop] += 1
        if walked.stopped_at in state.failed:
            failures.append(state.failed[walked.stopped_at])
        turn = walked.stopped_at
        quarantine.append(quarantine_row(STAGE, turn, prompt["source"], walked.stop, walked.detail, "reply", "journal"))
    elif walked.next_prompt is not None:
        stops["not_sent"] += 1
        why = f"run stopped ({tally.stop_detail})" if tally and tally.stopped else "not sent"
        turn = walked.next_prompt["id"]
        quarantine.append(quarantine_row(STAGE, turn, prompt["source"], "not_sent", f"{why}; a rerun sends it", None, None))
    return rows, failures, quarantine


def write_outputs(
    gen_dir: Path,
    prompts: list[dict],
    state: JournalState,
    prompt_quarantine: list[dict],
    tally: RunTally | None,
    limits: dict[str, int | None] | None = None,
) -> tuple[list[dict], list[dict], list[dict], Counter]:
    """Build the output shards and quarantine table from the journal; returns (rows, failures, quarantine, and why
    conversations regenerated turn by turn stopped short)."""
    rows, failures, quarantine, stops = [], [], list(prompt_quarantine), Counter()
    for prompt in prompts:
        if "conversation" in prompt:
            turns = conversation_rows(prompt, state, (limits or {}).get(prompt["source"]), tally, stops)
            rows, failures, quarantine = rows + turns[0], failures + turns[1], quarantine + turns[2]
            continue
        record = dataset_record(prompt) if "reply" in prompt else state.done.get(prompt["id"])
        failure = state.failed.get(prompt["id"])
        if record is not None and has_reply(record):
            rows.append(output_row(record))
        elif record is not None:
            failures.append({"kind": "empty_reply"})
            quarantine.append(
                quarantine_row(
                    STAGE,
                    prompt["id"],
                    prompt["source"],
                    "empty_reply",
                    f"reply has no content, tool_calls or reasoning text (finish_reason {record.get('finish_reason')})",
                    "content",
                    "journal",
                )
            )
        elif failure is not None:
            failures.append(failure)
            retry = "retried on rerun" if failure.get("retryable") else "permanent"
            detail = f"{failure['detail']} (after {failure.get('attempts')} attempt(s); {retry})"
            quarantine.append(quarantine_row(STAGE, prompt["id"], prompt["source"], failure["kind"], detail, "reply", "journal"))
        else:
            why = f"run stopped ({tally.stopped}: {tally.stop_detail})" if tally and tally.stopped else "not sent"
            quarantine.append(
                quarantine_row(STAGE, prompt["id"], prompt["source"], "not_sent", f"{why}; a rerun sends it", None, None)
            )
    if not rows:
        raise NoRowsError(f"generate: no rows to write ({why_no_rows(len(prompts), quarantine)}); nothing was written")
    parts = [rows[i : i + ROWS_PER_PART] for i in range(0, len(rows), ROWS_PER_PART)]
    for n, part in enumerate(parts):
        write_table("generations", part, gen_dir / f"part-{n:05d}.parquet")
    for stale in sorted(gen_dir.glob("part-*.parquet"))[len(parts) :]:
        stale.unlink()
    write_table("quarantine", quarantine, gen_dir / "quarantine.parquet")
    return rows, failures, quarantine, stops


def to_request(config: RunConfig, force: bool = False) -> tuple:
    """(the sources' prompts, the journal, the prompts it lacks): what a run would ask the endpoint for. A dataset's
    own replies are never requested; `force` asks again for prompts that failed for good."""
    if not config.generate.sources:
        raise NoRowsError(f"generate.sources is empty: {NO_SOURCES}")
    loaded = load_sources(config.generate.sources)
    state = read_journal(stage_dir(config, "generate") / "journal.jsonl", repair=True)
    return loaded, state, due(config, loaded.rows, state, force)


def due(config: RunConfig, prompts: list[dict], state: JournalState, force: bool = False) -> list[dict]:
    """The requests the journal lacks: each prompt's, and the next turn of each conversation regenerated turn by
    turn (asked once the turn before it is in the journal); those that failed for good only when their kind is in
    `generate.retry_failed`, or all of them with `force`."""
    retry = set(config.generate.retry_failed)
    settled = set(state.done) if force else state.settled - {i for i, f in state.failed.items() if f["kind"] in retry}
    limits = prompt_limits(config)
    out = []
    for p in prompts:
        if "conversation" in p:
            p = walk(p, state, limits.get(p["source"])).next_prompt
            if p is None:
                continue
        if p["id"] not in settled and "reply" not in p:
            out.append(p)
    return out


def run_generate(config: RunConfig, force: bool = False) -> dict:
    """Generate every prompt the journal lacks (force: also those that failed for good); returns paths and counts.

    A reply already in the journal is never asked for again.
    """
    gen = config.generate
    gen_dir = stage_dir(config, "generate")
    journal_path = gen_dir / "journal.jsonl"
    loaded, state, pending = to_request(config, force)
    borrowed = sum(1 for p in loaded.rows if "reply" in p)  # a dataset's own replies: never requested
    log.info(
        "generate: %d prompts, %d with the dataset's reply, %d already in the journal, %d to request",
        len(loaded.rows),
        borrowed,
        len(loaded.rows) - borrowed - len(pending),
        len(pending),
    )
    tally = None
    if pending:
        api_key = resolve_api_key(gen.api)
        spent = sum(r.get("cost") or 0.0 for r in state.done.values())
        with endpoint(config, gen_dir) as base_url:

            def next_turns() -> list[dict]:
                return due(config, loaded.rows, read_journal(journal_path), force)

            tally = asyncio.run(_request_all(config, base_url, api_key, pending, journal_path, spent, next_turns))
        state = read_journal(journal_path)
    limits = prompt_limits(config)
    rows, failures, quarantine, stops = write_outputs(gen_dir, loaded.rows, state, loaded.quarantine, tally, limits)
    requested = tally.done + tally.failed + tally.unsent if tally else 0  # every request due, turns included
    extra = {
        "prompts": len(loaded.rows),
        "requested_this_run": requested,
        "from_journal": len(loaded.rows) - borrowed - len(pending),
        "stopped": tally.stopped if tally else None,
        "torn_journal_lines": state.torn_lines,
    }
    if any("conversation" in p for p in loaded.rows):
        conversations = [p for p in loaded.rows if "conversation" in p]
        extra["conversations"] = len(conversations)
        extra["conversations_complete"] = len(conversations) - sum(stops.values())
        extra["conversation_stops"] = dict(stops.most_common())
    summary = summarize(rows, failures, quarantine, extra)
    write_summary(summary, gen_dir / "summary.json")
    publish_summary(summary)
    return {
        "generations": str(gen_dir),
        "journal": str(journal_path),
        "quarantine": str(gen_dir / "quarantine.parquet"),
        "summary": str(gen_dir / "summary.json"),
        "rows": len(rows),
        "failed": len(failures),
        # Source rows refused before any request (too long, malformed): prompts skipped, not replies lost.
        "skipped_prompts": len(loaded.quarantine),
        "quarantined": len(quarantine) - len(loaded.quarantine),
        "requested_this_run": requested,
        "error_rate": summary["error_rate"],
        "stopped": summary["stopped"],
    }


async def _request_all(
    config: RunConfig,
    base_url: str,
    api_key: str | None,
    pending: list[dict],
    journal_path: Path,
    spent: float,
    next_turns: Callable[[], list[dict]],
) -> RunTally:
    """Ask for `pending`, then in rounds for what became due (the next turns of conversations regenerated turn by
    turn, each asked once the turn before it is journaled) until nothing is due or the run stops."""
    gen = config.generate
    client = ChatClient(gen.api, gen.request, config.target.model, api_key, base_url, gen.price_per_million)
    tally = RunTally(cost=spent)
    try:
        progress = GenerationProgress(len(pending), concurrency=gen.api.concurrency)
        with JournalWriter(journal_path, gen.journal_batch) as journal, progress:
            ticker = asyncio.create_task(progress.log_every())
            try:
                asked = {p["id"] for p in pending}
                while pending and not tally.stopped:
                    concurrency, budget = gen.api.concurrency, gen.budget_usd
                    done = await run_requests(pending, client, journal, concurrency, budget, tally.cost, progress.update)
                    tally.add(done)
                    # Asked once per run, like every prompt: a turn that failed for now waits for a rerun.
                    pending = [] if done.stopped else [p for p in next_turns() if p["id"] not in asked]
                    asked |= {p["id"] for p in pending}
                    progress.add(len(pending))
                return tally
            finally:
                ticker.cancel()
                progress.log_line()
    finally:
        await client.aclose()


@task(name="generate", retries=1, retry_delay_seconds=10)
def generate_task(config: RunConfig, force: bool = False) -> dict:
    """Prefect task around `run_generate`; a retry resumes from the journal, never repeats a reply."""
    failpoint("generate.task")
    return run_generate(config, force)
