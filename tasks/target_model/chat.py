"""The target's chat format and end-of-turn ids, resolved once from its tokenizer and config."""

from __future__ import annotations

import json

from tasks.config import TargetConfig
from tasks.target_model.formats import ChatFormat, get_format
from tasks.target_model.tokens import EndOfTurn, TokenResolutionError, codec, verify_single_token


def chat_format_of(tokenizer, target: TargetConfig) -> ChatFormat:
    """`target.chat_format`, or for `auto` the family detected from the tokenizer's template (else the template)."""
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    return get_format(target.chat_format, template, tokenizer)


def resolve_end_of_turn(tokenizer, target: TargetConfig) -> EndOfTurn:
    """The token that closes a generated turn (configured, else the format's, else eos), proven by round trip.

    `also` holds the format's other closing tokens that this vocabulary has (a tool-call turn may end
    with its own marker; Llama-3.0 has no `<|eom_id|>`, 3.1 does).
    """
    fmt = chat_format_of(tokenizer, target)
    text = target.end_of_turn or fmt.end_of_turn or tokenizer.eos_token
    if not text:
        raise TokenResolutionError("no end-of-turn token: set target.end_of_turn")
    added = codec(tokenizer).added
    others = tuple(verify_single_token(tokenizer, m) for m in fmt.stop_markers if m in added)
    return EndOfTurn(text, verify_single_token(tokenizer, text), others)


def template_messages(messages: list[dict], history_arguments: str = "object") -> list[dict]:
    """Messages as a serving engine hands them to a chat template: tool-call arguments as objects.

    The API carries arguments as JSON text; templates iterate them (`|items`) or re-serialize them
    (`|tojson`), so vLLM and SGLang decode them first. Text that is not a JSON object stays text.
    `history_arguments: as_sent` leaves them as sent (Moonshot's own K2.5 template prints strings as given).
    """
    if history_arguments == "as_sent":
        return messages
    out = []
    for message in messages:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if calls:
            message = {**message, "tool_calls": [_decoded_call(c) for c in calls]}
        out.append(message)
    return out


def _decoded_call(call: dict) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if not isinstance(arguments, str):
        return call
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return call
    return {**call, "function": {**function, "arguments": value}} if isinstance(value, dict) else call
