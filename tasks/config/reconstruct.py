"""The `reconstruct` section: the methods that rebuild token ids, and the `guided` search."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from tasks.config.base import StrictModel


class GuidedConfig(StrictModel):
    """The `guided` method: re-split text-only replies to the target's own tokenization, by its likelihood."""

    backend: Literal["transformers", "vllm"] = "transformers"
    """What scores the re-splits: the target in transformers in this process (token trees over its KV cache), or a vLLM
    server draftsmith starts (section `vllm`, as extract's) asked for prompt log-probabilities, for targets
    transformers cannot hold."""
    top_k: int = Field(8, ge=1, le=20)
    """vllm backend: alternatives per position the engine returns; a re-split starts with one of them."""
    engine_concurrency: int = Field(32, gt=0)
    """vllm backend: scoring requests in flight (the engine batches them; shared prefixes hit its prefix cache)."""

    margin_nats: float = Field(0.5, ge=0)
    """An edit is kept when it raises the log-likelihood of its span and window by more than this."""
    candidate_nats: float = Field(2.0, gt=0)
    """A token is tried where the target rates it at most this far below the current token (log-prob)..."""
    min_logprob: float = Field(-4.0, le=0)
    """...and only where it rates the token at least this log-probability (most positions have no such rival)."""
    window: int = Field(4, ge=0)
    """Tokens after an edit scored with it (where a different boundary shows its effect)."""
    retry_nats: float = Field(4.0, ge=0)
    """After an edit, an edit elsewhere that fell this far short of the margin last round is not scored again."""
    ends: int = Field(2, gt=0)
    """Where an edit may end: the first `ends` boundaries of the current ids after its first token."""
    max_rounds: int = Field(8, gt=0)
    """Search budget: rounds of one forward pass plus one batched pass over the edits (an edit can make the
    next one likely: rows of list items change one item per round)."""
    batch_rows: int = Field(8, gt=0)
    """Rows per forward pass."""
    search_rows: int = Field(32, gt=0)
    """Rows searched together: their KV caches are held at once, so that edit trees of similar size from any of
    them share a scoring forward."""
    tree_tokens: int = Field(64, gt=0)
    """Edits are scored as token trees of about this many tokens per row, `batch_rows` trees per forward."""
    count_margin_nats: float = Field(0.0, ge=0)
    """On a row whose length differs from the provider's count, an edit that brings it toward that count (never past
    it) is kept when it gains more than this: the count already says the one-pass split is not the target's."""
    count_candidate_nats: float = Field(4.0, gt=0)
    """candidate_nats on a row whose length differs from the provider's count (a split the target sampled against its
    own odds is still the target's: the count, not the likelihood, says a re-split is due)."""
    count_min_logprob: float = Field(-8.0, le=0)
    """min_logprob on a row whose length differs from the provider's count."""
    break_nats: float = Field(3.0, ge=0)
    """An edit that changes a row's length where the provider's count does not call for it (the row already has the
    count, or the edit moves away from it) is kept only when it gains more than this: only strong evidence says two
    errors cancel there. The row is then searched back to the count for the other one."""
    counted_rows: Literal["skip", "ambiguous", "search"] = "ambiguous"
    """Rows whose one-pass length already has the provider's count: left as one pass made them (`skip`); searched for
    a re-split of the same length at their ambiguous sites only (`ambiguous`: two or three tokens of one word whose
    bytes split into as many tokens another way), when they hold enough of them; or searched everywhere at that count
    (`search`: also two errors that cancel; a forward over every row, three to four times the time of `skip`)."""
    ambiguous_per_token: float = Field(0.015, ge=0)
    """With `counted_rows: ambiguous`, a row at its count is searched when at least this share of its reply tokens
    begin an ambiguous site (a row dense with rare words, names and codes, where same-length re-splits are)."""


class ReconstructConfig(StrictModel):
    methods: list[Literal["server_ids", "logprobs", "reencode", "guided"]] = Field(
        default_factory=lambda: ["server_ids", "logprobs", "guided"]
    )
    """Methods tried in order; a row uses the first one its data allows. For text-only rows: `reencode` (one pass,
    canonical boundaries) or `guided` (re-split to the target's own tokenization by its likelihood; needs its weights)."""
    shard_rows: int = Field(5000, gt=0)
    """Rows per worker shard (Prefect task); coarse shards keep orchestration overhead small."""
    pipeline_rows: int = Field(1000, gt=0)
    """Rows per encode batch inside a shard; the next chunk renders while this one encodes."""
    encode_threads: int = Field(2, gt=0)
    """Threads encoding chunks at once (the tokenizer releases the GIL): about the cores a shard may use."""
    echoed_reasoning: Literal["quarantine", "strip"] = "quarantine"
    """Reasoning that a provider also copied into the content: refuse the row, or drop the copy."""
    guided: GuidedConfig = Field(default_factory=GuidedConfig)
    """Settings of the `guided` method."""
    count_mismatch: Literal["keep", "mask", "quarantine"] = "keep"
    """A row whose rebuilt reply length differs from the provider's count (it is not the target's tokenization, though
    its text is right): keep it, keep it with its loss mask off (merge leaves it out), or quarantine it."""

    @field_validator("methods")
    @classmethod
    def _one_text_method(cls, methods: list[str]) -> list[str]:
        if "reencode" in methods and "guided" in methods:
            raise ValueError("reencode and guided both rebuild text-only rows: list one of them")
        return methods
