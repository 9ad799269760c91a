"""Count verdicts: the provider's own token counts (`usage`) against the rebuilt ids, row by row.

A provider counts `prompt_tokens` and `completion_tokens` with the target's own tokenizer, so a rebuilt reply
whose length differs from what the provider counted cannot be the target's tokenization, and a prompt whose
length differs was rendered otherwise (another template version, an injected system prompt, tools or history
arguments written differently). A match is strong evidence, not proof: a re-split of the same length passes.
What a provider counts varies (the end-of-turn token, a BOS, reasoning, cached prompt tokens): the source's
`counts` convention says, and validate checks the convention on the rows whose true ids are known.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tasks.config import CountConvention
from tasks.contracts import COUNT_VERIFIED as VERIFIED
from tasks.contracts import PROMPT_COUNT_MISMATCH as PROMPT_MISMATCH
from tasks.contracts import REPLY_COUNT_MISMATCH as REPLY_MISMATCH
from tasks.contracts import UNCOUNTED, quarantine_row
from tasks.target_model.tokens import codec


@dataclass(frozen=True)
class Reported:
    """What the provider's `usage` said of one reply (None: not reported)."""

    prompt: int | None
    completion: int | None
    reasoning: int | None = None
    cached: int | None = None

    @classmethod
    def of(cls, row: dict) -> Reported:
        """From a generations row."""
        return cls(row.get("prompt_tokens"), row.get("completion_tokens"), row.get("reasoning_tokens"), row.get("cached_tokens"))


@dataclass(frozen=True)
class ReasoningSpan:
    """Where the reasoning sits in the generated text, in characters from its start: the reasoning itself, and the
    whole block with its markers (what follows is the rest of the reply)."""

    start: int
    stop: int
    block_end: int


def expected_prompt(reported: Reported, convention: CountConvention) -> int | None:
    """The rebuilt prompt's length that the provider's `prompt_tokens` implies."""
    if reported.prompt is None:
        return None
    uncached = 0 if convention.cached_in_prompt else reported.cached or 0
    return reported.prompt + uncached - convention.prompt_offset


def expected_reply(reported: Reported, convention: CountConvention, finished: bool) -> int | None:
    """The rebuilt reply's length (end-of-turn token included on a finished reply) its `completion_tokens` implies."""
    if reported.completion is None:
        return None
    uncounted_end = int(finished and not convention.end_of_turn)
    apart = 0 if convention.reasoning_in_completion else reported.reasoning or 0
    return reported.completion + uncounted_end + apart


def tokens_over(reply_ids: np.ndarray, tokenizer, text: str, start: int, stop: int) -> int:
    """How many reply tokens cover characters [start, stop) of the generated text `text`."""
    if stop <= start:
        return 0
    ends = np.cumsum([len(piece) for piece in codec(tokenizer).pieces(reply_ids, reply=True)])
    lo, hi = len(text[:start].encode("utf-8")), len(text[:stop].encode("utf-8"))
    begins = ends - np.diff(np.concatenate([[0], ends]))
    return int(((ends > lo) & (begins < hi)).sum())


@dataclass(frozen=True)
class CountCheck:
    """One row's counts, rebuilt and as the provider reported them, and the verdict."""

    prompt_tokens: int
    reply_tokens: int
    reasoning_tokens: int | None  # rebuilt, counted as the convention counts reasoning; None: no reasoning
    expected_prompt: int | None
    expected_reply: int | None
    expected_reasoning: int | None

    @property
    def prompt_ok(self) -> bool | None:
        return None if self.expected_prompt is None else self.prompt_tokens == self.expected_prompt

    @property
    def reply_ok(self) -> bool | None:
        """The reply's length against completion_tokens, reasoning included: the count providers get right. A reported
        reasoning count does not decide (vLLM counted 0 for templates that prefill `<think>`, K2.5's among them);
        where it disagrees, `reasoning_unreliable` says so."""
        return None if self.expected_reply is None else self.reply_tokens == self.expected_reply

    @property
    def reasoning_unreliable(self) -> bool:
        """The provider's reasoning count disagrees with the rebuilt reasoning while its completion count agrees."""
        disagrees = self.expected_reasoning is not None and self.reasoning_tokens != self.expected_reasoning
        return disagrees and self.reply_ok is True

    @property
    def verdict(self) -> str:
        if self.reply_ok is None and self.prompt_ok is None:
            return UNCOUNTED
        if self.reply_ok is False:
            return REPLY_MISMATCH
        return PROMPT_MISMATCH if self.prompt_ok is False else VERIFIED


def check_counts(
    tokenizer,
    prompt_len: int,
    reply_ids: np.ndarray,
    reported: Reported,
    convention: CountConvention,
    finished: bool,
    generated: str = "",
    reasoning: ReasoningSpan | None = None,
) -> CountCheck:
    """The count check of one rebuilt row: `prompt_len` prompt tokens, then `reply_ids`; `generated` is the reply's
    text (needed only to place its reasoning, where the provider counts reasoning apart)."""
    counted_reasoning = expected_reasoning = None
    if reasoning is not None and reported.reasoning is not None:  # recorded beside the verdict, never deciding it
        lo, hi = (0, reasoning.block_end) if convention.reasoning_markers else (reasoning.start, reasoning.stop)
        counted_reasoning = tokens_over(reply_ids, tokenizer, generated, lo, hi)
        expected_reasoning = reported.reasoning
    return CountCheck(
        prompt_len,
        len(reply_ids),
        counted_reasoning,
        expected_prompt(reported, convention),
        expected_reply(reported, convention, finished),
        expected_reasoning,
    )


def count_columns(checks: list[CountCheck]) -> dict[str, list]:
    """The `reconstructed` table's count columns for these rows."""
    return {
        "prompt_count": [c.prompt_tokens for c in checks],
        "reply_count": [c.reply_tokens for c in checks],
        "reasoning_count": [c.reasoning_tokens for c in checks],
        "provider_prompt_count": [c.expected_prompt for c in checks],
        "provider_reply_count": [c.expected_reply for c in checks],
        "provider_reasoning_count": [c.expected_reasoning for c in checks],
        "count_verdict": [c.verdict for c in checks],
    }


def row_check(row: dict) -> CountCheck:
    """The count check a `reconstructed` row records."""
    return CountCheck(
        row["prompt_count"],
        row["reply_count"],
        row["reasoning_count"],
        row["provider_prompt_count"],
        row["provider_reply_count"],
        row["provider_reasoning_count"],
    )


def recount(check: CountCheck, tokenizer, reply_ids, generated: str, reasoning: ReasoningSpan | None, markers: bool):
    """The same row's check after its reply was re-split (same bytes, other tokens)."""
    counted = check.reasoning_tokens
    if check.expected_reasoning is not None and reasoning is not None:
        lo, hi = (0, reasoning.block_end) if markers else (reasoning.start, reasoning.stop)
        counted = tokens_over(np.asarray(reply_ids), tokenizer, generated, lo, hi)
    return CountCheck(
        check.prompt_tokens, len(reply_ids), counted, check.expected_prompt, check.expected_reply, check.expected_reasoning
    )


def recount_rows(rows: list[dict], changed: set, tokenizer, spans: dict, markers) -> None:
    """Count again, in place, the rows whose reply was re-split (`markers(source)`: the convention's reasoning_markers)."""
    for row in rows:
        if row["id"] not in changed:
            continue
        generated, reasoning = spans.get(row["id"], ("", None))
        reply = row["input_ids"][row["prompt_count"] :]
        check = recount(row_check(row), tokenizer, reply, generated, reasoning, markers(row["source"]))
        row.update({k: v[0] for k, v in count_columns([check]).items()})


def count_policy(rows: list[dict], policy: str, stage: str) -> tuple[list[dict], list[dict]]:
    """Apply `reconstruct.count_mismatch` to rows whose reply length is not the provider's: (rows kept, quarantined)."""
    kept, refused = [], []
    for row in rows:
        if row["count_verdict"] != REPLY_MISMATCH or policy == "keep":
            kept.append(row)
            continue
        detail = (
            f"row {row['id']!r}: the rebuilt reply has {row['reply_count']} tokens where the provider counted "
            f"{row['provider_reply_count']}"
            + (
                f" (reasoning {row['reasoning_count']} vs {row['provider_reasoning_count']})"
                if row["provider_reasoning_count"] is not None
                else ""
            )
        )
        if policy == "quarantine":
            refused.append(quarantine_row(stage, row["id"], row["source"], REPLY_MISMATCH, detail, "completion_tokens"))
            continue
        row.update(loss_mask=[0] * len(row["loss_mask"]), num_trained=0, last_trained_id=-1)
        kept.append(row)
    return kept, refused
