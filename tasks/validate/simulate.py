"""Simulate mode: play the text API on rows with true ids, rebuild by re-encoding, and compare.

The completion ids are decoded and split into reasoning, content and tool calls by the target's chat
format, as a serving engine's parsers split them (tool-call ids as the model wrote them where the
family writes ids), then rebuilt from that text alone.
"""

from __future__ import annotations

import json

import numpy as np

from tasks.config import ReconstructConfig, TargetConfig
from tasks.reconstruct.methods import completion_ids
from tasks.reconstruct.rebuild import rebuild_rows
from tasks.target.chat import chat_format_of
from tasks.target.formats import ChatFormat
from tasks.target.tokens import EndOfTurn, codec
from tasks.validate.classify import SEMANTIC, Verdict, classify_ids, through_turn_end


def played_row(tokenizer, row: dict, chat_format: ChatFormat, end_of_turn: EndOfTurn) -> dict:
    """The generations row as a text API would have returned it: ids decoded and split, the ids dropped."""
    tokens = codec(tokenizer)
    ids = completion_ids(row["token_ids"], end_of_turn, row.get("finish_reason") == "length")
    if ids and ids[-1] in end_of_turn.ids:
        ids = ids[:-1]
    reply = chat_format.parse(tokens.decode(ids), tokens.decode(row["prompt_token_ids"]))
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
    }


def simulate_rows(
    tokenizer, rows: list[dict], target: TargetConfig, end_of_turn: EndOfTurn, context: int
) -> list[tuple[dict, Verdict]]:
    """(row, verdict) for each row with true ids: played through the text API, re-encoded, compared."""
    with_truth = [r for r in rows if r.get("prompt_token_ids") is not None and r.get("token_ids") is not None]
    if not with_truth:
        return []
    chat_format = chat_format_of(tokenizer, target)
    played = [played_row(tokenizer, r, chat_format, end_of_turn) for r in with_truth]
    result = rebuild_rows(tokenizer, played, target, ReconstructConfig(methods=["reencode"]))
    refused = {q["id"]: q for q in result.quarantine}
    rebuilt = {r["id"]: r for r in result.table.select(["id", "input_ids", "loss_mask"]).to_pylist()}
    out = []
    for row in with_truth:
        truncated = row.get("finish_reason") == "length"
        truth = list(row["prompt_token_ids"]) + completion_ids(row["token_ids"], end_of_turn, truncated)
        if row["id"] in refused and refused[row["id"]]["reason"] == "too_long":
            continue  # not a mismatch: the row is over target.max_length either way
        if row["id"] in refused:
            q = refused[row["id"]]
            out.append((row, Verdict(SEMANTIC, 0, None, f"not rebuilt: {q['reason']} ({q['field']})")))
            continue
        r = rebuilt[row["id"]]
        ids = through_turn_end(np.asarray(r["input_ids"]), np.asarray(r["loss_mask"]))
        out.append((row, classify_ids(tokenizer, truth, ids, context)))
    return out
