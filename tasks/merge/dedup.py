"""Exact dedup over 64-bit digests, across and within sources: the first row in scan order wins.

Scan order is the order of the configured sources' directories, then shard name, then row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tasks.merge.filters import CODE, KEPT


@dataclass
class Duplicates:
    """Rows dropped by one dedup key, each beside the row it duplicates (global row indices)."""

    reason: str
    dropped: np.ndarray  # int64
    kept: np.ndarray  # int64, same length


def first_occurrences(keys: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For ascending row indices `rows`, the later rows whose key repeats, and the first row of each."""
    order = np.argsort(keys[rows], kind="stable")  # stable: equal keys stay in scan order
    sorted_keys, sorted_rows = keys[rows][order], rows[order]
    starts = np.ones(len(rows), dtype=bool)
    starts[1:] = sorted_keys[1:] != sorted_keys[:-1]
    group_first = np.maximum.accumulate(np.where(starts, np.arange(len(rows)), 0))
    dropped, kept = sorted_rows[~starts], sorted_rows[group_first][~starts]
    by_row = np.argsort(dropped, kind="stable")
    return dropped[by_row], kept[by_row]


def drop_duplicates(
    reasons: np.ndarray, id_keys: np.ndarray, sequence_keys: np.ndarray, prompt_keys: np.ndarray, has_prompt: np.ndarray
) -> list[Duplicates]:
    """Mark duplicate ids, then identical token sequences, then equal normalised prompts, in place."""
    found = []
    for reason, keys, eligible in (
        ("duplicate_id", id_keys, None),
        ("duplicate_sequence", sequence_keys, None),
        ("duplicate_prompt", prompt_keys, has_prompt),
    ):
        alive = reasons == KEPT
        if eligible is not None:
            alive &= eligible
        dropped, kept = first_occurrences(keys, np.flatnonzero(alive))
        reasons[dropped] = CODE[reason]
        found.append(Duplicates(reason, dropped, kept))
    return found
