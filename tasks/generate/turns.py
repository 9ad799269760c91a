"""Whole conversations regenerated turn by turn (`generate.sources[].regenerate: each_turn`).

The target answers every user turn of a conversation in order, each request carrying the target's own earlier
replies as history, not the dataset's. Turn k of conversation `c` is journaled as `c#tk` (resume and
never-buy-twice hold per turn), and is asked only once turn k - 1 is in the journal. Each turn is one training row:
the history the target saw and its reply to it.

Where the dataset answered an assistant tool call with tool results, the target's regenerated calls must match the
recorded ones (the same names and arguments, in any order): the recorded results are then spliced in, addressed to
the target's call ids; otherwise the conversation stops after that turn, with its reason.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from tasks.generate.client import has_reply
from tasks.generate.journal import JournalState


def turn_id(conversation: str, k: int) -> str:
    return f"{conversation}#t{k}"


@dataclass
class Walk:
    """How far a conversation got: its journaled turns in order, the next turn to ask (if one is due), and why it
    stopped short of its end (None while it can go on, or once every turn is in)."""

    records: list[dict] = field(default_factory=list)
    next_prompt: dict | None = None
    stop: str | None = None
    detail: str = ""
    stopped_at: str = ""  # the id of the first turn the stop leaves unanswered

    def stopped(self, reason: str, turn: str, detail: str) -> Walk:
        self.stop, self.stopped_at, self.detail = reason, turn, detail
        return self


def turn_positions(conversation: list[dict]) -> list[int]:
    """Where each turn's reply goes: every assistant message of the dataset, and the end when the conversation ends
    on a user or tool message (a last turn the dataset left unanswered)."""
    positions = [i for i, m in enumerate(conversation) if m.get("role") == "assistant"]
    if conversation and conversation[-1].get("role") != "assistant":
        positions.append(len(conversation))
    return positions


def first_turn(conversation: list[dict]) -> list[dict]:
    """The messages before the first turn's reply: what the first request sends."""
    return conversation[: turn_positions(conversation)[0]] if conversation else []


def _calls(calls: list[dict] | None) -> Counter:
    """Tool calls as a multiset of (name, arguments in canonical JSON); arguments that are no JSON stay as text."""
    out: Counter = Counter()
    for call in calls or []:
        fn = call.get("function") or {}
        arguments = fn.get("arguments")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            pass
        out[(fn.get("name"), json.dumps(arguments, sort_keys=True))] += 1
    return out


def assistant_message(record: dict) -> dict:
    """The target's reply as the next request's history carries it: content and tool calls (the reasoning is not
    sent back, as chat APIs and the templates that drop earlier reasoning have it)."""
    message = {"role": "assistant", "content": record.get("content") or ""}
    if record.get("tool_calls"):
        message["tool_calls"] = json.loads(record["tool_calls"])
    return message


def names(calls: list[dict]) -> list[str]:
    return sorted(str((c.get("function") or {}).get("name")) for c in calls)


def splice_results(recorded: dict, reply: dict, segment: list[dict]) -> tuple[list[dict] | None, str]:
    """The dataset's messages after a turn, their tool results addressed to the target's calls; None and why when
    the target's calls are not the recorded ones. recorded: the dataset's assistant message; reply: the target's."""
    ours, theirs = reply.get("tool_calls") or [], recorded.get("tool_calls") or []
    if not any(m.get("role") == "tool" for m in segment):
        return (None, f"the target called {names(ours)} where the conversation has no tool result") if ours else (segment, "")
    if not theirs:
        return None, "the conversation has tool results after a turn without structured tool calls"
    if _calls(ours) != _calls(theirs):
        return None, f"the target called {names(ours)}; the conversation {names(theirs)} (names or arguments differ)"
    free, paired = list(ours), []  # each recorded call's regenerated twin (same name and arguments)
    for call in theirs:
        twin = next(c for c in free if _calls([c]) == _calls([call]))
        free.remove(twin)
        paired.append(twin.get("id"))
    recorded_ids = [c.get("id") for c in theirs]
    spliced, nth = [], 0
    for m in segment:
        if m.get("role") == "tool":  # by the recorded call id it answers, else by order
            j = recorded_ids.index(m["tool_call_id"]) if m.get("tool_call_id") in recorded_ids else min(nth, len(paired) - 1)
            m, nth = m | {"tool_call_id": paired[j]}, nth + 1
        spliced.append(m)
    return spliced, ""


def walk(row: dict, state: JournalState, max_prompt_chars: int | None = None) -> Walk:
    """Follow one `each_turn` conversation through the journal, as far as its turns are in."""
    conversation = row["conversation"]
    positions = turn_positions(conversation)
    out = Walk()
    history: list[dict] = []
    start = 0
    for k, position in enumerate(positions, 1):
        tid, where = turn_id(row["id"], k), f"turn {k} of {len(positions)}"
        segment = conversation[start:position]
        if k > 1:
            segment, why = splice_results(conversation[start - 1], history[-1], segment)
            if segment is None:
                return out.stopped("tool_call_mismatch", tid, f"{where}: {why}")
        if not any(m.get("role") in ("user", "tool") for m in segment):
            return out.stopped("no_user_turn", tid, f"{where}: no user or tool message before it")
        prompt = history + segment
        chars = sum(len(m.get("content") or "") for m in prompt)
        if max_prompt_chars is not None and chars > max_prompt_chars:
            return out.stopped("prompt_too_long", tid, f"{where}: {chars} chars > max_prompt_chars {max_prompt_chars}")
        record = state.done.get(tid)
        if record is None:
            out.next_prompt = {
                "id": tid,
                "source": row["source"],
                "messages": json.dumps(prompt, ensure_ascii=False),
                "tools": row["tools"],
            }
            failure = state.failed.get(tid)
            return out.stopped(failure["kind"], tid, f"{where}: {failure.get('detail')}") if failure else out
        if not has_reply(record):
            return out.stopped("empty_reply", tid, f"{where}: the reply has no content, tool calls or reasoning")
        out.records.append(record)
        if record.get("truncated") and k < len(positions):
            return out.stopped("truncated_turn", turn_id(row["id"], k + 1), f"{where} was cut at max_tokens")
        history = prompt + [assistant_message(record)]
        start = position + 1
    return out
