"""Llama-3.x (`llama-3`): plain content; a tool call is the whole turn, `{"name": ..., "parameters": ...}`."""

from __future__ import annotations

import json
from dataclasses import dataclass

from tasks.target_model.formats.base import ChatFormat, RowError, ToolCall, json_arguments


@dataclass(frozen=True)
class Llama3Format(ChatFormat):
    def tool_text(self, calls, content, history, row_id) -> str:
        if not calls:
            return ""
        if len(calls) > 1 or content:
            raise RowError(
                "format_cannot_express", "tool_calls", f"row {row_id!r}: Llama-3 writes one tool call as the whole turn"
            )
        json_arguments(calls[0], row_id)
        return f'{{"name": {json.dumps(calls[0].name, ensure_ascii=False)}, "parameters": {calls[0].arguments}}}'

    def split_tools(self, text: str):
        if not text.startswith('{"name": '):
            return text, ()
        try:
            call, end = json.JSONDecoder().raw_decode(text)
            start = text.index('"parameters": ') + len('"parameters": ')
            _, stop = json.JSONDecoder().raw_decode(text, start)
        except (json.JSONDecodeError, ValueError):
            return text, ()
        if end != len(text) or not isinstance(call, dict) or "name" not in call:
            return text, ()
        return "", (ToolCall(call["name"], text[start:stop]),)


LLAMA3 = Llama3Format(
    name="llama-3",
    end_of_turn="<|eot_id|>",
    stop_markers=("<|eom_id|>",),
    signature=("<|start_header_id|>", "<|eot_id|>"),
    extra_markers=("<|start_header_id|>", "<|end_header_id|>"),
)
