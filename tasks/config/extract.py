"""The `extract` section: how the target's hidden states are captured and stored."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tasks.config.base import StrictModel


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
    storage_dtype: Literal["bfloat16", "float8_e4m3fn"] = "bfloat16"
    """How stored states are written (offline shards and the training cache): bf16, or fp8 (e4m3) with one fp32 scale
    per token and state, about half the bytes (bench/stream.py measures what it costs in τ)."""
    norm_range: tuple[float, float] = (1e-3, 1e4)
    """Gate: each shard's mean L2 norm per stored state (3 aux + final) must lie in this range."""
