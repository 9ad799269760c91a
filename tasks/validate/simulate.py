"""Simulate mode: play the text API on rows with true ids, rebuild by re-encoding, and compare.

The completion ids are decoded and split into reasoning, content and tool calls by the target's chat
format, as a serving engine's parsers split them (tool-call ids as the model wrote them where the
family writes ids), then rebuilt from that text alone.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tasks.config import CountConvention, GuidedConfig, ReconstructConfig, TargetConfig
from tasks.reconstruct.counts import CountCheck, recount, row_check
from tasks.reconstruct.methods import completion_ids, truth_ids
from tasks.reconstruct.rebuild import rebuild_rows
from tasks.reconstruct.spans import Resplitter, Span, reply_span, to_search
from tasks.target_model.chat import chat_format_of
from tasks.target_model.formats import ChatFormat
from tasks.target_model.tokens import EndOfTurn, codec
from tasks.validate.classify import EXACT, SEMANTIC, Verdict, classify_ids


def played_row(tokenizer, row: dict, chat_format: ChatFormat, end_of_turn: EndOfTurn) -> dict:
    """The generations row as a text API would have returned it: ids decoded and split, the ids dropped."""
    tokens = codec(tokenizer)
    ids = completion_ids(row["token_ids"], end_of_turn, row.get("finish_reason") == "length")
    if ids and ids[-1] in end_of_turn.ids:
        ids = ids[:-1]
    prompt = row["prompt_token_ids"]
    reply = chat_format.parse(tokens.decode(ids, reply=not tokens.ends_in_special(prompt)), tokens.decode(prompt))
    calls = [{**c.as_openai(), "id": c.id or f"call_{i}"} for i, c in enumerate(reply.tool_calls)]
    return {
        "id": row["id"],
        "source": row.get("source"),
        "messages": row["messages"],
        "tools": row.get("tools"),
        "reasoning": reply.reasoning,
        "content": reply.content,
        "tool_calls": json.dumps(calls, ensure_ascii=False) if calls else None,
        "finish_reason": row.get("finish_reason"),
        "template_kwargs": row.get("template_kwargs"),
        # What a text API returns beside the text: the provider's own token counts.
        **{k: row.get(k) for k in ("prompt_tokens", "completion_tokens", "reasoning_tokens", "cached_tokens")},
    }


GUIDED_STATS = ("rows", "searched", "changed", "nats", "exact_lost", "tokens", "seconds")


@dataclass
class Replayed:
    """A row with true ids, rebuilt from its text alone: the truth, and the re-encoded ids or why there are none."""

    row: dict
    truth: list[int]
    span: Span | None  # re-encoded ids through the end of turn; the reply's tokens are [start, stop)
    refused: Verdict | None = None
    one_pass: Verdict | None = field(default=None, repr=False)
    counts: CountCheck | None = None  # the one-pass rebuild's lengths against the provider's counts
    generated: tuple = ("", None)  # the generated text and where its reasoning sits (to count a re-split again)

    def verdict(self, tokenizer, ids: list[int], context: int = 3) -> Verdict:
        return self.refused or classify_ids(tokenizer, self.truth, ids, context)

    def canonical(self, tokenizer, context: int = 3) -> Verdict:
        """The verdict on the one-pass ids, classified once (validate and the guided figures both read it)."""
        if self.one_pass is None:
            self.one_pass = self.verdict(tokenizer, self.span.ids if self.span else [], context)
        return self.one_pass


def replay_rows(
    tokenizer,
    rows: list[dict],
    target: TargetConfig,
    end_of_turn: EndOfTurn,
    conventions: Callable[[str], CountConvention] = lambda source: CountConvention(),
) -> list[Replayed]:
    """Rows with true ids played through the text API and re-encoded in one pass (rows over max_length left out),
    each with the one-pass rebuild's count check against the provider's counts under its source's convention."""
    with_truth = [r for r in rows if r.get("prompt_token_ids") is not None and r.get("token_ids") is not None]
    if not with_truth:
        return []
    chat_format = chat_format_of(tokenizer, target)
    played = [played_row(tokenizer, r, chat_format, end_of_turn) for r in with_truth]
    result = rebuild_rows(tokenizer, played, target, ReconstructConfig(methods=["reencode"]), conventions)
    refused = {q["id"]: q for q in result.quarantine}
    rebuilt = {r["id"]: r for r in result.table.drop_columns(["prompt_text"]).to_pylist()}
    out = []
    for row in with_truth:
        truth = truth_ids(row, end_of_turn)
        q = refused.get(row["id"])
        if q is not None and q["reason"] == "too_long":
            continue  # not a mismatch: the row is over target.max_length either way
        if q is not None:
            out.append(Replayed(row, truth, None, Verdict(SEMANTIC, 0, None, f"not rebuilt: {q['reason']} ({q['field']})")))
            continue
        r = rebuilt[row["id"]]
        span = reply_span(r["input_ids"], r["loss_mask"], end_of_turn)
        out.append(Replayed(row, truth, span, counts=row_check(r), generated=result.spans[row["id"]]))
    return out


def simulate_rows(
    tokenizer, rows: list[dict], target: TargetConfig, end_of_turn: EndOfTurn, context: int
) -> list[tuple[dict, Verdict]]:
    """(row, verdict) for each row with true ids: played through the text API, re-encoded, compared."""
    replayed = replay_rows(tokenizer, rows, target, end_of_turn)
    return [(r.row, r.verdict(tokenizer, r.span.ids if r.span else [], context)) for r in replayed]


def simulate_guided(
    search: Callable[[list[Span]], list],
    tokenizer,
    replayed: list[Replayed],
    cfg: GuidedConfig,
    context: int,
    conventions: Callable[[str], CountConvention] = lambda source: CountConvention(),
):
    """The same replayed rows re-split by `guided` (`search`: a backend's) as reconstruct would, searched toward the
    provider's count where it has one: (row, verdict, count check) triples, and per source what it changed and cost."""
    rebuilt = [r for r in replayed if r.span is not None]
    splitter = Resplitter(tokenizer)
    plans = [to_search(r.span, r.counts.expected_reply if r.counts else None, cfg, splitter) for r in rebuilt]
    searched = [span for span in plans if span is not None]
    started = time.perf_counter()
    found = iter(search(searched))
    seconds = time.perf_counter() - started
    verdicts = [(r.row, r.refused, None) for r in replayed if r.span is None]
    stats: dict[str, dict] = {}
    tokens = sum(len(span.ids) for span in searched) or 1
    for r, plan in zip(rebuilt, plans, strict=True):
        result = next(found) if plan is not None else None
        before = r.canonical(tokenizer, context)
        edited = result is not None and result.edits
        verdict = r.verdict(tokenizer, result.ids, context) if edited else before
        counts = r.counts
        if edited and counts is not None:
            generated, reasoning = r.generated
            reply = result.ids[r.span.start :]
            markers = conventions(r.row.get("source") or "").reasoning_markers
            counts = recount(counts, tokenizer, reply, generated, reasoning, markers)
        verdicts.append((r.row, verdict, counts))
        s = stats.setdefault(r.row.get("source") or "", dict.fromkeys(GUIDED_STATS, 0))
        s["rows"] += 1
        s["searched"] += plan is not None
        s["changed"] += bool(edited)
        s["nats"] += result.nats if result is not None else 0.0
        s["exact_lost"] += before.klass == EXACT and verdict.klass != EXACT
        s["tokens"] += len(r.span.ids) if plan is not None else 0
        s["seconds"] += seconds * len(r.span.ids) / tokens if plan is not None else 0.0  # shared out by tokens searched
    return verdicts, stats
