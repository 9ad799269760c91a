"""Mix and split: rows per source from weights and caps, a seeded draw, and a stratified eval split.

Weights only ever shrink a source (no row is repeated): weighted sources are drawn as large as the
scarcest of them allows, so their realised shares match the requested ones up to rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tasks.config import MergeSourceConfig
from tasks.merge.filters import KEPT

NOT_DRAWN, TRAIN, EVAL = 0, 1, 2
SPLITS = {TRAIN: "train", EVAL: "eval"}


@dataclass
class SourcePlan:
    """How many rows one source contributes, and why."""

    name: str
    weight: float | None
    max_rows: int | None
    available: int  # rows left after filters and dedup
    selected: int
    eval_rows: int

    @property
    def train_rows(self) -> int:
        return self.selected - self.eval_rows


def plan_sizes(sources: list[MergeSourceConfig], available: list[int]) -> list[int]:
    """Rows drawn per source: every row (up to max_rows), weighted sources scaled to their weights."""
    capped = [min(n, s.max_rows) if s.max_rows is not None else n for s, n in zip(sources, available, strict=True)]
    weighted = [i for i, s in enumerate(sources) if s.weight is not None]
    if not weighted:
        return capped
    # Largest total whose weighted split fits every source's supply.
    scale = min(capped[i] / sources[i].weight for i in weighted)
    sizes = list(capped)
    for i in weighted:
        sizes[i] = min(capped[i], math.floor(sources[i].weight * scale + 1e-9))
    return sizes


def plan_eval(sizes: list[int], eval_size: float) -> list[int]:
    """Eval rows per source: a fraction of each (eval_size < 1) or a count spread by size (>= 1)."""
    if eval_size < 1:
        return [min(n, math.floor(eval_size * n + 0.5)) for n in sizes]
    total = sum(sizes)
    wanted = min(int(eval_size), total)
    if total == 0:
        return [0 for _ in sizes]
    quotas = [wanted * n / total for n in sizes]
    counts = [math.floor(q) for q in quotas]
    # Largest remainder; ties go to the earlier source.
    order = sorted(range(len(sizes)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[: wanted - sum(counts)]:
        counts[i] += 1
    return counts


def plan_mix(sources: list[MergeSourceConfig], available: list[int], eval_size: float) -> list[SourcePlan]:
    sizes = plan_sizes(sources, available)
    evals = [size if s.split == "eval" else 0 for s, size in zip(sources, sizes, strict=True)]
    mixed = [i for i, s in enumerate(sources) if s.split == "mixed"]
    for i, n in zip(mixed, plan_eval([sizes[i] for i in mixed], eval_size), strict=True):
        evals[i] = n
    return [
        SourcePlan(s.name, s.weight, s.max_rows, n, size, e)
        for s, n, size, e in zip(sources, available, sizes, evals, strict=True)
    ]


def draw_rows(
    plans: list[SourcePlan], source_index: np.ndarray, priority: np.ndarray, reasons: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Split code per row (NOT_DRAWN, TRAIN or EVAL), and the kept rows left out by weights or caps.

    Rows are ranked by their seeded priority digest (ties by scan order); each source's first
    `eval_rows` ranks are its eval rows, the next `train_rows` its train rows.
    """
    split = np.zeros(len(reasons), dtype=np.uint8)
    left_out = []
    for index, plan in enumerate(plans):
        rows = np.flatnonzero((source_index == index) & (reasons == KEPT))
        ranked = rows[np.lexsort((rows, priority[rows]))]
        split[ranked[: plan.eval_rows]] = EVAL
        split[ranked[plan.eval_rows : plan.selected]] = TRAIN
        left_out.append(ranked[plan.selected :])
    not_drawn = np.sort(np.concatenate(left_out)) if left_out else np.empty(0, np.int64)
    return split, not_drawn


def requested_shares(plans: list[SourcePlan]) -> dict[str, float | None]:
    """Share of the weighted rows each weighted source asked for (None: no weight, every row)."""
    total = sum(p.weight for p in plans if p.weight is not None)
    return {p.name: (p.weight / total if p.weight is not None else None) for p in plans}


def realised_shares(counts: dict[str, int], plans: list[SourcePlan]) -> dict[str, float]:
    """Realised share per source: among weighted sources for weighted ones, of all rows otherwise."""
    weighted = sum(counts.get(p.name, 0) for p in plans if p.weight is not None)
    everything = sum(counts.values())
    shares = {}
    for p in plans:
        base = weighted if p.weight is not None else everything
        shares[p.name] = counts.get(p.name, 0) / base if base else 0.0
    return shares
