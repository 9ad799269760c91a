"""Kimi-K2.5 replies as a provider whose reasoning parser stripped the whitespace at its joins returns them.

The model writes its own whitespace at each join (HABIT: none after `<think>`, a newline before `</think>`, two
before the content, a newline before the tool calls). The provider returns each channel `.strip()`ped, as SGLang's
Kimi parser did before sgl-project/sglang #24251, counts `completion_tokens` on what the model wrote, and returns the
token ids too on every `with_ids_every`-th row.
"""

from __future__ import annotations

import json
import random
from collections import Counter

from tasks.config import ReconstructConfig
from tasks.reconstruct.rebuild import rebuild_rows
from tasks.reconstruct.whitespace import RESTORED, UNSETTLED
from tasks.target_model.formats import FORMATS, Reply, ToolCall
from tasks.target_model.tokens import codec
from tests.support.family_rows import arguments_for, bfcl_prompts, sharegpt_pairs

HABIT = ("", "\n", "\n\n", "\n")  # reasoning start and end, content start, before the tool calls


def stripped_rows(tokenizer, n: int, with_ids_every: int = 4, strays: float = 0.0) -> list[tuple[dict, str]]:
    """(the API row, the text the model generated) for `n` real prompts: every third one answered with tool calls,
    every third asked with thinking off; on a `strays` share of rows the model writes other whitespace at one join."""
    fmt, tokens, rng = FORMATS["kimi-k2.5"], codec(tokenizer), random.Random(0)
    chats, tools = sharegpt_pairs(n), bfcl_prompts(n)
    out = []
    for i in range(n):
        calls: tuple[ToolCall, ...] = ()
        if i % 3 == 2:
            messages, row_tools = tools[i % len(tools)]
            calls = (ToolCall(row_tools[0]["function"]["name"], arguments_for(row_tools[0], messages[-1]["content"])),)
            reasoning, content = "The first tool answers this.", "Let me check."
        else:
            (messages, text), row_tools = chats[i % len(chats)], None
            reasoning, content = f"The user asks: {messages[-1]['content'][:60].strip()}", text[:200].strip()
        thinking = i % 3 != 1
        spaces = list(HABIT)
        if rng.random() < strays:
            join = rng.choice([j for j in range(4) if (thinking or j >= 2) and (calls or j != 3)])
            spaces[join] = rng.choice([s for s in ("", "\n", "\n\n", " ") if s != HABIT[join]])
        body = spaces[0] + reasoning + spaces[1] if thinking else None
        written = Reply(body, spaces[2] + content + (spaces[3] if calls else ""), calls)
        kwargs = {} if thinking else {"thinking": False}
        prompt = tokenizer.apply_chat_template(messages, tools=row_tools, tokenize=False, add_generation_prompt=True, **kwargs)
        generated = fmt.completion(written, prompt, messages, f"stripped-{i}")
        ids = tokens.encode_reply(generated)
        calls_json = [
            {"id": f"functions.{c.name}:0", "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
        row = {
            "id": f"stripped-{i:03d}",
            "source": "stripped",
            "messages": json.dumps(messages, ensure_ascii=False),
            "tools": json.dumps(row_tools, ensure_ascii=False) if row_tools else None,
            "reasoning": written.reasoning.strip() if thinking else None,
            "content": written.content.strip(),
            "tool_calls": json.dumps(calls_json, ensure_ascii=False) if calls else None,
            "finish_reason": "tool_calls" if calls else "stop",
            "template_kwargs": json.dumps(kwargs) if kwargs else None,
            "prompt_tokens": len(tokens.encode(prompt)),
            "completion_tokens": len(ids),
        }
        if with_ids_every and i % with_ids_every == 0:
            row |= {"prompt_token_ids": tokens.encode(prompt), "token_ids": ids}
        out.append((row, generated))
    return out


def outcomes(tokenizer, target, pairs: list[tuple[dict, str]], score=None) -> Counter:
    """Per row: `kept` (on its count as returned: whole, or `unseen`, stripped to as many tokens), `restored` (to what
        the model wrote), `wrong` (restored to something else), `left` (off its count, unsettled); `too_long` rows (over
    target.max_length, with tools) are not rebuilt."""
    config = ReconstructConfig(methods=["reencode"])
    result = rebuild_rows(tokenizer, [row for row, _ in pairs], target, config, score=score)
    assert all(q["reason"] == "too_long" for q in result.quarantine), result.quarantine[:2]
    tokens, truth = codec(tokenizer), {row["id"]: text for row, text in pairs}
    found = Counter({"too_long": len(result.quarantine)})
    for row in result.table.to_pylist():
        reply = tokens.decode(row["input_ids"][row["prompt_count"] :])
        if row["whitespace"] == RESTORED:
            found["restored" if reply == truth[row["id"]] else "wrong"] += 1
            assert row["count_verdict"] == "count_verified"
        elif row["count_verdict"] == "count_verified":
            found["kept" if reply == truth[row["id"]] else "unseen"] += 1
        else:
            assert row["whitespace"] in (UNSETTLED, None) and row["count_verdict"] == "reply_count_mismatch"
            found["left"] += 1
    return found
