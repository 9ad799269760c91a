"""Run configuration: one strict pydantic model per stage, composed into `RunConfig`.

The same models are the Prefect flow parameters (the UI renders them as forms) and what the
CLI loads from YAML. Every default sits beside a one-line reason.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

# The chat formats of tasks/target/formats/ (a test keeps the two lists equal).
ChatFormatName = Literal[
    "auto",
    "kimi-k2.5",
    "kimi-k2",
    "deepseek-v3.2",
    "deepseek-v3.1",
    "glm-4.6",
    "gpt-oss",
    "qwen3.5",
    "qwen3-coder",
    "qwen3",
    "llama-3",
    "chatml",
]


# How words of a field name read in a label: units in brackets, acronyms in capitals.
LABEL_WORDS = {
    "s": "(s)",
    "mb": "(MB)",
    "gib": "(GiB)",
    "usd": "(USD)",
    "nats": "(nats)",
    "ttt": "TTT",
    "api": "API",
    "url": "URL",
    "cpu": "CPU",
    "lr": "learning rate",
    "id": "ID",
    "ids": "IDs",
    "bpe": "BPE",
    "dir": "directory",
    "kv": "KV",
    "acc": "accuracy",
    "tau": "τ",
    "kvcache": "KV cache",
    "lm": "LM",
    "eval": "eval",
}


def field_label(name: str, _info=None) -> str:
    """The form label of a config field: `timeout_s` -> "Timeout (s)", `ttt_steps` -> "TTT steps"."""
    words = [LABEL_WORDS.get(w, w) for w in name.split("_")]
    return " ".join([words[0][:1].upper() + words[0][1:], *words[1:]])


class StrictModel(BaseModel):
    """Base for every config model: unknown keys are errors, assignments are validated."""

    # Each field's docstring is its description, its name made readable its label: the Prefect form shows both.
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, use_attribute_docstrings=True, field_title_generator=field_label
    )


class ConfigError(ValueError):
    """A config file that does not fit the schema; the message names each key path."""


# --------------------------------------------------------------------------- target


class TargetConfig(StrictModel):
    """The target model whose drafts we train."""

    model: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    """Model name sent to the chat API (OpenRouter slug, vLLM served name)."""
    source: Literal["demo", "gguf", "hf_dir", "tokenizer_json"] = "demo"
    """Where the tokenizer/weights come from: the embedded demo GGUF, a GGUF file, an HF model directory, or a bare
    tokenizer.json (tokenizer only: no extract/train/evaluate)."""
    path: Path | None = None
    """File (gguf, tokenizer_json) or directory (hf_dir); unused for the demo."""
    trust_remote_code: bool = False
    """Remote code runs arbitrary Python from the model repo: off unless asked for (Kimi needs it)."""
    chat_format: ChatFormatName = "auto"
    """How the model writes a generated turn (reasoning markers, tool-call syntax, end of turn); "auto" detects the family from
    the chat template (tasks/target/formats/)."""
    special_tokens: dict[str, int] = Field(default_factory=dict)
    """Special-token ids the config pins, by token text; preflight checks each against the tokenizer."""
    extra_markers: list[str] = Field(default_factory=list)
    """Extra marker texts to verify beyond those found in the chat template."""
    chat_template: str | None = None
    """A Jinja chat template used instead of the tokenizer's own (or where it has none): a file, or a real template from the
    llama.cpp corpus, e.g. "pypi-sdist:llama-cpp-python==0.3.36/vendor/llama.cpp/models/templates/deepseek-ai-
    DeepSeek-V4.jinja"."""
    end_of_turn: str | None = None
    """Text of the end-of-turn token; None resolves it from the template (then eos)."""
    max_length: int = Field(2048, gt=0)
    """Tokens per training sequence; longer rows are quarantined, not truncated."""


# --------------------------------------------------------------------------- generate


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


class ApiConfig(StrictModel):
    """The OpenAI-compatible chat-completions endpoint."""

    base_url: str = "https://openrouter.ai/api/v1"
    """OpenRouter, a vLLM/SGLang server, or the embedded server ("embedded" starts it for the run)."""
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
    budget_usd: float | None = Field(None, gt=0)
    """Stop cleanly (everything finished journaled) once usage.cost adds up to this many USD."""
    max_error_rate: float = Field(0.05, ge=0, le=1)
    """Gate: share of requested rows that may end as permanent failures."""
    journal_batch: int = Field(8, gt=0)
    """Replies per journal fsync: small batches bound what a crash can lose to what is in flight."""


# --------------------------------------------------------------------------- reconstruct / validate


class GuidedConfig(StrictModel):
    """The `guided` method: re-split text-only replies to the target's own tokenization, by its likelihood."""

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

    @field_validator("methods")
    @classmethod
    def _one_text_method(cls, methods: list[str]) -> list[str]:
        if "reencode" in methods and "guided" in methods:
            raise ValueError("reencode and guided both rebuild text-only rows: list one of them")
        return methods


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
    context_tokens: int = Field(4, ge=0)
    """Tokens of context shown on each side of a first divergence."""
    examples: int = Field(5, ge=0)
    """Examples per source and class in the report."""
    simulate: bool = True
    """Also play the text API on rows with true ids and classify the re-encode (simulate mode)."""


# --------------------------------------------------------------------------- merge


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
    drop_truncated: bool = True
    """Replies cut by max_tokens never end with the end-of-turn token the draft must learn."""
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


# --------------------------------------------------------------------------- extract


class ExtractConfig(StrictModel):
    """How the target's hidden states are captured and stored for offline training."""

    backend: Literal["transformers", "vllm"] = "transformers"
    """The engine that runs the target (tasks/extract/backend.py): transformers in this process, or a vLLM server
    draftsmith starts (section `vllm`) with vLLM's `extract_hidden_states` method, for targets that need its parallelism."""
    aux_layer_ids: list[int] | None = None
    """HF hidden_states indices (= input of decoder layer i); None = [2, L//2, L-3] as EAGLE-3."""
    batch_tokens: int = Field(4096, gt=0)
    """Padded tokens per forward batch; rows are sorted by length and packed to this budget."""
    shard_tokens: int = Field(65_536, gt=0)
    """Tokens per safetensors shard (one shard is also the unit of resume); 65k tokens ~ 300 MB at H=576."""
    cpu_threads: int | None = Field(None, gt=0)
    """CPU only: torch threads; None keeps torch's default (size it when other processes share the cores)."""
    norm_range: tuple[float, float] = (1e-3, 1e4)
    """Gate: each shard's mean L2 norm per stored state (3 aux + final) must lie in this range."""


# --------------------------------------------------------------------------- train / evaluate


class TrainConfig(StrictModel):
    mode: Literal["offline", "online"] = "offline"
    """offline reads the extract stage's shards; online runs the target inside the loop."""
    draft_vocab_size: int = Field(32_000, gt=0)
    """Draft vocabulary size (capped at the target vocab)."""
    ttt_steps: int = Field(7, ge=1)
    """Training-time test: unrolled steps, each feeding back the draft's own hidden state."""
    ttt_decay: float = Field(0.8, gt=0, le=1)
    """Weight of step i's loss is decay**i."""
    lr: float = Field(1e-4, gt=0)
    """Peak AdamW learning rate (EAGLE-3's 1e-4)."""
    adam_betas: tuple[float, float] = (0.9, 0.95)
    """AdamW (beta1, beta2). beta2 0.95 learns faster in short runs (the demo's 50 steps); over an epoch of 200k+
    tokens torch's (0.9, 0.999), as EAGLE-3 and SpecForge train, is as good or slightly better."""
    warmup_steps: int = Field(20, ge=0)
    """Linear warmup steps before the cosine decay."""
    max_steps: int = Field(200, gt=0)
    """Optimizer steps in all (resumed runs continue to this)."""
    batch_tokens: int = Field(2048, gt=0)
    """Tokens per optimizer step (rows are packed up to this many)."""
    grad_clip: float = Field(0.5, gt=0)
    """Gradient norm clip (EAGLE-3's 0.5)."""
    dtype: Literal["auto", "float32", "bfloat16"] = "float32"
    """Training precision of the draft's matmuls (bf16 autocast, fp32 weights); auto = bf16 where the hardware
    computes it natively (CUDA, AVX512-BF16/AMX CPUs), else fp32."""
    checkpoint_every: int = Field(50, gt=0)
    """Steps between checkpoints (resume restarts from the last)."""
    keep_checkpoints: int = Field(2, gt=0)
    """Checkpoints kept on disk (newest first); older ones are deleted after each save."""
    draft_overrides: dict[str, Any] = Field(default_factory=dict)
    """Draft config fields to override (intermediate_size, num_attention_heads, ...)."""
    ttt_feed: Literal["predicted", "data"] = "data"
    """What unrolled steps read as their token: the data token (as EAGLE, SpecForge and speculators train: the
    target's distribution is computed for that prefix) or the draft's own argmax."""
    init_lm_head_from_target: bool = True
    """Start lm_head from the target's lm_head rows of the draft vocab (a far better start than noise)."""
    processes: int = Field(1, gt=0)
    """Processes for data-parallel training; >1 launches `torchrun` (gloo on CPU, nccl on GPUs)."""
    threads_per_rank: int = Field(1, gt=0)
    """torch threads per training process (CPU); size it to the cores you have."""
    min_acc_0_rise: float | None = Field(0.0, ge=0)
    """Gate: first-step accuracy must rise by more than this over the run (last vs first steps); null: not checked."""
    export_dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    """Weights dtype in the exported model.safetensors (what serving engines load)."""
    export_engine: Literal["sglang", "vllm"] = "sglang"
    """Layer-id convention written to config.json: SGLang adds 1 to the ids it reads, vLLM does not."""


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


# --------------------------------------------------------------------------- run


class ComputeConfig(StrictModel):
    """Where and how the models run, shared by every stage that runs one."""

    device: str = "auto"
    """auto = CUDA when present, else CPU; or cpu, cuda, cuda:1 (extract, train, evaluate)."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Target compute dtype (extract, embedded server); hidden states are stored in bf16 either way. auto = bf16 on
    CUDA or a CPU with native bf16, else fp32 (emulated bf16 on an AVX2-only CPU ran ~5x slower than fp32)."""
    seed: int = 0
    """Seed of the merge shuffle and split, the draft's initialisation and its batch order."""


class VllmConfig(StrictModel):
    """The vLLM server draftsmith starts for `extract.backend: vllm` and `evaluate.engine: vllm` (127.0.0.1 only)."""

    python: str | None = None
    """Python of an environment with vLLM installed; None = $DRAFTSMITH_VLLM_PYTHON (`make test-vllm` sets up one)."""
    args: list[str] = Field(default_factory=list)
    """More server arguments, e.g. ["--tensor-parallel-size", "8"]; the model, port and dtype come from this config."""
    startup_s: float = Field(900, gt=0)
    """Seconds to wait for /health (a first start compiles the model: minutes on CPU)."""
    cpu_kvcache_gib: int = Field(2, gt=0)
    """KV cache of vLLM's CPU build, GiB (VLLM_CPU_KVCACHE_SPACE); not used on GPUs."""
    concurrency: int = Field(8, gt=0)
    """Requests in flight at once while extracting (vLLM batches them)."""


class OrchestrationConfig(StrictModel):
    # Read by `draftsmith deploy` and the worker, never by a run: left out of the deployments' run form.
    DEPLOY_ONLY: ClassVar[tuple[str, ...]] = ("schedule_cron", "schedule_timezone", "work_pool")

    task_runner: Literal["threads", "dask", "ray"] = "threads"
    """Task runner: threads on one machine; dask or ray spread shards over a cluster."""
    max_workers: int = Field(2, gt=0)
    """Worker threads/processes for the runner."""
    cluster_address: str | None = None
    """Address of an existing Dask scheduler or Ray cluster; None starts a local one."""
    schedule_cron: str | None = None
    """Cron schedule for `draftsmith deploy`; None registers without a schedule."""
    schedule_timezone: str = "UTC"
    """Time zone the cron schedule is read in (IANA name, e.g. Europe/Paris)."""
    work_pool: str = "draftsmith"
    """Prefect work pool (type process) the deployments are registered on; `draftsmith deploy` creates it, and
    `draftsmith worker` (or `prefect worker start --pool NAME`) runs its flow runs."""


class RunConfig(StrictModel):
    """Everything one pipeline run needs."""

    name: str = "demo"
    """The run's name: outputs go to runs_dir/name/, and its Prefect runs are named and tagged with it."""
    runs_dir: Path = Path("runs")
    """Runs live under runs_dir/name/."""
    target: TargetConfig = Field(default_factory=TargetConfig)
    """The target model: tokenizer, chat format, weights."""
    generate: GenerateConfig = Field(default_factory=GenerateConfig)
    """Stage 1: buy the target's replies over the chat API."""
    reconstruct: ReconstructConfig = Field(default_factory=ReconstructConfig)
    """Stage 2: rebuild the exact token ids of every reply."""
    validation: ValidationConfig = Field(default_factory=ValidationConfig)
    """Stage 3: how far the rebuilt ids can be trusted, per source."""
    merge: MergeConfig = Field(default_factory=MergeConfig)
    """Stage 4: dedup, mix and split into train/eval shards."""
    extract: ExtractConfig = Field(default_factory=ExtractConfig)
    """Stage 5: the target's hidden states for every merged row."""
    train: TrainConfig = Field(default_factory=TrainConfig)
    """Stage 6: train the EAGLE-3 draft."""
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    """Stage 7: acceptance length of the draft on held-out prompts."""
    compute: ComputeConfig = Field(default_factory=ComputeConfig)
    """Device, dtype and seed shared by every stage that runs a model or shuffles."""
    vllm: VllmConfig = Field(default_factory=VllmConfig)
    """The vLLM server used where extract or evaluate run on vLLM."""
    orchestration: OrchestrationConfig = Field(default_factory=OrchestrationConfig)
    """Task runner and schedule."""

    @property
    def run_dir(self) -> Path:
        return self.runs_dir / self.name


def config_fields(model: type[BaseModel] | None = None, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """Every config key as (dotted key, type, default, description), nested sections and list items included."""
    rows = []
    for name, field in (model or RunConfig).model_fields.items():
        key, annotation = prefix + name, field.annotation
        item = typing.get_args(annotation)[0] if typing.get_origin(annotation) is list else None
        section = next((t for t in (annotation, item) if isinstance(t, type) and issubclass(t, BaseModel)), None)
        if section is not None:
            rows += config_fields(section, f"{key}[]." if section is item else f"{key}.")
            continue
        default = "required" if field.is_required() else json.dumps(field.get_default(call_default_factory=True), default=str)
        shown = annotation.__name__ if isinstance(annotation, type) else str(annotation).replace("typing.", "")
        rows.append((key, shown.replace("pathlib.", ""), default, " ".join((field.description or "").split())))
    return rows


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
