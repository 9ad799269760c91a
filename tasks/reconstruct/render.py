"""Render a generation row as text: the target's own prompt, then the generated turn as the model wrote it.

prompt     = the tokenizer's chat template over the prompt turns, with the generation prompt and the
             template kwargs the request carried (thinking on/off lives there);
completion = the reply's channels serialized by the target's chat format (reasoning markers, content,
             tool-call section with the model's own ids, end-of-turn token unless the reply was cut).
"""

from __future__ import annotations

import contextvars
import json
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone

from tasks.reconstruct.counts import ReasoningSpan
from tasks.target_model.chat import template_messages
from tasks.target_model.formats import ChatFormat, Reply, RowError, ToolCall

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
    created: int | None = None  # unix seconds of the reply: templates that write today's date get that day
    origin: str = "target"  # "dataset" for a dataset's own reply (source `replies: dataset`)

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
    reasoning: ReasoningSpan | None = None  # where the reasoning sits in the generated text

    @property
    def generated(self) -> str:
        return self.text[self.gen_start : self.gen_end]


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
        created=row.get("created"),
        origin=row.get("origin") or "target",
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


def reply_day(created: int | None) -> str | None:
    """The UTC day a reply was created, as YYYY-MM-DD (None: unknown, templates see today)."""
    return None if created is None else datetime.fromtimestamp(created, timezone.utc).strftime("%Y-%m-%d")


_REPLY_DAY: contextvars.ContextVar[str | None] = contextvars.ContextVar("reply_day", default=None)


class _ReplyClock(datetime):
    """`datetime` as transformers' chat templates see it: `now()` is the reply's day while one is set."""

    @classmethod
    def now(cls, tz=None):
        day = _REPLY_DAY.get()
        return datetime.now(tz) if day is None else datetime.strptime(day, "%Y-%m-%d").replace(hour=12, tzinfo=tz)


@contextmanager
def rendered_on(day: str | None):
    """Templates that write today's date (`strftime_now`, e.g. gpt-oss's) write `day` instead, in this context.

    Their `strftime_now` reads `datetime.now()` in transformers' chat-template module and takes no keyword
    (template kwargs are plain data), so that module's clock reads this context's day."""
    from transformers.utils import chat_template_utils

    chat_template_utils.datetime = _ReplyClock
    token = _REPLY_DAY.set(day)
    try:
        yield
    finally:
        _REPLY_DAY.reset(token)


def render_prompts(tokenizer, turns: list[ChatTurn], history_arguments: str = "object") -> list[str]:
    """Each turn's prompt with the generation prompt, as the target rendered it on the day of its reply; one
    template call per distinct (tools, kwargs, day)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(turns):
        groups[json.dumps([t.tools, t.template_kwargs, reply_day(t.created)], sort_keys=True)].append(i)
    out: list[str] = [""] * len(turns)
    for idx in groups.values():
        first = turns[idx[0]]
        with rendered_on(reply_day(first.created)):
            texts = tokenizer.apply_chat_template(
                [template_messages(turns[i].messages, history_arguments) for i in idx],
                tools=first.tools,
                tokenize=False,
                add_generation_prompt=True,
                **first.template_kwargs,
            )
        for i, text in zip(idx, texts, strict=True):
            out[i] = text
    return out


def render_turn(turn: ChatTurn, prompt: str, chat_format: ChatFormat, echoed: str) -> RenderedTurn:
    reply = reply_of(turn, chat_format, echoed)
    request = {"tools": turn.tools, "template_kwargs": turn.template_kwargs}
    with rendered_on(reply_day(turn.created)):  # a format that writes the turn with the template, as the prompt was
        completion = chat_format.completion(reply, prompt, turn.messages, turn.id, request)
    bounds = chat_format.reasoning_bounds(reply, prompt, completion, turn.id)
    span = ReasoningSpan(*bounds) if bounds else None
    return RenderedTurn(prompt + completion, len(prompt), len(prompt) + len(completion), prompt_plain_text(turn.messages), span)


def render_turns(
    tokenizer, turns: list[ChatTurn], chat_format: ChatFormat, echoed: str = "quarantine", history_arguments: str = "object"
) -> list[RenderedTurn | RowError]:
    """Render every turn; a row the template or the format cannot express becomes its RowError."""
    try:
        prompts = render_prompts(tokenizer, turns, history_arguments)
    except Exception:  # one bad row must not sink the batch: retry row by row to name it
        if len(turns) == 1:
            raise
        return [r for t in turns for r in _render_one(tokenizer, t, chat_format, echoed, history_arguments)]
    out: list[RenderedTurn | RowError] = []
    for turn, prompt in zip(turns, prompts, strict=True):
        try:
            out.append(render_turn(turn, prompt, chat_format, echoed))
        except RowError as e:
            out.append(e)
    return out


def _render_one(
    tokenizer, turn: ChatTurn, chat_format: ChatFormat, echoed: str, history_arguments: str
) -> list[RenderedTurn | RowError]:
    try:
        return render_turns(tokenizer, [turn], chat_format, echoed, history_arguments)
    except Exception as e:  # the template raised on this row's content
        return [RowError("template_error", "messages", f"row {turn.id!r}: chat template raised {type(e).__name__}: {e}")]
