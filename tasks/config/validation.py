"""The `validation` section: the gate limits on rebuilt ids, per source."""

from __future__ import annotations

from pydantic import Field

from tasks.config.base import StrictModel


class ValidationConfig(StrictModel):
    max_semantic_rate: float = Field(0.0, ge=0, le=1)
    """Gate: share of verified rows whose decoded text differs (a rebuild bug); default none at all."""
    max_bpe_only_rate: float = Field(0.25, ge=0, le=1)
    """Gate: share of verified rows whose ids differ with identical text (BPE ambiguity)."""
    max_simulate_semantic_rate: float = Field(0.0, ge=0, le=1)
    """Gate: most simulated semantic share per source (simulate = the text API replayed on rows with true ids:
    the re-encode error a text-only run of this format carries)."""
    max_simulate_bpe_only_rate: float = Field(0.35, ge=0, le=1)
    """Gate: most simulated bpe_only share per source."""
    min_verified_share: float = Field(0.05, ge=0, le=1)
    """Gate: share of each source's rows with ground truth (server ids or logprobs): a text-only source needs some (e.g.
    request.logprobs on, or a vLLM/SGLang slice) so its error is measured, not assumed."""
    min_count_agreement: float = Field(0.98, ge=0, le=1)
    """Gate: share of each source's rows with true ids whose provider counts agree with those ids under the source's
    count convention (below it, the convention is wrong for that provider and every text-only verdict with it)."""
    min_count_verified_share: float = Field(0.5, ge=0, le=1)
    """Gate: share of each source's counted text-only rows whose rebuilt prompt and reply lengths are the provider's."""
    max_prompt_mismatch_rate: float = Field(0.01, ge=0, le=1)
    """Gate: share of each source's counted rows whose rebuilt prompt length is not the provider's (another template,
    an injected system prompt, tools or history arguments rendered otherwise)."""
    context_tokens: int = Field(4, ge=0)
    """Tokens of context shown on each side of a first divergence."""
    examples: int = Field(5, ge=0)
    """Examples per source and class in the report."""
    simulate: bool = True
    """Also play the text API on rows with true ids and classify the re-encode (simulate mode)."""
