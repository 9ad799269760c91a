"""Run configuration: one strict pydantic model per stage, composed into `RunConfig`.

The same models are the Prefect flow parameters (the UI renders them as forms) and what the
CLI loads from YAML. Every default sits beside a one-line reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

# The chat formats of tasks/target/formats/ (a test keeps the two lists equal).
ChatFormatName = Literal[
    "auto", "kimi-k2.5", "kimi-k2", "deepseek-v3.2", "deepseek-v3.1", "glm-4.6", "gpt-oss", "qwen3.5", "qwen3-coder", "qwen3",
    "llama-3", "chatml",
]


class StrictModel(BaseModel):
    """Base for every config model: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ConfigError(ValueError):
    """A config file that does not fit the schema; the message names each key path."""


# --------------------------------------------------------------------------- target


class TargetConfig(StrictModel):
    """The target model whose drafts we train."""

    # Model name sent to the chat API (OpenRouter slug, vLLM served name).
    model: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    # Where the tokenizer/weights come from: the embedded demo GGUF, a GGUF file, an HF
    # model directory, or a bare tokenizer.json (tokenizer only: no extract/train/evaluate).
    source: Literal["demo", "gguf", "hf_dir", "tokenizer_json"] = "demo"
    # File (gguf, tokenizer_json) or directory (hf_dir); unused for the demo.
    path: Path | None = None
    # Remote code runs arbitrary Python from the model repo: off unless asked for (Kimi needs it).
    trust_remote_code: bool = False
    # How the model writes a generated turn (reasoning markers, tool-call syntax, end of turn);
    # "auto" detects the family from the chat template (tasks/target/formats/).
    chat_format: ChatFormatName = "auto"
    # Special-token ids the config pins, by token text; preflight checks each against the tokenizer.
    special_tokens: dict[str, int] = Field(default_factory=dict)
    # Extra marker texts to verify beyond those found in the chat template.
    extra_markers: list[str] = Field(default_factory=list)
    # A Jinja chat template used instead of the tokenizer's own (or where it has none): a file, or a
    # real template from the llama.cpp corpus, e.g.
    # "pypi-sdist:llama-cpp-python==0.3.36/vendor/llama.cpp/models/templates/deepseek-ai-DeepSeek-V4.jinja".
    chat_template: str | None = None
    # Text of the end-of-turn token; None resolves it from the template (then eos).
    end_of_turn: str | None = None
    # Tokens per training sequence; longer rows are quarantined, not truncated.
    max_length: int = Field(2048, gt=0)


# --------------------------------------------------------------------------- generate


class SourceConfig(StrictModel):
    """One prompt source."""

    # Name recorded on every row; per-source rates and mixes are keyed on it.
    name: str
    # Row layout: OpenAI messages, ShareGPT conversations, BFCL function calling, instruction/response.
    format: Literal["openai", "sharegpt", "bfcl", "instruction"]
    # A file path, or "pypi:<package>/<member>" for data shipped inside a PyPI wheel.
    path: str
    # Rows to take (after skipping unreadable ones); None takes all.
    limit: int | None = Field(None, gt=0)
    # Rows to skip first, so several runs can draw disjoint slices.
    offset: int = Field(0, ge=0)
    # Prompts longer than this (characters over all turns) are quarantined before any request is paid.
    max_prompt_chars: int | None = Field(None, gt=0)


class ApiConfig(StrictModel):
    """The OpenAI-compatible chat-completions endpoint."""

    # OpenRouter, a vLLM/SGLang server, or the embedded server ("embedded" starts it for the run).
    base_url: str = "https://openrouter.ai/api/v1"
    # Flavour of the server: decides which extra options are sent and which reply fields are read.
    provider: Literal["openrouter", "vllm", "sglang", "openai", "embedded"] = "openrouter"
    # Environment variable holding the API key (never written anywhere).
    api_key_env: str | None = "OPENROUTER_API_KEY"
    # Prefect Secret block holding the API key, used when the environment variable is unset.
    api_key_secret_block: str | None = None
    # Requests in flight; LLM APIs take seconds, so throughput is concurrency / latency.
    concurrency: int = Field(64, gt=0)
    # Seconds per request before it counts as a timeout (long reasoning replies are slow).
    timeout_s: float = Field(600.0, gt=0)
    # Retries per request for retryable failures (429, 5xx, timeouts, resets).
    max_retries: int = Field(6, ge=0)
    # First backoff in seconds; doubles each retry, with full jitter.
    backoff_base_s: float = Field(1.0, gt=0)
    # Cap on one backoff, including a server's Retry-After.
    backoff_max_s: float = Field(60.0, gt=0)
    # Embedded server only: torch threads (1 keeps it steady when other processes share the cores).
    server_threads: int = Field(1, gt=0)
    # Embedded server only: most sequences decoded together in one forward pass.
    server_max_batch: int = Field(16, gt=0)
    # Embedded server only: compute dtype; auto = bf16 where the CPU has native bf16 (~2x faster), else fp32.
    server_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    # Embedded server only: seconds to wait for it to load the model and answer /health.
    server_startup_s: float = Field(180.0, gt=0)


class RequestConfig(StrictModel):
    """Sampling and server options sent with each request."""

    temperature: float = Field(0.7, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(1024, gt=0)
    # Fixed seed per request id keeps reruns comparable where the server honours it.
    seed: int | None = 0
    stop: list[str] | None = None
    # OpenRouter `reasoning` object, e.g. {"effort": "high"}.
    reasoning: dict[str, Any] | None = None
    # OpenRouter `provider` routing, e.g. {"order": [...], "quantizations": ["fp8"]}.
    provider_routing: dict[str, Any] | None = None
    # vLLM/SGLang: return prompt and completion token ids (exact ground truth).
    return_token_ids: bool = False
    # Return logprob entries with their true bytes (second-best ground truth).
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    # vLLM/SGLang chat_template_kwargs, e.g. {"enable_thinking": true}.
    chat_template_kwargs: dict[str, Any] | None = None
    # Anything else to pass through verbatim in the request body.
    extra_body: dict[str, Any] = Field(default_factory=dict)


class GenerateConfig(StrictModel):
    """Prompt sources, the API to call, and the limits of one generation run."""

    sources: list[SourceConfig] = Field(default_factory=list)
    api: ApiConfig = Field(default_factory=ApiConfig)
    request: RequestConfig = Field(default_factory=RequestConfig)
    # Stop cleanly (everything finished journaled) once usage.cost adds up to this many USD.
    budget_usd: float | None = Field(None, gt=0)
    # Gate: share of requested rows that may end as permanent failures.
    max_error_rate: float = Field(0.05, ge=0, le=1)
    # Replies per journal fsync: small batches bound what a crash can lose to what is in flight.
    journal_batch: int = Field(8, gt=0)


# --------------------------------------------------------------------------- reconstruct / validate


class ReconstructConfig(StrictModel):
    # Methods tried in order; a row uses the first one its data allows.
    methods: list[Literal["server_ids", "logprobs", "reencode"]] = Field(
        default_factory=lambda: ["server_ids", "logprobs", "reencode"]
    )
    # Rows per worker shard (Prefect task); coarse shards keep orchestration overhead small.
    shard_rows: int = Field(5000, gt=0)
    # Rows per encode batch inside a shard; the next chunk renders while this one encodes.
    pipeline_rows: int = Field(1000, gt=0)
    # Threads encoding chunks at once (the tokenizer releases the GIL): about the cores a shard may use.
    encode_threads: int = Field(2, gt=0)
    # Reasoning that a provider also copied into the content: refuse the row, or drop the copy.
    echoed_reasoning: Literal["quarantine", "strip"] = "quarantine"


class ValidationConfig(StrictModel):
    # Gate: share of verified rows whose decoded text differs (a rebuild bug); default none at all.
    max_semantic_rate: float = Field(0.0, ge=0, le=1)
    # Gate: share of verified rows whose ids differ with identical text (BPE ambiguity).
    max_bpe_only_rate: float = Field(0.25, ge=0, le=1)
    # Gate: the same two rates in simulate mode (the text API played on rows with true ids): the
    # re-encode error a text-only run of this format carries.
    max_simulate_semantic_rate: float = Field(0.0, ge=0, le=1)
    max_simulate_bpe_only_rate: float = Field(0.35, ge=0, le=1)
    # Gate: share of each source's rows with ground truth (server ids or logprobs): a text-only source
    # needs some (e.g. request.logprobs on, or a vLLM/SGLang slice) so its error is measured, not assumed.
    min_verified_share: float = Field(0.05, ge=0, le=1)
    # Tokens of context shown on each side of a first divergence.
    context_tokens: int = Field(4, ge=0)
    # Examples per source and class in the report.
    examples: int = Field(5, ge=0)
    # Also play the text API on rows with true ids and classify the re-encode (simulate mode).
    simulate: bool = True


# --------------------------------------------------------------------------- merge


class MergeSourceConfig(StrictModel):
    # Name in the mix report; defaults to the reconstructed table's own source names.
    name: str
    # A reconstructed/ directory; None means this run's own reconstruct output.
    path: Path | None = None
    # Relative sampling weight; None keeps every row (subject to max_rows).
    weight: float | None = Field(None, gt=0)
    max_rows: int | None = Field(None, gt=0)
    min_tokens: int = Field(1, ge=1)
    max_tokens: int | None = Field(None, gt=0)
    # Replies cut by max_tokens never end with the end-of-turn token the draft must learn.
    drop_truncated: bool = True
    # Validation classes kept; "unverified" rows had no ground truth.
    allowed_classes: list[Literal["exact", "bpe_only", "semantic", "unverified"]] = Field(
        default_factory=lambda: ["exact", "bpe_only", "unverified"]
    )


class MergeConfig(StrictModel):
    # Empty means: every source in this run's reconstructed table, unweighted.
    sources: list[MergeSourceConfig] = Field(default_factory=list)
    # Eval rows as a fraction (<1) or a count (>=1), stratified by source.
    eval_size: float = Field(0.1, ge=0)
    seed: int = 0
    rows_per_shard: int = Field(10_000, gt=0)
    # Peak memory the merge may use, in MiB.
    memory_budget_mb: int = Field(1024, gt=0)
    # Gate: realised source share may differ from the requested one by this much (absolute).
    share_tolerance: float = Field(0.05, ge=0, le=1)

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


# --------------------------------------------------------------------------- extract


class ExtractConfig(StrictModel):
    """How the target's hidden states are captured and stored for offline training."""

    # The engine that runs the target; transformers is the one implemented (see tasks/extract/backend.py).
    backend: Literal["transformers"] = "transformers"
    # HF hidden_states indices (= input of decoder layer i); None = [2, L//2, L-3] as EAGLE-3.
    aux_layer_ids: list[int] | None = None
    # Padded tokens per forward batch; rows are sorted by length and packed to this budget.
    batch_tokens: int = Field(4096, gt=0)
    # Compute dtype; storage is always bf16. "auto": bf16 on CUDA or a CPU with native bf16, else
    # fp32 (emulated bf16 on an AVX2-only CPU ran ~5x slower than fp32).
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    # "auto" picks CUDA when present.
    device: str = "auto"
    # Tokens per safetensors shard (one shard is also the unit of resume); 65k tokens ~ 300 MB at H=576.
    shard_tokens: int = Field(65_536, gt=0)
    # CPU only: torch threads; None keeps torch's default (size it when other processes share the cores).
    cpu_threads: int | None = Field(None, gt=0)
    # Gate: each shard's mean L2 norm per stored state (3 aux + final) must lie in this range.
    norm_range: tuple[float, float] = (1e-3, 1e4)


# --------------------------------------------------------------------------- train / evaluate


class TrainConfig(StrictModel):
    # offline reads the extract stage's shards; online runs the target inside the loop.
    mode: Literal["offline", "online"] = "offline"
    # Draft vocabulary size (capped at the target vocab).
    draft_vocab_size: int = Field(32_000, gt=0)
    # Training-time test: unrolled steps, each feeding back the draft's own hidden state.
    ttt_steps: int = Field(7, ge=1)
    # Weight of step i's loss is decay**i.
    ttt_decay: float = Field(0.8, gt=0, le=1)
    lr: float = Field(1e-4, gt=0)
    warmup_steps: int = Field(20, ge=0)
    max_steps: int = Field(200, gt=0)
    # Tokens per optimizer step (rows are packed up to this many).
    batch_tokens: int = Field(2048, gt=0)
    grad_clip: float = Field(0.5, gt=0)
    dtype: Literal["float32", "bfloat16"] = "float32"
    checkpoint_every: int = Field(50, gt=0)
    # Checkpoints kept on disk (newest first); older ones are deleted after each save.
    keep_checkpoints: int = Field(2, gt=0)
    seed: int = 0
    device: str = "auto"
    # Draft config fields to override (intermediate_size, num_attention_heads, ...).
    draft_overrides: dict[str, Any] = Field(default_factory=dict)
    # What unrolled steps read as their token: the draft's own argmax (as at inference) or the data.
    ttt_feed: Literal["predicted", "data"] = "predicted"
    # Start lm_head from the target's lm_head rows of the draft vocab (a far better start than noise).
    init_lm_head_from_target: bool = True
    # Processes for data-parallel training; >1 launches `torchrun` (gloo on CPU, nccl on GPUs).
    processes: int = Field(1, gt=0)
    # torch threads per training process (CPU); size it to the cores you have.
    threads_per_rank: int = Field(1, gt=0)
    # Weights dtype in the exported model.safetensors (what serving engines load).
    export_dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    # Layer-id convention written to config.json: SGLang adds 1 to the ids it reads, vLLM does not.
    export_engine: Literal["sglang", "vllm"] = "sglang"


class EvaluateConfig(StrictModel):
    # Held-out prompts (from the merged eval split) to decode.
    num_prompts: int = Field(8, gt=0)
    max_new_tokens: int = Field(64, gt=0)
    # Draft tokens proposed per target forward (a chain, as SGLang's steps=3/draft=4).
    num_draft_tokens: int = Field(4, ge=1)
    # Gate: acceptance length (tokens per target forward) must reach this.
    min_acceptance_length: float = Field(1.0, ge=0)
    device: str = "auto"


# --------------------------------------------------------------------------- run


class OrchestrationConfig(StrictModel):
    # Task runner: threads on one machine; dask or ray spread shards over a cluster.
    task_runner: Literal["threads", "dask", "ray"] = "threads"
    # Worker threads/processes for the runner.
    max_workers: int = Field(2, gt=0)
    # Address of an existing Dask scheduler or Ray cluster; None starts a local one.
    cluster_address: str | None = None
    # Cron schedule for `draftsmith deploy`; None registers without a schedule.
    schedule_cron: str | None = None
    # Stages to rerun even when their inputs and config are unchanged.
    force: list[str] = Field(default_factory=list)


class RunConfig(StrictModel):
    """Everything one pipeline run needs."""

    # Outputs go to <runs_dir>/<name>/.
    name: str = "demo"
    runs_dir: Path = Path("runs")
    target: TargetConfig = Field(default_factory=TargetConfig)
    generate: GenerateConfig = Field(default_factory=GenerateConfig)
    reconstruct: ReconstructConfig = Field(default_factory=ReconstructConfig)
    validation: ValidationConfig = Field(default_factory=ValidationConfig)
    merge: MergeConfig = Field(default_factory=MergeConfig)
    extract: ExtractConfig = Field(default_factory=ExtractConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    orchestration: OrchestrationConfig = Field(default_factory=OrchestrationConfig)

    @property
    def run_dir(self) -> Path:
        return self.runs_dir / self.name


def format_validation_error(err: ValidationError, origin: str) -> str:
    """One line per problem: `origin: key.path: what was expected (got ...)`."""
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "<root>"
        got = e.get("input")
        shown = "" if e["type"] == "missing" else f" (got {got!r:.80})"
        lines.append(f"{origin}: {path}: {e['msg']}{shown}")
    return "\n".join(lines)


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Load a YAML run config; relative paths in it stay relative to the working directory."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, str(path))) from None
