"""Loss masks from character offsets: a token is trained when it covers any generated character."""

from __future__ import annotations

import numpy as np


def mask_from_offsets(offsets: np.ndarray, gen_start: int, gen_end: int) -> np.ndarray:
    """offsets (T, 2) char spans -> (T,) int8, 1 where the token overlaps [gen_start, gen_end)."""
    starts, ends = offsets[:, 0], offsets[:, 1]
    return ((ends > gen_start) & (starts < gen_end)).astype(np.int8)


def run_masks(lengths: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Flat (sum T,) int8 masks of many rows, 1 on tokens first..last of each row, in one vectorised pass.

    Offsets grow monotonically, so the tokens overlapping a character span are always one run.
    """
    position = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)  # index in its row
    return ((position >= np.repeat(first, lengths)) & (position <= np.repeat(last, lengths))).astype(np.int8)
