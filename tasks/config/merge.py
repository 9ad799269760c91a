"""The `merge` section: sources, filters, mix and split of the training set."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from tasks.config.base import StrictModel


class MergeSourceConfig(StrictModel):
    name: str
    """Name in the mix report; defaults to the reconstructed table's own source names."""
    path: Path | None = None
    """A reconstructed/ directory; None means this run's own reconstruct output."""
    weight: float | None = Field(None, gt=0)
    """Relative sampling weight; None keeps every row (subject to max_rows)."""
    max_rows: int | None = Field(None, gt=0)
    """Most rows taken from this source; None takes all."""
    min_tokens: int = Field(1, ge=1)
    """Rows with fewer tokens are dropped."""
    max_tokens: int | None = Field(None, gt=0)
    """Rows with more tokens are dropped; None keeps all."""
    drop_truncated: bool = False
    """Drop replies cut by max_tokens. Kept by default: every token of a cut reply is the target's (only its
    end-of-turn token is missing), and the manifest counts them per source (`train_truncated`)."""
    allowed_classes: list[Literal["exact", "bpe_only", "semantic", "unverified"]] = Field(
        default_factory=lambda: ["exact", "bpe_only", "unverified"]
    )
    """Validation classes kept; "unverified" rows had no ground truth."""
    split: Literal["mixed", "train", "eval"] = "mixed"
    """mixed: `merge.eval_size` of its rows are held out; train: all of them train; eval: all of them are held out,
    so a fixed held-out set stays the same while the training sources grow (learning curves, comparisons)."""


class MergeConfig(StrictModel):
    sources: list[MergeSourceConfig] = Field(default_factory=list)
    """Empty means: every source in this run's reconstructed table, unweighted."""
    eval_size: float = Field(0.1, ge=0)
    """Eval rows as a fraction (<1) or a count (>=1), stratified by source, over the sources with split mixed."""
    rows_per_shard: int = Field(10_000, gt=0)
    """Rows per output Parquet shard."""
    memory_budget_mb: int = Field(1024, gt=0)
    """Peak memory the merge may use, in MiB."""
    share_tolerance: float = Field(0.05, ge=0, le=1)
    """Gate: realised source share may differ from the requested one by this much (absolute)."""

    @field_validator("sources")
    @classmethod
    def _unique_names(cls, sources: list[MergeSourceConfig]) -> list[MergeSourceConfig]:
        names = [s.name for s in sources]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"source names must be unique; repeated: {repeated}")
        return sources

    @field_validator("eval_size")
    @classmethod
    def _whole_count(cls, value: float) -> float:
        if value >= 1 and value != int(value):
            raise ValueError(f"eval_size >= 1 is a row count and must be whole (got {value})")
        return value
