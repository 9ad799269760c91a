"""Simulate mode: play the text API on rows with true ids, rebuild by re-encoding, and compare."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np

from tasks.config import ReconstructConfig, TargetConfig
from tasks.reconstruct.adapters import adapt_message
from tasks.reconstruct.methods import completion_ids
from tasks.reconstruct.rebuild import rebuild_rows
from tasks.reconstruct.tokens import EndOfTurn
from tasks.validate.classify import SEMANTIC, Verdict, classify_ids, through_turn_end

PROBE_REASONING, PROBE_CONTENT, PROBE_TOOL = "PROBEREASONING", "PROBECONTENT", "probe_tool"
HERMES_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
KIMI_SECTION = re.compile(r"<\|tool_calls_section_begin\|>(.*?)<\|tool_calls_section_end\|>", re.DOTALL)
KIMI_CALL = re.compile(r"<\|tool_call_begin\|>(.*?)<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>", re.DOTALL)


@dataclass(frozen=True)
class ReplySplitter:
    """How the template lays out a reply, found by rendering probes: reasoning markers and tool-call style."""

    think_open: str | None
    think_close: str | None
    tool_style: str | None  # "hermes" | "kimi" | None (tool calls stay in the content)

    def split(self, text: str) -> dict:
        """Decoded reply text -> the API's channels (reasoning, content, tool_calls)."""
        reasoning = None
        if self.think_open and text.startswith(self.think_open):
            close = text.find(self.think_close, len(self.think_open))
            if close >= 0:
                reasoning = text[len(self.think_open) : close]
                text = text[close + len(self.think_close) :]
        content, calls = split_tool_calls(text, self.tool_style)
        return {"reasoning": reasoning, "content": content, "tool_calls": calls}


def _reply_span(tokenizer, reply: dict, chat_format: str) -> str:
    prompt = [{"role": "user", "content": "ping"}]
    head = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(prompt + [adapt_message(reply, chat_format)], tokenize=False)
    return full[len(head) :] if full.startswith(head) else ""


def splitter_for(tokenizer, chat_format: str) -> ReplySplitter:
    """Probe the template with marker strings to learn where reasoning and tool calls go."""
    span = _reply_span(
        tokenizer, {"role": "assistant", "content": PROBE_CONTENT, "reasoning_content": PROBE_REASONING}, chat_format
    )
    think_open = think_close = None
    r, c = span.find(PROBE_REASONING), span.find(PROBE_CONTENT)
    if 0 <= r < c:
        think_open, think_close = span[:r], span[r + len(PROBE_REASONING) : c]
    call = {"id": "call_0", "type": "function", "function": {"name": PROBE_TOOL, "arguments": "{}"}}
    span = _reply_span(tokenizer, {"role": "assistant", "content": "", "tool_calls": [call]}, chat_format)
    style = "hermes" if "<tool_call>" in span else "kimi" if "<|tool_calls_section_begin|>" in span else None
    return ReplySplitter(think_open or None, think_close, style)


def _call(index: int, name: str, arguments: str) -> dict:
    return {"id": f"call_{index}", "type": "function", "function": {"name": name, "arguments": arguments}}


def _hermes_arguments(body: str) -> tuple[str, str] | None:
    """Name and the raw arguments text (byte for byte) of one `{"name": ..., "arguments": ...}` body."""
    try:
        name = json.loads(body)["name"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return None
    key = body.find('"arguments":')
    if key < 0:
        return None
    start = key + len('"arguments":')
    while start < len(body) and body[start] == " ":
        start += 1
    try:
        _, end = json.JSONDecoder().raw_decode(body, start)
    except json.JSONDecodeError:
        return None
    return name, body[start:end]


def split_tool_calls(text: str, style: str | None) -> tuple[str, list[dict] | None]:
    """Content before the first call, and the calls parsed as an API would return them."""
    if style == "hermes":
        calls = []
        for i, m in enumerate(HERMES_CALL.finditer(text)):
            parsed = _hermes_arguments(m.group(1))
            if parsed is None:
                return text, None
            calls.append(_call(i, *parsed))
        if calls:
            first = text.find("<tool_call>")
            return text[:first].removesuffix("\n"), calls
    if style == "kimi":
        section = KIMI_SECTION.search(text)
        if section:
            calls = []
            for i, m in enumerate(KIMI_CALL.finditer(section.group(1))):
                name = m.group(1).removeprefix("functions.").rsplit(":", 1)[0]
                calls.append(_call(i, name, m.group(2)))
            return text[: section.start()], calls
    return text, None


def played_row(tokenizer, row: dict, splitter: ReplySplitter, end_of_turn: EndOfTurn) -> dict:
    """The generations row as a text API would have returned it: ids decoded and split, the ids dropped."""
    ids = completion_ids(row["token_ids"], end_of_turn, row.get("finish_reason") == "length")
    if ids and ids[-1] == end_of_turn.id:
        ids = ids[:-1]
    parts = splitter.split(tokenizer.decode(ids, skip_special_tokens=False))
    return {
        "id": row["id"],
        "source": row.get("source"),
        "messages": row["messages"],
        "tools": row.get("tools"),
        "reasoning": parts["reasoning"],
        "content": parts["content"],
        "tool_calls": json.dumps(parts["tool_calls"], ensure_ascii=False) if parts["tool_calls"] else None,
        "finish_reason": row.get("finish_reason"),
    }


def simulate_rows(
    tokenizer, rows: list[dict], target: TargetConfig, end_of_turn: EndOfTurn, context: int
) -> list[tuple[dict, Verdict]]:
    """(row, verdict) for each row with true ids: played through the text API, re-encoded, compared."""
    with_truth = [r for r in rows if r.get("prompt_token_ids") is not None and r.get("token_ids") is not None]
    if not with_truth:
        return []
    splitter = splitter_for(tokenizer, target.chat_format)
    played = [played_row(tokenizer, r, splitter, end_of_turn) for r in with_truth]
    result = rebuild_rows(tokenizer, played, target, ReconstructConfig(methods=["reencode"]))
    refused = {q["id"]: q for q in result.quarantine}
    rebuilt = {r["id"]: r for r in result.table.select(["id", "input_ids", "loss_mask"]).to_pylist()}
    out = []
    for row in with_truth:
        truncated = row.get("finish_reason") == "length"
        truth = list(row["prompt_token_ids"]) + completion_ids(row["token_ids"], end_of_turn, truncated)
        if row["id"] in refused:
            q = refused[row["id"]]
            out.append((row, Verdict(SEMANTIC, 0, None, f"not rebuilt: {q['reason']} ({q['field']})")))
            continue
        r = rebuilt[row["id"]]
        ids = through_turn_end(np.asarray(r["input_ids"]), np.asarray(r["loss_mask"]))
        out.append((row, classify_ids(tokenizer, truth, ids, context)))
    return out
