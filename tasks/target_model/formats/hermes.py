"""ChatML families: SmolLM2/Qwen2.5 (`chatml`), Qwen3 (`qwen3`, `<think>` blocks), Qwen3-Coder's XML tool calls
(`qwen3-coder`) and Qwen3.5 (`qwen3.5`: both, the reasoning block opened by the generation prompt).

Hermes tool calls are `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`, one per line after
the content; the arguments text goes in byte for byte.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from tasks.target_model.formats.base import ChatFormat, ToolCall, json_arguments, json_or_text, scalar_text

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
HERMES_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)
CODER_CALL = re.compile(r"<tool_call>\n<function=([^>\n]+)>\n(.*?)</function>\n</tool_call>", re.S)
CODER_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n(.*?)\n</parameter>\n", re.S)


def hermes_arguments(body: str) -> tuple[str, str] | None:
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


@dataclass(frozen=True)
class HermesFormat(ChatFormat):
    """Content, then each call on its own line as Hermes JSON."""

    end_of_turn: str = "<|im_end|>"
    extra_markers: tuple[str, ...] = (CALL_OPEN, CALL_CLOSE)
    content_gap: str = "\n"  # between the content and the first call

    def call_text(self, call: ToolCall, row_id: str) -> str:
        name = json.dumps(call.name, ensure_ascii=False)
        json_arguments(call, row_id)  # the text goes in verbatim, but it must be JSON
        return f'{CALL_OPEN}\n{{"name": {name}, "arguments": {call.arguments}}}\n{CALL_CLOSE}'

    def tool_text(self, calls, content, history, row_id) -> str:
        if not calls:
            return ""
        body = "\n".join(self.call_text(c, row_id) for c in calls)
        return f"{self.content_gap}{body}" if content else body

    def parse_calls(self, text: str) -> tuple[ToolCall, ...] | None:
        """The calls in `text` (from the first call marker on), or None when one is not well-formed."""
        calls = []
        for body in HERMES_CALL.findall(text):
            parsed = hermes_arguments(body)
            if parsed is None:
                return None
            calls.append(ToolCall(*parsed))
        return tuple(calls)

    def split_tools(self, text: str):
        first = text.find(CALL_OPEN)
        calls = self.parse_calls(text[first:]) if first >= 0 else None
        if not calls:  # none, or not well-formed: an engine leaves the text in the content
            return text, ()
        return text[:first].removesuffix(self.content_gap), calls


@dataclass(frozen=True)
class QwenFormat(HermesFormat):
    """Qwen3: `<think>\\n…\\n</think>\\n\\n` before the content, as its template lays out the last turn."""

    def layout_reasoning(self, reasoning: str) -> str:
        return reasoning.strip("\n")

    def layout_content(self, content: str) -> str:
        return content.lstrip("\n")

    def split_reasoning(self, text, prompt):
        reasoning, rest = super().split_reasoning(text, prompt)
        if reasoning is None:
            return None, rest
        return reasoning.strip("\n"), rest.lstrip("\n")


@dataclass(frozen=True)
class QwenCoderFormat(QwenFormat):
    """Qwen3-Coder: XML calls, `<function=NAME>` and one `<parameter=KEY>` block per argument."""

    content_gap: str = "\n\n"

    def call_text(self, call: ToolCall, row_id: str) -> str:
        arguments = json_arguments(call, row_id)
        parameters = "".join(f"<parameter={k}>\n{scalar_text(v)}\n</parameter>\n" for k, v in arguments.items())
        return f"{CALL_OPEN}\n<function={call.name}>\n{parameters}</function>\n{CALL_CLOSE}"

    def layout_content(self, content: str) -> str:
        return content.strip()

    def parse_calls(self, text: str) -> tuple[ToolCall, ...] | None:
        calls = []
        for name, body in CODER_CALL.findall(text):
            arguments = {k: json_or_text(v) for k, v in CODER_PARAMETER.findall(body)}
            calls.append(ToolCall(name, json.dumps(arguments, ensure_ascii=False)))
        return tuple(calls)


CHATML = HermesFormat(
    name="chatml",
    signature=("<|im_start|>", "<|im_end|>"),
)
QWEN3 = QwenFormat(
    name="qwen3",
    think=("<think>\n", "\n</think>\n\n"),
    always_thinks=True,
    signature=("<|im_start|>", "</think>", "<tool_call>"),
)
QWEN3_CODER = QwenCoderFormat(
    name="qwen3-coder",
    signature=("<|im_start|>", "<function="),
    excludes=("</think>",),
)
QWEN35 = QwenCoderFormat(
    name="qwen3.5",
    think=("<think>\n", "\n</think>\n\n"),
    always_thinks=True,
    signature=("<|im_start|>", "<function=", "</think>"),
)
