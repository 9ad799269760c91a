"""Render a generation row as the target's chat template would: one string, plus where the reply sits in it."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass

from tasks.reconstruct.adapters import adapt_message

TRUNCATED = "length"


class RowError(ValueError):
    """A row that cannot be rebuilt; `reason` is the short kind counted in quarantine, `field` the culprit."""

    def __init__(self, reason: str, field: str | None, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.field = field
        self.detail = detail


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

    @property
    def truncated(self) -> bool:
        return self.finish_reason == TRUNCATED

    def reply_message(self) -> dict:
        """The generated turn as an assistant message (reasoning as `reasoning_content`, arguments kept as text)."""
        message = {"role": "assistant", "content": self.content or ""}
        if self.reasoning is not None:
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


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
    tool_calls = _json_field(row, "tool_calls", list) or None
    for i, call in enumerate(tool_calls or []):
        arguments = (call.get("function") or {}).get("arguments") if isinstance(call, dict) else None
        if not isinstance(arguments, str):
            raise RowError(
                "bad_tool_call", "tool_calls",
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
    )


def prompt_plain_text(messages: list[dict]) -> str:
    """Prompt turns as `role: content` lines; the same for every target, so sources dedup across targets."""
    parts = []
    for m in messages:
        content = m.get("content")
        if not isinstance(content, str):
            content = json.dumps(content, ensure_ascii=False, sort_keys=True)
        parts.append(f"{m.get('role')}: {content}")
    return "\n\n".join(parts)


def _render_batch(tokenizer, conversations: list[list[dict]], tools: list | None, generation_prompt: bool) -> list[str]:
    return tokenizer.apply_chat_template(
        conversations, tools=tools, tokenize=False, add_generation_prompt=generation_prompt
    )


def render_texts(tokenizer, conversations: list[list[dict]], tools: list[list | None], generation_prompt: bool) -> list[str]:
    """Render many conversations with the tokenizer's own template, one call per distinct tool list."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(tools):
        groups[json.dumps(t, sort_keys=True) if t else ""].append(i)
    out: list[str] = [""] * len(conversations)
    for key, idx in groups.items():
        texts = _render_batch(tokenizer, [conversations[i] for i in idx], tools[idx[0]] if key else None, generation_prompt)
        for i, text in zip(idx, texts, strict=True):
            out[i] = text
    return out


def _dropped_fields(tokenizer, turn: ChatTurn, chat_format: str, full: str) -> list[str]:
    """Channels of the reply the template silently leaves out (rendering without them changes nothing)."""
    dropped = []
    prompt = [adapt_message(m, chat_format) for m in turn.messages]
    for field in ("reasoning", "tool_calls"):
        if not getattr(turn, field):
            continue
        reduced = turn.reply_message()
        reduced.pop("reasoning_content" if field == "reasoning" else "tool_calls")
        without = _render_batch(tokenizer, [prompt + [adapt_message(reduced, chat_format)]], turn.tools, False)[0]
        if without == full:
            dropped.append(field)
    return dropped


def render_turns(tokenizer, turns: list[ChatTurn], chat_format: str, end_of_turn: str) -> list[RenderedTurn | RowError]:
    """Render each turn's prompt and whole conversation; locate the reply between them."""
    prompts = [[adapt_message(m, chat_format) for m in t.messages] for t in turns]
    fulls = [p + [adapt_message(t.reply_message(), chat_format)] for p, t in zip(prompts, turns, strict=True)]
    tools = [t.tools for t in turns]
    try:
        prompt_texts = render_texts(tokenizer, prompts, tools, True)
        full_texts = render_texts(tokenizer, fulls, tools, False)
    except Exception:  # one bad row must not sink the batch: retry row by row to name it
        if len(turns) == 1:
            raise
        return [r for t in turns for r in _render_one(tokenizer, t, chat_format, end_of_turn)]
    return [
        locate_reply(tokenizer, t, chat_format, end_of_turn, p, f)
        for t, p, f in zip(turns, prompt_texts, full_texts, strict=True)
    ]


def _render_one(tokenizer, turn: ChatTurn, chat_format: str, end_of_turn: str) -> list[RenderedTurn | RowError]:
    try:
        return render_turns(tokenizer, [turn], chat_format, end_of_turn)
    except Exception as e:  # the template raised on this row's content
        return [RowError("template_error", "messages", f"row {turn.id!r}: chat template raised {type(e).__name__}: {e}")]


def locate_reply(
    tokenizer, turn: ChatTurn, chat_format: str, end_of_turn: str, prompt: str, full: str
) -> RenderedTurn | RowError:
    """The reply starts where the rendered prompt (with its generation header) ends and runs through end-of-turn."""
    if not full.startswith(prompt):
        return RowError(
            "template_not_prefix", "messages",
            f"row {turn.id!r}: the rendered prompt is not a prefix of the rendered conversation",
        )
    stop = full.rfind(end_of_turn)
    if stop < len(prompt):
        return RowError("no_end_of_turn", "content", f"row {turn.id!r}: the reply renders without {end_of_turn!r}")
    dropped = _dropped_fields(tokenizer, turn, chat_format, full)
    if dropped:
        return RowError(
            "template_drops_field", dropped[0],
            f"row {turn.id!r}: the chat template cannot express {dropped[0]} "
            f"(set target.chat_format to an adapter or target.chat_template)",
        )
    if turn.truncated:  # the model was cut off: it never produced the end-of-turn token or anything after it
        return RenderedTurn(full[:stop], len(prompt), stop, prompt_plain_text(turn.messages))
    return RenderedTurn(full, len(prompt), stop + len(end_of_turn), prompt_plain_text(turn.messages))
