"""Format adapters: rewrite a message into one the target's template can express (`target.chat_format`).

"template" passes messages through unchanged. The adapters only move channels the template drops
into the content, in the layout the model itself emits, so the rendered text is what was generated.
"""

from __future__ import annotations

import json

THINK_OPEN = "<think>\n"
THINK_CLOSE = "\n</think>\n\n"
CALL_OPEN = "<tool_call>\n"
CALL_CLOSE = "\n</tool_call>"

CHAT_FORMATS = ("template", "inline-reasoning", "inline-hermes")


def inline_reasoning(reasoning: str | None, content: str) -> str:
    """`<think>` block before the content, as reasoning models emit it; nothing when there is no reasoning."""
    if not reasoning:
        return content
    return f"{THINK_OPEN}{reasoning}{THINK_CLOSE}{content}"


def hermes_call(call: dict) -> str:
    """One tool call as Hermes/Qwen JSON; the arguments string goes in byte for byte (it is already JSON)."""
    function = call["function"]
    name = json.dumps(function["name"], ensure_ascii=False)
    return f'{CALL_OPEN}{{"name": {name}, "arguments": {function["arguments"]}}}{CALL_CLOSE}'


def inline_tool_calls(content: str, tool_calls: list[dict]) -> str:
    calls = "\n".join(hermes_call(c) for c in tool_calls)
    return f"{content}\n{calls}" if content else calls


def adapt_message(message: dict, chat_format: str) -> dict:
    """The message as the template should see it under `chat_format`."""
    if chat_format == "template" or message.get("role") != "assistant":
        return message
    if chat_format not in CHAT_FORMATS:
        raise ValueError(f"target.chat_format {chat_format!r}: expected one of {list(CHAT_FORMATS)}")
    adapted = {k: v for k, v in message.items() if k not in ("reasoning_content", "tool_calls")}
    content = message.get("content") or ""
    if chat_format == "inline-hermes" and message.get("tool_calls"):
        content = inline_tool_calls(content, message["tool_calls"])
    elif message.get("tool_calls"):
        adapted["tool_calls"] = message["tool_calls"]
    adapted["content"] = inline_reasoning(message.get("reasoning_content"), content)
    return adapted
