"""The EAGLE-3 draft: `fc` fuses three target layers, one decoder layer with 2H attention input, `lm_head`.

The layer's attention is Llama's or DeepSeek-V2's latent attention (MLA); EAGLE-3.1's switches add a norm per
fused state (`fc_norm`) and feed the next unrolled step the post-norm state (`norm_output`). A P-EAGLE draft
(`parallel_drafting`) drafts every step after the first from a mask token and a learned `mask_hidden` instead of
the step before, so an engine proposes all k tokens in one forward. Names follow what
SGLang's and vLLM's eagle3 loaders read, so the state dict (minus the frozen target embedding) is the export.
Shapes: B batch, T tokens, H draft hidden, H_t target hidden, N draft vocab, V target vocab.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class DraftConfig:
    """Llama fields of the draft layer; derived from the target's config, each one overridable."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    target_hidden_size: int
    vocab_size: int
    draft_vocab_size: int
    hidden_act: str = "silu"
    arch: str = "llama"  # llama | mla (DeepSeek-V2 latent attention)
    fc_norm: bool = False  # EAGLE-3.1: an RMSNorm per captured state before fc
    norm_output: bool = False  # EAGLE-3.1: the next step reads the post-norm state
    norm_before_fc: bool = False  # one RMSNorm over the concatenated states before fc
    parallel_drafting: bool = False  # P-EAGLE: steps after the first read mask_token_id and mask_hidden
    mask_token_id: int | None = None  # P-EAGLE: the token the masked slots embed (the target's embedding of it)
    # MLA only: the latent ranks and per-head widths (DeepSeek-V3's names).
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None

    @classmethod
    def from_target(
        cls, target_config: Any, draft_vocab_size: int, overrides: dict | None = None, shape: dict | None = None
    ) -> DraftConfig:
        """Copy the target's layer shape; the draft hidden size must equal it (the embedding is shared). `shape`: the
        arch and switches of `train.draft`. An MLA draft of a DeepSeek-V3 body copies its latent sizes; of another
        target, sizes of the same proportions are derived from its head width."""
        rope = getattr(target_config, "rope_parameters", None) or {}
        heads = target_config.num_attention_heads
        head_dim = getattr(target_config, "head_dim", None) or target_config.hidden_size // heads
        values = {
            "hidden_size": target_config.hidden_size,
            "num_attention_heads": heads,
            "num_key_value_heads": getattr(target_config, "num_key_value_heads", None) or heads,
            "head_dim": getattr(target_config, "head_dim", None) or target_config.hidden_size // heads,
            "intermediate_size": target_config.intermediate_size,
            "rms_norm_eps": target_config.rms_norm_eps,
            "rope_theta": float(rope.get("rope_theta", getattr(target_config, "rope_theta", 10000.0))),
            "max_position_embeddings": target_config.max_position_embeddings,
            "target_hidden_size": target_config.hidden_size,
            "vocab_size": target_config.vocab_size,
            "draft_vocab_size": min(draft_vocab_size, target_config.vocab_size),
            "hidden_act": getattr(target_config, "hidden_act", "silu"),
            **(shape or {}),
        }
        if values.get("arch") == "mla":
            derived = {
                "q_lora_rank": 6 * head_dim,
                "kv_lora_rank": 4 * head_dim,
                "qk_nope_head_dim": head_dim,
                "qk_rope_head_dim": head_dim // 2,
                "v_head_dim": head_dim,
            }
            values |= {k: getattr(target_config, k, None) or v for k, v in derived.items()}
        if values.get("parallel_drafting") and values.get("mask_token_id") is None:
            values["mask_token_id"] = mask_token(target_config)
        known = {f.name for f in fields(cls)}
        for key, value in (overrides or {}).items():
            if key not in known:
                raise ValueError(f"train.draft_overrides: unknown draft config field {key!r}; known: {sorted(known)}")
            values[key] = value
        if values["hidden_size"] != target_config.hidden_size:
            raise ValueError("train.draft_overrides.hidden_size must equal the target's: the token embedding is shared")
        return cls(**values)

    def to_dict(self) -> dict:
        return asdict(self)


def mask_token(target_config: Any) -> int:
    """The id P-EAGLE's masked slots embed: the target's pad token, else its (first) end token. The draft shares the
    target's frozen embedding, so the slots learn through `mask_hidden`; the id only has to be a valid row."""
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(target_config, name, None)
        value = value[0] if isinstance(value, list | tuple) and value else value
        if isinstance(value, int) and 0 <= value < target_config.vocab_size:
            return value
    return 0


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (Llama's rotate-half layout). x (B, h, T, d), positions (B, T)."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))  # (d/2,)
    angles = positions.float()[..., None] * inv_freq  # (B, T, d/2)
    angles = torch.cat([angles, angles], dim=-1)[:, None]  # (B, 1, T, d)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    half = d // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def rotate_pairs(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding on consecutive pairs (x0, x1), (x2, x3), ... (DeepSeek's MLA layout: vLLM's and SGLang's
    is_neox_style=False). x (B, h, T, d), positions (B, T)."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))  # (d/2,)
    angles = (positions.float()[..., None] * inv_freq)[:, None]  # (B, 1, T, d/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: list, past: tuple | None) -> torch.Tensor:
    """The training-time-test attention: causal over step 0's keys, and each later unrolled step's key only at the
    same position (that step's own draft token). q, k (B, h, T, d_qk), v (B, h, T, d_v) -> (B, h, T, d_v).

    `cache` holds (k, v) of earlier unrolled steps and gets this step's. `past` (step 0 only, at inference): step-0
    keys/values of earlier positions, (B, h, P, d) each; the queries are then the last T of P + T positions.
    """
    T = q.shape[2]
    if not cache and past is not None:
        k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)  # (B, h, P + T, d)
    cache.append((k, v))
    scale = 1.0 / math.sqrt(q.shape[-1])
    k0, v0 = cache[0]
    T0 = k0.shape[2]
    causal = torch.ones(T, T0, dtype=torch.bool, device=q.device).tril(diagonal=T0 - T)
    scores = (q @ k0.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))  # (B, h, T, T0)
    diagonal = [(q * kj).sum(-1, keepdim=True) * scale for kj, _ in cache[1:]]  # (B, h, T, 1) each
    probs = torch.softmax(torch.cat([scores, *diagonal], dim=-1).float(), dim=-1).to(q.dtype)
    out = probs[..., :T0] @ v0  # (B, h, T, d_v)
    for j, (_, vj) in enumerate(cache[1:]):
        out = out + probs[..., T0 + j, None] * vj
    return out


class Eagle3Attention(nn.Module):
    """Llama self-attention whose q/k/v read 2H features (grouped-query heads, rotate-half rotary)."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.cfg = cfg
        h, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(2 * cfg.hidden_size, h * d, bias=False)
        self.k_proj = nn.Linear(2 * cfg.hidden_size, kv * d, bias=False)
        self.v_proj = nn.Linear(2 * cfg.hidden_size, kv * d, bias=False)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: list, past: tuple | None = None) -> torch.Tensor:
        """x (B, T, 2H), positions (B, T) -> (B, T, H); see `attend` for `cache` and `past`."""
        cfg = self.cfg
        B, T, _ = x.shape
        h, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q = self.q_proj(x).view(B, T, h, d).transpose(1, 2)  # (B, h, T, d)
        k = self.k_proj(x).view(B, T, kv, d).transpose(1, 2)  # (B, kv, T, d)
        v = self.v_proj(x).view(B, T, kv, d).transpose(1, 2)
        q, k = rotate(q, positions, cfg.rope_theta), rotate(k, positions, cfg.rope_theta)
        k, v = k.repeat_interleave(h // kv, dim=1), v.repeat_interleave(h // kv, dim=1)  # (B, h, T, d)
        out = attend(q, k, v, cache, past)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, h * d))  # (B, T, H)


class MLAAttention(nn.Module):
    """DeepSeek-V2 multi-head latent attention over 2H features: queries and keys/values each pass through a
    low-rank latent; a shared rotary key part (MQA) joins each head's own part."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.cfg = cfg
        h, nope, rope, v = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.q_a_proj = nn.Linear(2 * cfg.hidden_size, cfg.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
        self.q_b_proj = nn.Linear(cfg.q_lora_rank, h * (nope + rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(2 * cfg.hidden_size, cfg.kv_lora_rank + rope, bias=False)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, h * (nope + v), bias=False)
        self.o_proj = nn.Linear(h * v, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: list, past: tuple | None = None) -> torch.Tensor:
        """x (B, T, 2H), positions (B, T) -> (B, T, H); see `attend` for `cache` and `past`."""
        cfg = self.cfg
        B, T, _ = x.shape
        h, nope, rope, dv = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(B, T, h, nope + rope).transpose(1, 2)
        q_nope, q_rope = q.split([nope, rope], dim=-1)  # (B, h, T, nope), (B, h, T, rope)
        latent, k_rope = self.kv_a_proj_with_mqa(x).split([cfg.kv_lora_rank, rope], dim=-1)  # (B, T, r), (B, T, rope)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(B, T, h, nope + dv).transpose(1, 2)
        k_nope, v = kv.split([nope, dv], dim=-1)  # (B, h, T, nope), (B, h, T, dv)
        q_rope = rotate_pairs(q_rope, positions, cfg.rope_theta)
        k_rope = rotate_pairs(k_rope[:, None], positions, cfg.rope_theta).expand(B, h, T, rope)  # one key for all heads
        q, k = torch.cat([q_nope, q_rope], dim=-1), torch.cat([k_nope, k_rope], dim=-1)  # (B, h, T, nope + rope)
        out = attend(q, k, v, cache, past)  # (B, h, T, dv)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, h * dv))  # (B, T, H)


class Eagle3MLP(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Eagle3DecoderLayer(nn.Module):
    """The `midlayer`: attention over cat(input_layernorm(embed), hidden_norm(hidden)), residual from hidden."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = MLAAttention(cfg) if cfg.arch == "mla" else Eagle3Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = Eagle3MLP(cfg)

    def forward(
        self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, cache: list, past: tuple | None = None
    ) -> torch.Tensor:
        """embeds, hidden (B, T, H) -> (B, T, H), the pre-norm state fed back to the next step."""
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)  # (B, T, 2H)
        h = hidden + self.self_attn(x, positions, cache, past)
        return h + self.mlp(self.post_attention_layernorm(h))


AUX_STATES = 3  # target layers fused by fc


class Eagle3Draft(nn.Module):
    """fc -> midlayer -> norm -> lm_head, with the target's frozen embedding and the d2t/t2d vocab maps."""

    def __init__(self, cfg: DraftConfig, embed_weight: torch.Tensor, d2t: torch.Tensor, t2d: torch.Tensor):
        super().__init__()
        self.cfg = cfg
        # The target's embedding: frozen and never saved (state_dict drops it).
        self.embed_tokens = nn.Embedding.from_pretrained(embed_weight.detach().clone(), freeze=True)
        if cfg.norm_before_fc:
            self.input_norm = RMSNorm(AUX_STATES * cfg.target_hidden_size, cfg.rms_norm_eps)
        if cfg.fc_norm:  # EAGLE-3.1
            self.fc_norm = nn.ModuleList(RMSNorm(cfg.target_hidden_size, cfg.rms_norm_eps) for _ in range(AUX_STATES))
        self.fc = nn.Linear(AUX_STATES * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = Eagle3DecoderLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", d2t.to(torch.int64))  # (N,) target id = draft id + d2t[draft id]
        self.register_buffer("t2d", t2d.to(torch.bool))  # (V,) target id is in the draft vocab
        for module in (self.fc, self.lm_head, *self.midlayer.modules()):
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
        if cfg.parallel_drafting:  # P-EAGLE: the aux states every masked slot reads (vLLM's name and shape)
            self.mask_hidden = nn.Parameter(torch.randn(1, AUX_STATES * cfg.target_hidden_size) * 0.02)

    def state_dict(self, *args, **kwargs):
        state = super().state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", "")
        state.pop(f"{prefix}embed_tokens.weight", None)
        return state

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        state = dict(state_dict)
        state["embed_tokens.weight"] = self.embed_tokens.weight
        return super().load_state_dict(state, strict=strict, assign=assign)

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """Three concatenated target states -> draft hidden. (B, T, 3*H_t) -> (B, T, H)"""
        x = aux.to(self.fc.weight.dtype)
        if self.cfg.norm_before_fc:
            x = self.input_norm(x)
        if self.cfg.fc_norm:  # each captured state normalised on its own
            x = torch.cat([norm(chunk) for norm, chunk in zip(self.fc_norm, x.chunk(AUX_STATES, dim=-1), strict=True)], -1)
        return self.fc(x)

    def masked(self, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """P-EAGLE's input for (B, T) masked slots: the mask token ids (B, T) and fuse(mask_hidden) (B, T, H)."""
        ids = torch.full(shape, self.cfg.mask_token_id, dtype=torch.long, device=self.mask_hidden.device)
        return ids, self.fuse(self.mask_hidden).expand(*shape, -1)

    def step(
        self,
        target_ids: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cache: list,
        past: tuple | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step. target_ids (B, T), hidden (B, T, H) -> (next hidden (B, T, H), logits (B, T, N)).

        The next step reads the pre-norm state (EAGLE-3), or the post-norm one the logits read (`norm_output`,
        EAGLE-3.1), as the engines feed it.
        """
        embeds = self.embed_tokens(target_ids).to(hidden.dtype)  # (B, T, H)
        out = self.midlayer(embeds, hidden, positions, cache, past)
        normed = self.norm(out)
        return (normed if self.cfg.norm_output else out), self.lm_head(normed)

    def forward(
        self,
        aux: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        steps: int,
        next_tokens: list[torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        """Unroll `steps` draft steps; returns each step's logits (B, T, N).

        aux (B, T, 3*H_t) and tokens (B, T) feed step 0; step i reads position + i. Later steps read the
        previous step's hidden state and either its argmax token or `next_tokens[i - 1]` when given; a P-EAGLE draft's
        read the mask inputs, attending to the real context and the masked slots before them, as vLLM serves it.
        """
        hidden = self.fuse(aux)  # (B, T, 3*H_t) -> (B, T, H)
        cache: list = []
        out = []
        for i in range(steps):
            hidden, logits = self.step(tokens, hidden, positions + i, cache)
            out.append(logits)
            if self.cfg.parallel_drafting:
                tokens, hidden = self.masked(tokens.shape)
            elif i + 1 < steps:
                tokens = next_tokens[i] if next_tokens is not None else self.to_target(logits.argmax(-1))
        return out

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft vocab ids -> target vocab ids."""
        return draft_ids + self.d2t[draft_ids]
