"""Kimi-K2 (`kimi-k2`: Instruct, no reasoning) and Kimi-K2-Thinking / K2.5 (`kimi-k2.5`: `<think>` on every turn).

Tool calls sit in one section after the content; each id is `functions.NAME:IDX` with IDX counted over
the whole conversation, as Kimi's templates number them and the model writes them. An id the API
returns in that form is the model's own and is kept; any other id is replaced by the counted one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tasks.target_model.formats.base import ChatFormat, ToolCall, json_arguments, prior_tool_calls

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARGUMENT_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
MODEL_ID = re.compile(r"functions\.(?P<name>[^:\s]+):(?P<index>\d+)")
CALL = re.compile(
    re.escape(CALL_BEGIN) + r"\s*(?P<id>[^<]+:\d+)\s*" + re.escape(ARGUMENT_BEGIN) + r"(?P<arguments>.*?)" + re.escape(CALL_END),
    re.S,
)


def model_call_ids(calls: tuple[ToolCall, ...], history: list[dict]) -> list[str]:
    """Each call's id as the model writes it: the API's when already `functions.NAME:IDX`, else counted."""
    first = prior_tool_calls(history)
    ids = []
    for k, call in enumerate(calls):
        given = MODEL_ID.fullmatch(call.id or "")
        ids.append(call.id if given and given["name"] == call.name else f"functions.{call.name}:{first + k}")
    return ids


@dataclass(frozen=True)
class KimiFormat(ChatFormat):
    def tool_text(self, calls, content, history, row_id) -> str:
        if not calls:
            return ""
        for call in calls:
            json_arguments(call, row_id)  # written verbatim, but must be JSON
        body = "".join(
            f"{CALL_BEGIN}{call_id}{ARGUMENT_BEGIN}{call.arguments}{CALL_END}"
            for call, call_id in zip(calls, model_call_ids(calls, history), strict=True)
        )
        return f"{SECTION_BEGIN}{body}{SECTION_END}"

    def split_tools(self, text: str):
        start = text.find(SECTION_BEGIN)
        if start < 0:
            return text, ()
        calls = []
        for m in CALL.finditer(text[start:]):
            call_id = m["id"].strip()
            name = call_id.rsplit(":", 1)[0].removeprefix("functions.")
            calls.append(ToolCall(name, m["arguments"], call_id))
        return text[:start], tuple(calls)


MARKERS = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARGUMENT_BEGIN, CALL_END, "<|im_user|>", "<|im_assistant|>", "<|im_middle|>")

KIMI_K2 = KimiFormat(
    name="kimi-k2",
    end_of_turn="<|im_end|>",
    signature=("<|im_assistant|>", "<|tool_calls_section_begin|>"),
    extra_markers=MARKERS,
)
KIMI_K25 = KimiFormat(
    name="kimi-k2.5",
    end_of_turn="<|im_end|>",
    think=("<think>", "</think>"),
    always_thinks=True,
    signature=("<|im_assistant|>", "<|tool_calls_section_begin|>", "<think>"),
    extra_markers=MARKERS,
)
