"""Whitespace a provider dropped at a parser join, restored where its habit and the provider's count settle it.

Reasoning parsers have stripped the whitespace around `reasoning_content`, the content and the text before tool
calls (SGLang's Kimi parser until sgl-project/sglang #24251), and Kimi-K2.5's template puts nothing between
`</think>` and the content: the text such a provider returns rebuilds a few tokens short of its `completion_tokens`.

The count says how many tokens are missing, not which whitespace: a newline, two, or a space before a word are one
token each in most vocabularies. What the model usually writes at each join is read from the source's rows that
carry ids (their decoded text, split by the chat format, keeps it, and their returned text shows the provider
dropping it): its habit. A row off its count gets the habit's whitespace at every bare join where that reaches the
provider's length; else where exactly one choice of those joins does. Without a habit nothing says what was
dropped (a count off by one may be the provider's convention): the row is left as it is. Where guided runs, the
target's likelihood must agree: other whitespace at the same joins with the same count must not be more likely.
Rows the count cannot settle stay as they were, off their count.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import replace

from tasks.reconstruct.methods import completion_ids
from tasks.reconstruct.render import ChatTurn, RenderedTurn, RowError, render_turn
from tasks.target_model.formats import ChatFormat
from tasks.target_model.tokens import EndOfTurn, codec

RESTORED, UNSETTLED = "restored", "unsettled"  # the `whitespace` column of a row it was tried on
JOINS = (("reasoning", "start"), ("reasoning", "end"), ("content", "start"), ("content", "end"))
HABIT_SHARE = 0.8  # of a source's rows with ids that agree on a join's whitespace, for it to be the habit
SPACES = ("\n", "\n\n", " ")  # what else a model may write at a join, for the likelihood to weigh
MARGIN_NATS = 1.0  # how much more likely other whitespace of the same count must be to unsettle a restoration

Scorer = Callable[[list[int], list[list[int]]], list[float]]  # prompt ids, reply ids -> log-likelihood of each
Habits = dict[str, dict[tuple[str, str], str]]  # source -> join -> the whitespace the model writes there ("": none)


def edge_space(text: str, edge: str) -> str:
    return text[: len(text) - len(text.lstrip())] if edge == "start" else text[len(text.rstrip()) :]


def learn_habits(tokenizer, rows: list[dict], chat_format: ChatFormat, end_of_turn: EndOfTurn) -> Habits:
    """Per source, the whitespace the model wrote at each join on most (HABIT_SHARE) of its rows with ids, for the
    joins where the provider's text was seen without it (a join it never stripped has nothing to restore)."""
    tokens = codec(tokenizer)
    seen: dict[str, dict[tuple[str, str], Counter]] = defaultdict(lambda: defaultdict(Counter))
    stripped: dict[str, set] = defaultdict(set)
    with_ids = [row.get("token_ids") is not None and row.get("prompt_token_ids") is not None for row in rows]
    text_only = {row.get("source") or "" for row, ids in zip(rows, with_ids, strict=True) if not ids}
    for row, ids in zip(rows, with_ids, strict=True):
        # Only sources with text-only rows have anything to restore; a reply cut at its limit shows no end of turn.
        if not ids or (row.get("source") or "") not in text_only or row.get("finish_reason") == "length":
            continue
        prompt, ids = row["prompt_token_ids"], completion_ids(row["token_ids"], end_of_turn, False)
        ids = ids[:-1] if ids and ids[-1] in end_of_turn.ids else ids
        reply = chat_format.parse(tokens.decode(ids, reply=not tokens.ends_in_special(prompt)), tokens.decode(prompt))
        written = {"reasoning": reply.reasoning or "", "content": reply.content}
        returned = {"reasoning": row.get("reasoning") or "", "content": row.get("content") or ""}
        for channel, edge in JOINS:
            there = bool(reply.tool_calls) if (channel, edge) == ("content", "end") else bool(written[channel].strip())
            if not there:
                continue
            space = edge_space(written[channel], edge)
            seen[row.get("source") or ""][(channel, edge)][space] += 1
            if space and not edge_space(returned[channel], edge):
                stripped[row.get("source") or ""].add((channel, edge))
    habits: Habits = {}
    for source, joins in seen.items():
        habits[source] = {}
        for join, counts in joins.items():
            space, n = counts.most_common(1)[0]
            if n >= HABIT_SHARE * sum(counts.values()) and (not space or join in stripped[source]):
                habits[source][join] = space  # "" too: the model writes nothing there
    return habits


def bare_joins(turn: ChatTurn) -> list[tuple[str, str]]:
    """The parser joins where the returned text has no whitespace."""
    content = turn.content or ""
    bare = {
        ("reasoning", "start"): bool(turn.reasoning) and not turn.reasoning[0].isspace(),
        ("reasoning", "end"): bool(turn.reasoning) and not turn.reasoning[-1].isspace(),
        ("content", "start"): bool(content) and not content[0].isspace(),
        ("content", "end"): bool(turn.tool_calls) and not (content and content[-1].isspace()),
    }
    return [join for join in JOINS if bare[join]]


def with_spaces(turn: ChatTurn, spaces: dict[tuple[str, str], str]) -> ChatTurn:
    fields = {"reasoning": turn.reasoning, "content": turn.content or ""}
    for (channel, edge), space in spaces.items():
        fields[channel] = space + fields[channel] if edge == "start" else fields[channel] + space
    return replace(turn, **fields)


def restore_whitespace(
    tokenizer,
    turn: ChatTurn,
    rendered: RenderedTurn,
    chat_format: ChatFormat,
    echoed: str,
    expected_reply: int,
    habit: dict[tuple[str, str], str],
    score: Scorer | None = None,
) -> tuple[str | None, RenderedTurn | None]:
    """(RESTORED, the row rendered with the one restoration whose reply has `expected_reply` tokens, end-of-turn token
    included on a finished reply), (UNSETTLED, None) where none or several different ones do, or where `score` (the
    target's log-likelihood of replies after the prompt, where guided runs) prefers other whitespace of the same
    count by more than MARGIN_NATS; (None, None) where the source has no habit at the row's bare joins."""
    tokens = codec(tokenizer)
    prompt = rendered.text[: rendered.gen_start]
    after_special = tokens.dummy_prefix and tokens.ends_in_special(tokens.encode(prompt))
    joins = bare_joins(turn)

    def fitting(spaces: dict[tuple[str, str], str]) -> RenderedTurn | None:
        try:
            tried = render_turn(with_spaces(turn, spaces), prompt, chat_format, echoed)
        except RowError:
            return None
        return tried if len(tokens.encode_reply(tried.generated, after_special)) == expected_reply else None

    if not joins or not all(j in habit for j in joins):  # no habit there: nothing says what was dropped
        return None, None
    chosen = fitting({j: habit[j] for j in joins})  # the model's usual whitespace at every join first
    if chosen is None:
        fits = {}
        for keep in itertools.product((False, True), repeat=len(joins)):
            spaces = {j: habit[j] for j, kept in zip(joins, keep, strict=True) if kept and habit[j]}
            tried = fitting(spaces) if spaces else None
            fits |= {tried.generated: tried} if tried is not None else {}
        chosen = next(iter(fits.values())) if len(fits) == 1 else None
    if chosen is None:
        return UNSETTLED, None
    if score is not None:  # the same count with other whitespace at the joins: the likelihood must agree
        rivals = {
            tried.generated
            for spaces in itertools.product(("", *SPACES), repeat=len(joins))
            if (tried := fitting(dict(zip(joins, spaces, strict=True)))) is not None and tried.generated != chosen.generated
        }
        if rivals:
            ids = tokens.encode(prompt)
            mine, *theirs = score(ids, [tokens.encode_reply(t, after_special) for t in [chosen.generated, *rivals]])
            if max(theirs) > mine + MARGIN_NATS:
                return UNSETTLED, None
    return RESTORED, chosen


def likelihood(model) -> Scorer:
    """The target's log-likelihood of each reply after the prompt (one forward each: only restored rows are scored)."""
    import torch

    def score(prompt: list[int], replies: list[list[int]]) -> list[float]:
        out = []
        for reply in replies:
            ids = torch.tensor([prompt + reply], device=model.device)
            with torch.no_grad():
                logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
            picked = torch.log_softmax(logits, -1).gather(1, ids[0, len(prompt) :, None])
            out.append(float(picked.sum()))
        return out

    return score
