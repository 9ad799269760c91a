"""Render a generation row as text: the target's own prompt, then the generated turn as the model wrote it.

prompt     = the tokenizer's chat template over the prompt turns, with the generation prompt and the
             template kwargs the request carried (thinking on/off lives there);
completion = the reply's channels serialized by the target's chat format (reasoning markers, content,
             tool-call section with the model's own ids, end-of-turn token unless the reply was cut).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass

from tasks.target.chat import template_messages
from tasks.target.formats import ChatFormat, Reply, RowError, ToolCall

TRUNCATED = "length"
NOT_VERBATIM = ("summary", "encrypted")

__all__ = ["ChatTurn", "RenderedTurn", "RowError", "parse_turn", "render_turns", "prompt_plain_text"]


@dataclass(frozen=True)
class ChatTurn:
    """One generation row: the prompt turns and the reply the API returned, split into its channels."""

    id: str
    source: str
    messages: list[dict]
    tools: list[dict] | None
    reasoning: str | None
    content: str | None
    tool_calls: list[dict] | None
    finish_reason: str | None
    template_kwargs: dict

    @property
    def truncated(self) -> bool:
        return self.finish_reason == TRUNCATED


@dataclass(frozen=True)
class RenderedTurn:
    """The whole conversation as text; characters [gen_start, gen_end) are what the model generated."""

    text: str
    gen_start: int
    gen_end: int
    prompt_text: str


def _json_field(row: dict, field: str, kind: type) -> object:
    raw = row.get(field)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except (TypeError, json.JSONDecodeError) as e:
        raise RowError("bad_json", field, f"row {row.get('id')!r}: {field} is not valid JSON: {e}") from None
    if value is not None and not isinstance(value, kind):
        raise RowError("bad_json", field, f"row {row.get('id')!r}: {field} must be a JSON {kind.__name__}")
    return value


def parse_turn(row: dict) -> ChatTurn:
    """A generations row -> ChatTurn, or RowError naming the field that does not parse."""
    messages = _json_field(row, "messages", list)
    if not messages:
        raise RowError("no_prompt", "messages", f"row {row.get('id')!r}: messages is empty")
    if row.get("reasoning_kind") in NOT_VERBATIM:
        raise RowError(
            "reasoning_not_verbatim",
            "reasoning",
            f"row {row.get('id')!r}: the API returned only a {row['reasoning_kind']} of the reasoning, "
            "not the text the model generated",
        )
    tool_calls = _json_field(row, "tool_calls", list) or None
    for i, call in enumerate(tool_calls or []):
        arguments = (call.get("function") or {}).get("arguments") if isinstance(call, dict) else None
        if not isinstance(arguments, str):
            raise RowError(
                "bad_tool_call",
                "tool_calls",
                f"row {row.get('id')!r}: tool_calls[{i}].function.arguments must be a JSON string",
            )
    return ChatTurn(
        id=row["id"],
        source=row.get("source") or "",
        messages=messages,
        tools=_json_field(row, "tools", list) or None,
        reasoning=row.get("reasoning"),
        content=row.get("content"),
        tool_calls=tool_calls,
        finish_reason=row.get("finish_reason"),
        template_kwargs=_json_field(row, "template_kwargs", dict) or {},
    )


def reply_of(turn: ChatTurn, chat_format: ChatFormat, echoed: str) -> Reply:
    """The turn's channels as a Reply; reasoning the API also echoed into the content is refused or stripped."""
    content = turn.content or ""
    reasoning = turn.reasoning
    head = content.lstrip()
    opener = chat_format.think[0].strip() if chat_format.think else None
    copy = reasoning.strip() if reasoning and reasoning.strip() else None
    if (copy and head.startswith(copy)) or (opener and head.startswith(opener)):
        if echoed == "quarantine":
            raise RowError(
                "reasoning_echoed",
                "content",
                f"row {turn.id!r}: the content repeats the reasoning (set reconstruct.echoed_reasoning: strip to drop it)",
            )
        if opener and head.startswith(opener) and chat_format.think[1].strip() in head:
            head = head.split(chat_format.think[1].strip(), 1)[1]
        elif copy:
            head = head[len(copy) :]
        content = head.lstrip()
    calls = tuple(
        ToolCall(c["function"].get("name") or "", c["function"]["arguments"], c.get("id")) for c in turn.tool_calls or []
    )
    return Reply(reasoning, content, calls, turn.truncated)


def prompt_plain_text(messages: list[dict]) -> str:
    """Prompt turns as `role: content` lines; the same for every target, so sources dedup across targets."""
    parts = []
    for m in messages:
        content = m.get("content")
        if not isinstance(content, str):
            content = json.dumps(content, ensure_ascii=False, sort_keys=True)
        parts.append(f"{m.get('role')}: {content}")
    return "\n\n".join(parts)


def render_prompts(tokenizer, turns: list[ChatTurn]) -> list[str]:
    """Each turn's prompt with the generation prompt, one template call per distinct (tools, kwargs)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(turns):
        groups[json.dumps([t.tools, t.template_kwargs], sort_keys=True)].append(i)
    out: list[str] = [""] * len(turns)
    for idx in groups.values():
        first = turns[idx[0]]
        texts = tokenizer.apply_chat_template(
            [template_messages(turns[i].messages) for i in idx],
            tools=first.tools,
            tokenize=False,
            add_generation_prompt=True,
            **first.template_kwargs,
        )
        for i, text in zip(idx, texts, strict=True):
            out[i] = text
    return out


def render_turn(turn: ChatTurn, prompt: str, chat_format: ChatFormat, echoed: str) -> RenderedTurn:
    completion = chat_format.completion(reply_of(turn, chat_format, echoed), prompt, turn.messages, turn.id)
    return RenderedTurn(prompt + completion, len(prompt), len(prompt) + len(completion), prompt_plain_text(turn.messages))


def render_turns(
    tokenizer, turns: list[ChatTurn], chat_format: ChatFormat, echoed: str = "quarantine"
) -> list[RenderedTurn | RowError]:
    """Render every turn; a row the template or the format cannot express becomes its RowError."""
    try:
        prompts = render_prompts(tokenizer, turns)
    except Exception:  # one bad row must not sink the batch: retry row by row to name it
        if len(turns) == 1:
            raise
        return [r for t in turns for r in _render_one(tokenizer, t, chat_format, echoed)]
    out: list[RenderedTurn | RowError] = []
    for turn, prompt in zip(turns, prompts, strict=True):
        try:
            out.append(render_turn(turn, prompt, chat_format, echoed))
        except RowError as e:
            out.append(e)
    return out


def _render_one(tokenizer, turn: ChatTurn, chat_format: ChatFormat, echoed: str) -> list[RenderedTurn | RowError]:
    try:
        return render_turns(tokenizer, [turn], chat_format, echoed)
    except Exception as e:  # the template raised on this row's content
        return [RowError("template_error", "messages", f"row {turn.id!r}: chat template raised {type(e).__name__}: {e}")]
