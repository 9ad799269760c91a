"""The `generate` section: prompt sources, the chat API, the request options and the run's limits."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from tasks.config.base import StrictModel


class CountConvention(StrictModel):
    """What a provider's `usage` counts, so that its token counts can be checked against the rebuilt ids."""

    end_of_turn: bool = True
    """completion_tokens counts the end-of-turn token of a finished reply (vLLM, SGLang and the embedded server do)."""
    prompt_offset: int = 0
    """Tokens prompt_tokens counts beyond the rendered prompt's own (1: a BOS the provider's tokenizer prepends)."""
    reasoning_in_completion: bool = True
    """completion_tokens includes the reasoning tokens (OpenAI-style usage, as OpenRouter reports it)."""
    reasoning_markers: bool = False
    """reasoning_tokens also counts the markers around the reasoning (`<think>`, `</think>`)."""
    cached_in_prompt: bool = True
    """prompt_tokens includes the cached prompt tokens (cached_tokens is a part of it, not apart from it)."""


# What each API flavour's usage counts, unless a source says otherwise: measured for vLLM 0.32 (completion_tokens is
# the length of its token ids, end of turn included on finished replies) and the embedded server; OpenRouter passes
# on the upstream engine's counts, which are vLLM's or SGLang's for the open-weight targets. Validate checks the
# convention on every source's rows with true ids and names it when it does not hold.
PROVIDER_COUNTS = {
    "vllm": CountConvention(),
    "sglang": CountConvention(),
    "embedded": CountConvention(),
    "openrouter": CountConvention(),
    "openai": CountConvention(),
}


class SourceConfig(StrictModel):
    """One prompt source."""

    name: str
    """Name recorded on every row; per-source rates and mixes are keyed on it."""
    format: Literal["openai", "sharegpt", "bfcl", "instruction"]
    """Row layout: OpenAI messages, ShareGPT conversations, BFCL function calling, instruction/response."""
    path: str
    """A file path, or "pypi:<package>/<member>" for data shipped inside a PyPI wheel."""
    limit: int | None = Field(None, gt=0)
    """Rows to take (after skipping unreadable ones); None takes all."""
    offset: int = Field(0, ge=0)
    """Rows to skip first, so several runs can draw disjoint slices."""
    max_prompt_chars: int | None = Field(None, gt=0)
    """Prompts longer than this (characters over all turns) are quarantined before any request is paid."""
    replies: Literal["target", "dataset"] = "target"
    """Whose replies are trained on: "target" buys the target's reply to each prompt over the API; "dataset" takes
    the row's own last assistant turn as it is, with no request (every table marks its rows `origin: dataset`)."""
    counts: CountConvention | None = None
    """What the provider's token counts include for this source's replies; None: the default of generate.api.provider."""
    regenerate: Literal["last", "each_turn"] = "last"
    """last: the target answers the conversation's last user turn, after the dataset's own earlier turns. each_turn:
    the target answers every user turn in order, each request carrying its own earlier replies (one row per turn,
    journaled as `<id>#t<k>`); tool results are spliced in only after calls that match the recorded ones."""

    @model_validator(mode="after")
    def _regenerate_buys(self) -> SourceConfig:
        if self.regenerate == "each_turn" and self.replies == "dataset":
            raise ValueError(f"source {self.name!r}: regenerate: each_turn buys every turn; it needs replies: target")
        return self


class ApiConfig(StrictModel):
    """The OpenAI-compatible chat-completions endpoint."""

    base_url: str = "https://openrouter.ai/api/v1"
    """OpenRouter, a vLLM/SGLang server, or a server started for the run on the target: "embedded" (draftsmith's
    own) or "vllm" (vLLM with the `vllm` section's arguments; set provider: vllm)."""
    provider: Literal["openrouter", "vllm", "sglang", "openai", "embedded"] = "openrouter"
    """Flavour of the server: decides which extra options are sent and which reply fields are read."""
    api_key_env: str | None = "OPENROUTER_API_KEY"
    """Environment variable holding the API key (never written anywhere)."""
    api_key_secret_block: str | None = None
    """Prefect Secret block holding the API key, used when the environment variable is unset."""
    concurrency: int = Field(64, gt=0)
    """Requests in flight; LLM APIs take seconds, so throughput is concurrency / latency."""
    timeout_s: float = Field(600.0, gt=0)
    """Seconds per request before it counts as a timeout (long reasoning replies are slow)."""
    max_retries: int = Field(6, ge=0)
    """Retries per request for retryable failures (429, 5xx, timeouts, resets)."""
    backoff_base_s: float = Field(1.0, gt=0)
    """First backoff in seconds; doubles each retry, with full jitter."""
    backoff_max_s: float = Field(60.0, gt=0)
    """Cap on one backoff, including a server's Retry-After."""

    @model_validator(mode="after")
    def _started_vllm_is_vllm(self) -> ApiConfig:
        if self.base_url == "vllm" and self.provider != "vllm":
            raise ValueError(f"base_url vllm starts a vLLM server: provider must be vllm, not {self.provider}")
        return self


class EmbeddedServerConfig(StrictModel):
    """The embedded target server (`generate.api.base_url: embedded`): the target served on 127.0.0.1."""

    threads: int = Field(1, gt=0)
    """Torch threads (1 keeps it steady when other processes share the cores)."""
    max_batch: int = Field(16, gt=0)
    """Most sequences decoded together in one forward pass."""
    startup_s: float = Field(180.0, gt=0)
    """Seconds to wait for it to load the model and answer /health."""


class RequestConfig(StrictModel):
    """Sampling and server options sent with each request."""

    temperature: float = Field(0.7, ge=0)
    """Sampling temperature; 0 is greedy."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass; 1 samples from the whole distribution."""
    max_tokens: int = Field(1024, gt=0)
    """Most tokens per reply; a reply cut here ends with finish_reason length."""
    seed: int | None = 0
    """Fixed seed per request id keeps reruns comparable where the server honours it."""
    stop: list[str] | None = None
    """Stop strings; the reply ends before the first one."""
    reasoning: dict[str, Any] | None = None
    """OpenRouter `reasoning` object, e.g. {"effort": "high"}."""
    provider_routing: dict[str, Any] | None = None
    """OpenRouter `provider` routing, e.g. {"order": [...], "quantizations": ["fp8"]}."""
    return_token_ids: bool = False
    """vLLM/SGLang: return prompt and completion token ids (exact ground truth)."""
    logprobs: bool = False
    """Return logprob entries with their true bytes (second-best ground truth)."""
    top_logprobs: int | None = Field(None, ge=0, le=20)
    """Alternatives returned per logprob entry (0-20)."""
    chat_template_kwargs: dict[str, Any] | None = None
    """vLLM/SGLang chat_template_kwargs, e.g. {"enable_thinking": true}."""
    extra_body: dict[str, Any] = Field(default_factory=dict)
    """Anything else to pass through verbatim in the request body."""


class TokenPrice(StrictModel):
    """What a provider charges, in USD per million tokens."""

    input: float = Field(ge=0)
    """Per million prompt tokens."""
    output: float = Field(ge=0)
    """Per million completion tokens (reasoning included)."""


class GenerateConfig(StrictModel):
    """Prompt sources, the API to call, and the limits of one generation run."""

    sources: list[SourceConfig] = Field(default_factory=list)
    """Prompt sources, read in order."""
    api: ApiConfig = Field(default_factory=ApiConfig)
    """The chat-completions endpoint and how to call it."""
    request: RequestConfig = Field(default_factory=RequestConfig)
    """Options sent with every request."""
    embedded: EmbeddedServerConfig = Field(default_factory=EmbeddedServerConfig)
    """The embedded server, when generate.api.base_url is "embedded"."""
    price_per_million: TokenPrice | None = None
    """The reply's cost where the server reports none (`usage.cost`, as OpenRouter does, wins): its tokens at this
    price, so `budget_usd` and the cost columns hold for a vLLM or SGLang server billed per token too."""
    budget_usd: float | None = Field(None, gt=0)
    """Stop cleanly (everything finished journaled) once usage.cost adds up to this many USD."""
    retry_failed: list[str] = Field(default_factory=list)
    """Failure kinds to ask again (`http_400`, `http_403`, `timeout`, ... as the quarantine names them): a prompt whose
    journaled failure is of one of these kinds is sent again, say after a provider fixed a misconfiguration. Replies
    in the journal are never asked again. `draftsmith run --retry-failed KIND` sets it for one run."""
    max_error_rate: float = Field(0.05, ge=0, le=1)
    """Gate: share of requested rows that may end as permanent failures."""
    journal_batch: int = Field(8, gt=0)
    """Replies per journal fsync: small batches bound what a crash can lose to what is in flight."""

    def count_convention(self, source: str) -> CountConvention:
        """How the provider counted a source's tokens: the source's own setting, else its API flavour's."""
        configured = next((s.counts for s in self.sources if s.name == source), None)
        return configured or PROVIDER_COUNTS[self.api.provider]
