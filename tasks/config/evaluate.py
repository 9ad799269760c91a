"""The `evaluate` section: acceptance length on held-out prompts and its gate."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tasks.config.base import StrictModel


class EvaluateConfig(StrictModel):
    engine: Literal["transformers", "vllm"] = "transformers"
    """What decodes: draftsmith's own loop in transformers, or vLLM servers it starts (section `vllm`), one without
    the draft and one with it, τ and per-position acceptance read from vLLM's spec-decode counters."""
    num_prompts: int = Field(8, gt=0)
    """Held-out prompts (from the merged eval split) to decode."""
    max_new_tokens: int = Field(64, gt=0)
    """Tokens generated per held-out prompt."""
    num_draft_tokens: int = Field(4, ge=1)
    """Draft tokens proposed per target forward (a chain, as SGLang's steps=3/draft=4)."""
    min_acceptance_length: float = Field(1.0, ge=0)
    """Gate: mean acceptance length over prompts (tokens per target forward) must reach this."""
    min_tau_gain: float | None = Field(0.0, ge=0)
    """Gate: pooled τ must exceed the untrained draft's (same shape, vocabulary and seed) by more than this.
    null: the untrained draft is not decoded and nothing is compared (runs whose budget cannot beat it)."""
    min_first_acceptance: float = Field(0.0, ge=0, le=1)
    """Gate: share of rounds whose first drafted token is accepted must reach this."""
