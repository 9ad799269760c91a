"""The `train` section: the draft, its training-time test, the optimizer and the export."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from tasks.config.base import StrictModel


class DraftShape(StrictModel):
    """What the draft layer is: its attention, and the EAGLE-3.1 switches (each written to the export's config)."""

    arch: Literal["llama", "mla"] = "llama"
    """llama: EAGLE-3's Llama layer (`LlamaForCausalLMEagle3`); mla: the same layer with DeepSeek-V2 latent attention
    (`Eagle3DeepseekV2ForCausalLM`, the shape of the published DeepSeek-V3 / Kimi-K2 drafts)."""
    fc_norm: bool = True
    """EAGLE-3.1: one RMSNorm per captured target state before `fc` (tensors fc_norm.{i}.weight). With
    `norm_output`, on by default (measured ahead of 3.0 at 200k and 1M tokens); both false: an EAGLE-3.0 draft,
    for an engine that predates 3.1."""
    norm_output: bool = True
    """EAGLE-3.1: each unrolled step feeds the next the post-norm hidden state (logits always read it)."""
    norm_before_fc: bool = False
    """One RMSNorm over the whole concatenation before `fc` (tensor input_norm.weight); not together with fc_norm."""
    parallel_drafting: bool = False
    """P-EAGLE: every unrolled step after the first reads a mask token and a learned `mask_hidden` (tensor
    mask_hidden, config mask_token_id) instead of the step before, so vLLM drafts all k tokens in one forward
    (served with `"parallel_drafting": true`; SGLang does not serve it)."""

    @model_validator(mode="after")
    def _one_input_norm(self) -> DraftShape:
        if self.fc_norm and self.norm_before_fc:
            raise ValueError(
                "fc_norm (on by default) and norm_before_fc both normalize the aux states before fc:"
                " set fc_norm: false to use norm_before_fc"
            )
        if self.parallel_drafting and self.arch != "llama":
            raise ValueError(
                "train.draft.parallel_drafting needs arch: llama (vLLM's MLA draft has no mask_hidden to serve it with)"
            )
        return self


HiddenStates = Literal["auto", "offline", "stream", "cache", "online"]
Loss = Literal["soft_ce", "tv", "lk"]


class TrainConfig(StrictModel):
    hidden_states: HiddenStates = "auto"
    """Where training reads the target's states (tasks/draft/states.py). offline: the extract stage's shards (8·H bytes
    per token on disk); stream: the run's vLLM server (section `vllm`) computes each batch's states while the one
    before trains, and every file is deleted once read; cache: stream, keeping what was asked within
    `disk_budget_gb` so later epochs ask the engine only for the rest; online: the target runs inside the training
    process (transformers). auto: offline when the planned shards fit `disk_budget_gb` and the free disk, else stream."""
    disk_budget_gb: float = Field(50.0, gt=0)
    """Disk the hidden states may take (GB, 10^9 bytes): auto's choice, and the cache's bound."""
    prefetch_batches: int = Field(2, ge=1)
    """stream/cache: batches asked of the engine ahead of the one training (each one's files stay on disk until read)."""
    engine_restarts: int = Field(2, ge=0)
    """stream/cache: times a dead engine is restarted (and its batch asked again) before the run fails."""
    draft_vocab_size: int = Field(32_000, gt=0)
    """Draft vocabulary size (capped at the target vocab)."""
    ttt_steps: int = Field(7, ge=1)
    """Training-time test: unrolled steps, each feeding back the draft's own hidden state."""
    ttt_decay: float = Field(0.8, gt=0, le=1)
    """Weight of step i's loss is decay**i."""
    loss: Loss = "soft_ce"
    """Each position's loss against the target's distribution p on the draft vocabulary (tasks/draft/ttt.py), q the
    draft's: soft_ce −Σ p log q (EAGLE-3's); tv 1 − α, α = Σ min(p, q) the chance a sampled draft token is accepted;
    lk λ·KL(p‖q) + (1 − λ)·(1 − α), λ = exp(−lk_eta · mean α) per unrolled step (the LK losses' hybrid)."""
    lk_eta: float = Field(3.0, gt=0)
    """lk: how fast the KL term gives way to acceptance as the step's mean α rises."""
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
    draft: DraftShape = Field(default_factory=DraftShape)
    """The draft layer's attention and the EAGLE-3.1 switches."""
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

    @model_validator(mode="after")
    def _streams_in_one_process(self) -> TrainConfig:
        if self.hidden_states in ("stream", "cache") and self.processes > 1:
            raise ValueError(f"train.hidden_states: {self.hidden_states} trains in one process; set train.processes: 1")
        return self

    @model_validator(mode="before")
    @classmethod
    def _renamed_mode(cls, data: Any) -> Any:
        if isinstance(data, dict) and "mode" in data:
            raise ValueError(
                f"train.mode is now train.hidden_states (offline | online | stream | cache | auto); got mode: {data['mode']}"
            )
        return data
