"""DeepSeek-V3.1 (`deepseek-v3.1`) and V3.2 (`deepseek-v3.2`, DSML tool calls).

Both open the reasoning block in the generation prompt (`<think>` with thinking on, `<think></think>`
off), so the completion starts inside it; the turn ends with `<｜end▁of▁sentence｜>`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from tasks.target_model.formats.base import ChatFormat, ToolCall, json_arguments

EOS = "<｜end▁of▁sentence｜>"
CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, SEP, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
V31_CALL = re.compile(
    re.escape(CALL_BEGIN) + r"(?P<name>.*?)" + re.escape(SEP) + r"(?P<arguments>.*?)" + re.escape(CALL_END), re.S
)
DSML = "｜DSML｜"
DSML_BLOCK = f"\n\n<{DSML}function_calls>\n"
DSML_INVOKE = re.compile(rf'<{DSML}invoke name="(?P<name>[^"]*)">\n(?P<body>.*?)</{DSML}invoke>\n', re.S)
DSML_PARAMETER = re.compile(
    rf'<{DSML}parameter name="(?P<key>[^"]*)" string="(?P<string>true|false)">(?P<value>.*?)</{DSML}parameter>\n', re.S
)


@dataclass(frozen=True)
class DeepSeekV31Format(ChatFormat):
    def tool_text(self, calls, content, history, row_id) -> str:
        if not calls:
            return ""
        for call in calls:
            json_arguments(call, row_id)
        body = "".join(f"{CALL_BEGIN}{c.name}{SEP}{c.arguments}{CALL_END}" for c in calls)
        return f"{CALLS_BEGIN}{body}{CALLS_END}"

    def split_tools(self, text: str):
        start = text.find(CALLS_BEGIN)
        if start < 0:
            return text, ()
        calls = tuple(ToolCall(m["name"], m["arguments"]) for m in V31_CALL.finditer(text[start:]))
        return text[:start], calls


@dataclass(frozen=True)
class DeepSeekV32Format(ChatFormat):
    """DSML: one `invoke` per call, one `parameter` per argument, strings raw and other values as JSON."""

    def tool_text(self, calls, content, history, row_id) -> str:
        if not calls:
            return ""
        invokes = []
        for call in calls:
            parameters = "".join(
                f'<{DSML}parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
                f"{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}</{DSML}parameter>\n"
                for k, v in json_arguments(call, row_id).items()
            )
            invokes.append(f'<{DSML}invoke name="{call.name}">\n{parameters}</{DSML}invoke>\n')
        return f"{DSML_BLOCK}{''.join(invokes)}</{DSML}function_calls>"

    def split_tools(self, text: str):
        start = text.find(DSML_BLOCK)
        if start < 0:
            return text, ()
        calls = []
        for m in DSML_INVOKE.finditer(text[start:]):
            arguments = {
                p["key"]: p["value"] if p["string"] == "true" else json.loads(p["value"])
                for p in DSML_PARAMETER.finditer(m["body"])
            }
            calls.append(ToolCall(m["name"], json.dumps(arguments, ensure_ascii=False)))
        return text[:start], tuple(calls)


DEEPSEEK_V31 = DeepSeekV31Format(
    name="deepseek-v3.1",
    end_of_turn=EOS,
    think=("<think>", "</think>"),
    signature=("<｜Assistant｜>", "<｜tool▁sep｜>", "<think>"),
    extra_markers=(CALLS_BEGIN, CALLS_END, CALL_BEGIN, SEP, CALL_END),
)
DEEPSEEK_V32 = DeepSeekV32Format(
    name="deepseek-v3.2",
    end_of_turn=EOS,
    think=("<think>", "</think>"),
    signature=("<｜Assistant｜>", "DSML"),
)
