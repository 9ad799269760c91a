"""What every chat format shares: the generated turn as channels, the reasoning block, the error rows get.

A rebuilt row is *prompt* (the target's own template, with the generation prompt and the request's
template kwargs) plus *completion*: the generated turn written the way the model emits it. Templates
are written for inference (they drop or reshape past reasoning), so the completion is never taken
from them; a format module serializes it and, the other way round, splits decoded text into the API's
channels the way serving engines' reasoning and tool-call parsers do.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from tasks.contracts import RowError


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, byte for byte as the model wrote it
    id: str | None = None

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Reply:
    """The generated turn as an API returns it: reasoning, content and tool calls."""

    reasoning: str | None
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    truncated: bool = False  # cut by max_tokens: no end-of-turn token, maybe no closing marker

    @property
    def cut_in_reasoning(self) -> bool:
        """Cut off before the reasoning block closed: nothing after it was generated."""
        return self.truncated and bool(self.reasoning) and not self.content and not self.tool_calls


def json_arguments(call: ToolCall, row_id: str) -> dict:
    """The call's arguments as an object, or RowError naming the call (formats that rewrite arguments need it)."""
    try:
        value = json.loads(call.arguments or "{}")
    except json.JSONDecodeError as e:
        raise RowError(
            "bad_tool_arguments", "tool_calls", f"row {row_id!r}: arguments of {call.name!r} are not JSON: {e}"
        ) from None
    if not isinstance(value, dict):
        raise RowError("bad_tool_arguments", "tool_calls", f"row {row_id!r}: arguments of {call.name!r} must be a JSON object")
    return value


def json_or_text(text: str):
    """A parameter's text back to a JSON value: JSON where it parses to a non-string, else the text itself."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return text if isinstance(value, str) else value


def scalar_text(value) -> str:
    """A parameter value as XML-style formats write it: strings as they are, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class ChatFormat:
    """One model family's way of writing an assistant turn; subclasses write the tool-call syntax."""

    name: str
    end_of_turn: str
    think: tuple[str, str] | None = None  # reasoning markers as the model writes them
    always_thinks: bool = False  # the model opens a reasoning block on every turn, even an empty one
    stop_markers: tuple[str, ...] = ()  # other tokens that may end a turn (e.g. after a tool call)
    signature: tuple[str, ...] = ()  # template substrings that identify the family (all must occur)
    excludes: tuple[str, ...] = ()  # template substrings that rule the family out
    extra_markers: tuple[str, ...] = ()  # other marker tokens it writes (tool-call syntax, headers)

    # ---------------------------------------------------------------- reasoning
    def thinking_state(self, prompt: str) -> str:
        """'open' (the prompt ends inside a reasoning block), 'off' (an empty block closes it) or 'free'."""
        if self.think is None:
            return "free"
        open_, close = (m.strip() for m in self.think)
        if re.search(re.escape(open_) + r"\s*" + re.escape(close) + r"\s*$", prompt):
            return "off"
        if re.search(re.escape(open_) + r"\s*$", prompt):
            return "open"
        return "free"

    def reasoning_text(self, reply: Reply, prompt: str, row_id: str) -> str:
        """The reasoning block as the model writes it after `prompt` (no closing marker if cut inside it)."""
        state = self.thinking_state(prompt)
        if self.think is None or state == "off":
            if reply.reasoning:
                why = "has no reasoning channel" if self.think is None else "was asked with thinking off"
                raise RowError(
                    "format_cannot_express", "reasoning", f"row {row_id!r}: {self.name} {why}, but the reply has reasoning"
                )
            return ""
        if reply.reasoning is None and state == "free" and not self.always_thinks:
            return ""
        open_, close = self.think
        body = self.layout_reasoning(reply.reasoning or "")
        head = "" if state == "open" else open_
        return head + body + ("" if reply.cut_in_reasoning else close)

    def layout_reasoning(self, reasoning: str) -> str:
        return reasoning

    def layout_content(self, content: str) -> str:
        return content

    def split_reasoning(self, text: str, prompt: str) -> tuple[str | None, str]:
        """Decoded completion -> (reasoning, rest), as reasoning parsers split it."""
        if self.think is None or self.thinking_state(prompt) == "off":
            return None, text
        open_, close = (m.strip() for m in self.think)
        opened = self.thinking_state(prompt) == "open"
        stripped = text.lstrip()
        if not opened and not stripped.startswith(open_):
            return None, text
        body = text if opened else stripped[len(open_) :]
        if close not in body:  # cut off inside the reasoning
            return body, ""
        reasoning, _, rest = body.partition(close)
        return reasoning, rest

    # ---------------------------------------------------------------- tool calls
    def tool_text(self, calls: tuple[ToolCall, ...], content: str, history: list[dict], row_id: str) -> str:
        if calls:
            raise RowError("format_cannot_express", "tool_calls", f"row {row_id!r}: {self.name} has no tool-call syntax")
        return ""

    def split_tools(self, text: str) -> tuple[str, tuple[ToolCall, ...]]:
        return text, ()

    def end_text(self, reply: Reply) -> str:
        return self.end_of_turn

    # ---------------------------------------------------------------- the whole turn
    def completion(self, reply: Reply, prompt: str, history: list[dict], row_id: str = "", request: dict | None = None) -> str:
        """The generated turn after `prompt`, closed by its end-of-turn token unless it was cut off (`request`: the
        tools and template kwargs it was asked with, for formats that render the turn with the template)."""
        text = self.reasoning_text(reply, prompt, row_id)
        if reply.cut_in_reasoning:
            return text
        content = self.layout_content(reply.content)
        text += content + self.tool_text(reply.tool_calls, content, history, row_id)
        return text if reply.truncated else text + self.end_text(reply)

    def reasoning_bounds(self, reply: Reply, prompt: str, completion: str, row_id: str) -> tuple[int, int, int] | None:
        """(start, stop, block end) of the reasoning at the head of the generated text, between its markers (None: the
        reply has none, or the format writes it in channels of its own, as gpt-oss's harmony does)."""
        if self.think is None or not reply.reasoning:
            return None
        block = self.reasoning_text(reply, prompt, row_id)
        if not block:
            return None
        start = 0 if self.thinking_state(prompt) == "open" else len(self.think[0])
        return start, start + len(self.layout_reasoning(reply.reasoning)), len(block)

    def parse(self, text: str, prompt: str) -> Reply:
        """Decoded completion (end-of-turn token removed) -> the API's channels, as an engine splits them."""
        reasoning, rest = self.split_reasoning(text, prompt)
        content, calls = self.split_tools(rest)
        return Reply(reasoning, content, calls)

    def matches(self, template: str) -> bool:
        return (
            bool(self.signature) and all(s in template for s in self.signature) and not any(s in template for s in self.excludes)
        )

    @property
    def markers(self) -> list[str]:
        """Every marker text this format writes (for the preflight's round-trip table)."""
        found = [self.end_of_turn, *self.stop_markers]
        if self.think:
            found += [m.strip() for m in self.think]
        return found + list(self.extra_markers)


def prior_tool_calls(history: list[dict]) -> int:
    """Tool calls made by assistant turns of the prompt (formats that number calls across the conversation)."""
    return sum(len(m.get("tool_calls") or []) for m in history if m.get("role") == "assistant")
