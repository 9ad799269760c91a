"""Rebuild a batch of generation rows into training ids: pick a method per row, check, table the result."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from tasks.config import CountConvention, ReconstructConfig, TargetConfig
from tasks.contracts import MASK, TOKEN_IDS, conform, quarantine_row
from tasks.reconstruct.counts import CountCheck, ReasoningSpan, Reported, check_counts, count_columns
from tasks.reconstruct.guided import GUIDED
from tasks.reconstruct.methods import Rebuilt, from_logprobs, from_server_ids, reencode
from tasks.reconstruct.render import ChatTurn, RenderedTurn, RowError, parse_turn, render_turns
from tasks.reconstruct.whitespace import Habits, Scorer, learn_habits, restore_whitespace
from tasks.target_model.chat import chat_format_of, resolve_end_of_turn
from tasks.target_model.formats import ChatFormat
from tasks.target_model.tokens import EndOfTurn, byte_vocab

STAGE = "reconstruct"


@dataclass
class RebuildResult:
    """Rebuilt rows as a `reconstructed` table, plus quarantine records for the rest."""

    table: pa.Table
    quarantine: list[dict] = field(default_factory=list)
    end_of_turn: EndOfTurn | None = None
    # Per row id: its generated text and where the reasoning sits in it (to count a re-split reply again).
    spans: dict[str, tuple[str, ReasoningSpan | None]] = field(default_factory=dict)


def choose_method(row: dict, methods: list[str]) -> str | None:
    """The first configured method the row's data allows."""
    for method in methods:
        if method == "server_ids" and row.get("prompt_token_ids") is not None and row.get("token_ids") is not None:
            return method
        if method == "logprobs" and row.get("logprob_tokens"):
            return method
        if method in ("reencode", GUIDED):
            return method
    return None


def rebuild_turns(
    tokenizer, rows: list[dict], turns: list[ChatTurn], rendered: list[RenderedTurn], methods: list[str], end_of_turn: EndOfTurn
) -> list[Rebuilt | RowError]:
    """Rebuild already-rendered turns; re-encoded rows go through the tokenizer in one batch."""
    out: list[Rebuilt | RowError | None] = [None] * len(rows)
    batch: list[int] = []
    for i, (row, turn, r) in enumerate(zip(rows, turns, rendered, strict=True)):
        method = choose_method(row, methods)
        try:
            if method == "server_ids":
                out[i] = from_server_ids(tokenizer, row, turn, r, end_of_turn)
            elif method == "logprobs":
                out[i] = from_logprobs(tokenizer, byte_vocab(tokenizer), row, turn, r, end_of_turn)
            elif method in ("reencode", GUIDED):
                batch.append(i)
            else:
                out[i] = RowError("no_method", "token_ids", f"row {turn.id!r}: no configured method {methods} fits its data")
        except RowError as e:
            out[i] = e
    for i, rebuilt in zip(batch, reencode(tokenizer, [rendered[i] for i in batch]), strict=True):
        rebuilt.method = choose_method(rows[i], methods)  # guided rows are re-split later, with the target loaded
        out[i] = rebuilt
    return out


def check_rebuilt(turn: ChatTurn, rebuilt: Rebuilt, max_length: int) -> RowError | None:
    """Per-row rules: text round-trips, fits the sequence length, trains at least one token."""
    if not rebuilt.round_trip:
        return RowError("round_trip", "content", f"row {turn.id!r}: decode(input_ids) differs from the rendered text")
    if len(rebuilt.input_ids) > max_length:
        return RowError(
            "too_long", "input_ids", f"row {turn.id!r}: {len(rebuilt.input_ids)} tokens > target.max_length {max_length}"
        )
    if not rebuilt.loss_mask.any():
        return RowError("empty_mask", "loss_mask", f"row {turn.id!r}: no generated token to train on")
    return None


def count_check(tokenizer, row: dict, turn: ChatTurn, rendered: RenderedTurn, rebuilt: Rebuilt, convention) -> CountCheck:
    """The provider's counts against this row's rebuilt prompt and reply."""
    prompt_len = int(np.flatnonzero(rebuilt.loss_mask)[0]) if rebuilt.loss_mask.any() else len(rebuilt.input_ids)
    reply = rebuilt.input_ids[prompt_len:]
    reported = Reported.of(row)
    return check_counts(
        tokenizer, prompt_len, reply, reported, convention, not turn.truncated, rendered.generated, rendered.reasoning
    )


def rows_table(
    turns: list[ChatTurn], rendered: list[RenderedTurn], rebuilt: list[Rebuilt], counts: list[CountCheck], whitespace: list
) -> pa.Table:
    """A `reconstructed` table; token lists are built from flat numpy arrays, not Python lists."""
    lengths = np.fromiter((len(r.input_ids) for r in rebuilt), dtype=np.int32, count=len(rebuilt))
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32))
    ids = np.concatenate([r.input_ids for r in rebuilt]) if rebuilt else np.zeros(0, np.int32)
    masks = np.concatenate([r.loss_mask for r in rebuilt]) if rebuilt else np.zeros(0, np.int8)
    trained = np.fromiter((int(r.loss_mask.sum()) for r in rebuilt), dtype=np.int32, count=len(rebuilt))
    last = np.fromiter(
        (int(r.input_ids[np.flatnonzero(r.loss_mask)[-1]]) if r.loss_mask.any() else -1 for r in rebuilt),
        dtype=np.int32,
        count=len(rebuilt),
    )
    table = pa.table(
        {
            "id": [t.id for t in turns],
            "source": [t.source for t in turns],
            "input_ids": pa.ListArray.from_arrays(offsets, pa.array(ids, type=pa.int32())).cast(TOKEN_IDS),
            "loss_mask": pa.ListArray.from_arrays(offsets, pa.array(masks, type=pa.int8())).cast(MASK),
            "num_tokens": lengths,
            "num_trained": trained,
            "last_trained_id": last,
            "method": [r.method for r in rebuilt],
            "round_trip": [r.round_trip for r in rebuilt],
            "finish_reason": [t.finish_reason for t in turns],
            "prompt_text": [r.prompt_text for r in rendered],
            "origin": [t.origin for t in turns],
            **count_columns(counts),
            "whitespace": whitespace,
        }
    )
    return conform("reconstructed", table)


@dataclass
class Prepared:
    """Rows of one chunk that parsed and rendered, ready for the tokenizer."""

    rows: list[dict]
    turns: list[ChatTurn]
    rendered: list[RenderedTurn]
    quarantine: list[dict]
    chat_format: ChatFormat | None = None


def _refusal(row: dict, error: RowError) -> dict:
    return quarantine_row(STAGE, row.get("id"), row.get("source"), error.reason, error.detail, error.field)


def prepare_rows(
    tokenizer, rows: list[dict], chat_format: ChatFormat, config: ReconstructConfig, history_arguments: str = "object"
) -> Prepared:
    """Parse and render (pure Python: this is what overlaps with the previous chunk's encode)."""
    prepared = Prepared([], [], [], [], chat_format)
    parsed = []
    for row in rows:
        try:
            parsed.append((row, parse_turn(row)))
        except RowError as e:
            prepared.quarantine.append(_refusal(row, e))
    turns = [t for _, t in parsed]
    rendered = render_turns(tokenizer, turns, chat_format, config.echoed_reasoning, history_arguments) if turns else []
    for (row, turn), r in zip(parsed, rendered, strict=True):
        if isinstance(r, RowError):
            prepared.quarantine.append(_refusal(row, r))
        else:
            prepared.rows.append(row)
            prepared.turns.append(turn)
            prepared.rendered.append(r)
    return prepared


def finish_rows(
    tokenizer,
    prepared: Prepared,
    target: TargetConfig,
    config: ReconstructConfig,
    end_of_turn: EndOfTurn,
    conventions: Callable[[str], CountConvention],
    habits: Habits,
    score: Scorer | None = None,
) -> RebuildResult:
    """Get ids by each row's method, apply the per-row rules, restore whitespace a provider dropped where the count
    settles it, table what passes."""
    results = rebuild_turns(tokenizer, prepared.rows, prepared.turns, prepared.rendered, list(config.methods), end_of_turn)
    quarantine = list(prepared.quarantine)
    keep_turns, keep_rendered, keep_rebuilt, counts, whitespace, spans = [], [], [], [], [], {}
    for row, turn, r, result in zip(prepared.rows, prepared.turns, prepared.rendered, results, strict=True):
        error = result if isinstance(result, RowError) else check_rebuilt(turn, result, target.max_length)
        if error is not None:
            quarantine.append(_refusal(row, error))
            continue
        check = count_check(tokenizer, row, turn, r, result, conventions(turn.source))
        status = None
        if result.method in ("reencode", GUIDED) and check.reply_ok is False and check.expected_reply > check.reply_tokens:
            habit = habits.get(turn.source, {})
            status, restored = restore_whitespace(
                tokenizer, turn, r, prepared.chat_format, config.echoed_reasoning, check.expected_reply, habit, score
            )
            if restored is not None:
                r, method = restored, result.method
                result = reencode(tokenizer, [r])[0]
                result.method = method
                check = count_check(tokenizer, row, turn, r, result, conventions(turn.source))
        whitespace.append(status)
        keep_turns.append(turn)
        keep_rendered.append(r)
        keep_rebuilt.append(result)
        counts.append(check)
        spans[turn.id] = (r.generated, r.reasoning)
    table = rows_table(keep_turns, keep_rendered, keep_rebuilt, counts, whitespace)
    return RebuildResult(table, quarantine, end_of_turn, spans)


def rebuild_rows(
    tokenizer,
    rows: list[dict],
    target: TargetConfig,
    config: ReconstructConfig,
    conventions: Callable[[str], CountConvention] = lambda source: CountConvention(),
    score: Scorer | None = None,
) -> RebuildResult:
    """Generation rows -> reconstructed table + quarantine records (each naming the row, reason and field), each
    row's counts checked against the provider's under its source's convention (`conventions(source)`); `score`: the
    target's likelihood, that a whitespace restoration must agree with (tasks/reconstruct/whitespace.py).

    Rows go through in chunks: `encode_threads` workers encode (the tokenizer releases the GIL, so
    they run on separate cores) while the caller's thread renders the next chunk.
    """
    end_of_turn = resolve_end_of_turn(tokenizer, target)
    chat_format = chat_format_of(tokenizer, target)
    habits = learn_habits(tokenizer, rows, chat_format, end_of_turn)  # what the model writes at each parser join
    chunks = [rows[i : i + config.pipeline_rows] for i in range(0, len(rows), config.pipeline_rows)] or [[]]
    results: list[RebuildResult] = []
    with ThreadPoolExecutor(max_workers=config.encode_threads, thread_name_prefix="reconstruct-encode") as encoders:
        in_flight: deque = deque()
        for chunk in chunks:
            prepared = prepare_rows(tokenizer, chunk, chat_format, config, target.history_arguments)
            in_flight.append(
                encoders.submit(finish_rows, tokenizer, prepared, target, config, end_of_turn, conventions, habits, score)
            )
            while len(in_flight) > config.encode_threads:
                results.append(in_flight.popleft().result())
        results.extend(f.result() for f in in_flight)
    table = pa.concat_tables([r.table for r in results])
    spans = {k: v for r in results for k, v in r.spans.items()}
    return RebuildResult(table, [q for r in results for q in r.quarantine], end_of_turn, spans)
