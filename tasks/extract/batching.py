"""Deterministic row order, shard cuts and token-budget batches (longest first, minimal padding)."""

from __future__ import annotations


def order_rows(lengths: list[int], keys: list[str]) -> list[int]:
    """Row positions, longest first; ties broken by key so the same input always gives the same order."""
    return sorted(range(len(lengths)), key=lambda i: (-lengths[i], keys[i]))


def cut_shards(lengths: list[int], shard_tokens: int) -> list[list[int]]:
    """Consecutive positions grouped into shards of at most `shard_tokens` (a longer row sits alone)."""
    shards: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for i, n in enumerate(lengths):
        if current and tokens + n > shard_tokens:
            shards.append(current)
            current, tokens = [], 0
        current.append(i)
        tokens += n
    if current:
        shards.append(current)
    return shards


def pack_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Positions of length-sorted rows packed so that rows x longest row <= batch_tokens.

    Rows must come longest first: each batch is then padded to its first row, and neighbours differ
    little in length, so padding stays small. A row longer than the budget runs alone.
    """
    if any(a < b for a, b in zip(lengths, lengths[1:], strict=False)):
        raise ValueError("pack_batches: lengths must be sorted longest first")
    batches: list[list[int]] = []
    current: list[int] = []
    for i, n in enumerate(lengths):
        width = lengths[current[0]] if current else n
        if current and (len(current) + 1) * width > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def padding_tokens(lengths: list[int], batches: list[list[int]]) -> int:
    """Pad positions the batches compute (and never store)."""
    return sum(len(b) * max(lengths[i] for i in b) - sum(lengths[i] for i in b) for b in batches)
