"""Compare rebuilt ids with ground truth: exact, bpe_only (same text) or semantic (text differs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

EXACT, BPE_ONLY, SEMANTIC, UNVERIFIED = "exact", "bpe_only", "semantic", "unverified"
CLASSES = (EXACT, BPE_ONLY, SEMANTIC, UNVERIFIED)
MARK = " ▶ "  # where the first divergence is, in a context string


@dataclass(frozen=True)
class Verdict:
    klass: str
    first_divergence: int | None = None
    truth_context: str | None = None
    rebuilt_context: str | None = None


def through_turn_end(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Ids up to and including the last trained token: aligns rows on the end of the assistant turn."""
    hits = np.flatnonzero(mask)
    return ids[: hits[-1] + 1] if hits.size else ids[:0]


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First index where the sequences differ (the shorter one's length when one is a prefix), None if equal."""
    a, b = np.asarray(a), np.asarray(b)
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    if diff.size:
        return int(diff[0])
    return None if a.size == b.size else n


def token_context(tokenizer, ids: Sequence[int], at: int, width: int) -> str:
    """Token strings around index `at`, each shown as its decoded text (repr), the divergence marked."""
    ids = list(ids)
    before = [repr(tokenizer.decode([i], skip_special_tokens=False)) for i in ids[max(0, at - width) : at]]
    after = [repr(tokenizer.decode([i], skip_special_tokens=False)) for i in ids[at : at + width]]
    return " ".join(before) + MARK + " ".join(after)


def decode_text(tokenizer, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False)


def classify_ids(tokenizer, truth: Sequence[int], rebuilt: Sequence[int], context: int = 4) -> Verdict:
    """Both sequences must already end at the end of the assistant turn."""
    at = first_divergence(truth, rebuilt)
    if at is None:
        return Verdict(EXACT)
    same_text = decode_text(tokenizer, truth) == decode_text(tokenizer, rebuilt)
    return Verdict(
        BPE_ONLY if same_text else SEMANTIC,
        at,
        token_context(tokenizer, truth, at, context),
        token_context(tokenizer, rebuilt, at, context),
    )
