"""gpt-oss (`gpt-oss`, the harmony format): reasoning in the `analysis` channel, the answer in `final`.

The generation prompt ends with `<|start|>assistant`; the model writes a channel header for each
message it emits. A final answer ends with `<|return|>`, a tool call (one per turn, to=functions.NAME in
the header, JSON in the `commentary` channel) with `<|call|>`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tasks.target_model.formats.base import ChatFormat, Reply, RowError, ToolCall, json_arguments

ANALYSIS = "<|channel|>analysis<|message|>"
FINAL = "<|channel|>final<|message|>"
NEXT = "<|end|><|start|>assistant"
CALL = re.compile(r" to=functions\.(?P<name>[^<\s]+)<\|channel\|>commentary (?:json)?<\|message\|>(?P<arguments>.*)", re.S)


@dataclass(frozen=True)
class HarmonyFormat(ChatFormat):
    def completion(self, reply: Reply, prompt: str, history: list[dict], row_id: str = "", request: dict | None = None) -> str:
        if len(reply.tool_calls) > 1:
            raise RowError("format_cannot_express", "tool_calls", f"row {row_id!r}: gpt-oss makes one tool call per turn")
        if reply.tool_calls and reply.content:
            raise RowError(
                "format_cannot_express", "content", f"row {row_id!r}: gpt-oss writes no final answer beside a tool call"
            )
        text = f"{ANALYSIS}{reply.reasoning}" if reply.reasoning is not None else ""
        if reply.cut_in_reasoning:
            return text
        text += NEXT if text else ""
        if reply.tool_calls:
            call = reply.tool_calls[0]
            json_arguments(call, row_id)
            text += f" to=functions.{call.name}<|channel|>commentary json<|message|>{call.arguments}"
        else:
            text += f"{FINAL}{reply.content}"
        return text if reply.truncated else text + ("<|call|>" if reply.tool_calls else self.end_of_turn)

    def parse(self, text: str, prompt: str) -> Reply:
        reasoning = None
        if text.startswith(ANALYSIS):
            reasoning, _, text = text[len(ANALYSIS) :].partition(NEXT)
        if text.startswith(FINAL):
            return Reply(reasoning, text[len(FINAL) :])
        call = CALL.match(text)
        if call:
            return Reply(reasoning, "", (ToolCall(call["name"], call["arguments"]),))
        return Reply(reasoning, text)


GPT_OSS = HarmonyFormat(
    name="gpt-oss",
    end_of_turn="<|return|>",
    stop_markers=("<|call|>",),
    signature=("<|channel|>", "<|return|>"),
    extra_markers=("<|start|>", "<|end|>", "<|channel|>", "<|message|>"),
)
