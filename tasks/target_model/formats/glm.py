"""GLM-4.6 (`glm-4.6`): `\\n<think>…</think>` on every turn, XML-ish calls with `<arg_key>`/`<arg_value>`.

GLM has no end-of-turn token of its own: a turn ends when the model writes the next header, `<|user|>`
after a reply or `<|observation|>` after tool calls (both are in its eos list).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from tasks.target_model.formats.base import ChatFormat, Reply, ToolCall, json_arguments, json_or_text, scalar_text

CALL = re.compile(r"\n<tool_call>(?P<name>[^\n<]*)\n(?P<body>.*?)</tool_call>", re.S)
ARGUMENT = re.compile(r"<arg_key>(?P<key>.*?)</arg_key>\n<arg_value>(?P<value>.*?)</arg_value>\n", re.S)


@dataclass(frozen=True)
class GlmFormat(ChatFormat):
    def layout_reasoning(self, reasoning: str) -> str:
        return reasoning.strip()

    def layout_content(self, content: str) -> str:
        return f"\n{content.strip()}" if content.strip() else ""

    def tool_text(self, calls, content, history, row_id) -> str:
        parts = []
        for call in calls:
            arguments = "".join(
                f"<arg_key>{k}</arg_key>\n<arg_value>{scalar_text(v)}</arg_value>\n"
                for k, v in json_arguments(call, row_id).items()
            )
            parts.append(f"\n<tool_call>{call.name}\n{arguments}</tool_call>")
        return "".join(parts)

    def split_tools(self, text: str):
        start = text.find("\n<tool_call>")
        if start < 0:
            return text.removeprefix("\n"), ()
        calls = []
        for m in CALL.finditer(text[start:]):
            arguments = {a["key"]: json_or_text(a["value"]) for a in ARGUMENT.finditer(m["body"])}
            calls.append(ToolCall(m["name"], json.dumps(arguments, ensure_ascii=False)))
        return text[:start].removeprefix("\n"), tuple(calls)

    def end_text(self, reply: Reply) -> str:
        return "<|observation|>" if reply.tool_calls else self.end_of_turn


GLM_46 = GlmFormat(
    name="glm-4.6",
    end_of_turn="<|user|>",
    stop_markers=("<|observation|>",),
    think=("\n<think>", "</think>"),
    always_thinks=True,
    signature=("[gMASK]<sop>", "<arg_key>"),
)
