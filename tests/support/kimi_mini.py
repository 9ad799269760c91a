"""Kimi-K2.5 in miniature: the real checkpoint's layout around a small random body, built reproducibly.

`config.json` is the wrapper's (`model_type: kimi_k25`, `KimiK25ForConditionalGeneration`) with a DeepSeek-V3 text
body under `text_config`: Kimi's MLA head sizes (`kv_lora_rank` 512 and `qk_rope_head_dim` 64, the one head size
vLLM's CPU MLA kernel takes), its routing (`noaux_tc`, sigmoid scores, a shared expert, the first layer dense) and a
small everything-else; a tiny `vision_config`. The weights are random (seeded) under the real prefixes
(`language_model.model.*`, `language_model.lm_head.*`, `vision_tower.*`, `mm_projector.*`) in two shards with an
index, as the real repository shards them. The tokenizer is the Kimi stand-in with K2.5's template
(`tests/support/kimi_target.py`). What it proves is that every stage runs on the shape; its τ says nothing of quality.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from tasks.target_model.checkpoint import INDEX

# The real checkpoint's vocabulary: tiktoken ranks plus the special tokens from 163584 on.
KIMI_VOCAB = 163_840


@dataclass(frozen=True)
class MiniShape:
    """The text body's sizes; the latent attention sizes are Kimi-K2.5's own."""

    vocab_size: int = KIMI_VOCAB
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    intermediate_size: int = 512  # the dense first layer's MLP
    moe_intermediate_size: int = 128
    n_routed_experts: int = 8
    num_experts_per_tok: int = 2
    q_lora_rank: int = 64
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 64
    v_head_dim: int = 64


def text_config(shape: MiniShape) -> dict:
    """A DeepSeek-V3 body as Kimi-K2.5's `text_config` spells it (vLLM needs the routing fields written out)."""
    return {
        "model_type": "deepseek_v3",
        "architectures": ["DeepseekV3ForCausalLM"],
        **asdict(shape),
        "num_key_value_heads": shape.num_attention_heads,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 50000.0,
        "tie_word_embeddings": False,
        # [BOS] and [EOS] where the vocabulary holds Kimi's special tokens (a smaller one has none).
        "bos_token_id": 163584 if shape.vocab_size == KIMI_VOCAB else None,
        "eos_token_id": 163585 if shape.vocab_size == KIMI_VOCAB else None,
    }


def wrapper_config(shape: MiniShape) -> dict:
    """The wrapper's config.json around the text body (no weights of the vision side are needed to read it)."""
    return {
        "model_type": "kimi_k25",
        "architectures": ["KimiK25ForConditionalGeneration"],
        "text_config": text_config(shape),
        "vision_config": {"model_type": "moonvit", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2},
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }


def text_body(shape: MiniShape, seed: int) -> dict:
    """The text body's tensors, bf16, named as a DeepSeek-V3 checkpoint names them (transformers saves them so)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = dict(text_config(shape))
    config = AutoConfig.for_model(config.pop("model_type"), **config)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        return {name: t for f in sorted(Path(tmp).glob("*.safetensors")) for name, t in load_file(f).items()}


def write_shards(dest: Path, tensors: dict, shards: int = 2) -> None:
    """`model-0000i-of-0000n.safetensors` files and their index, tensors split by name order."""
    from safetensors.torch import save_file

    names = sorted(tensors)
    per = -(-len(names) // shards)
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n].contiguous() for n in names[i * per : (i + 1) * per]}
        save_file(part, dest / file, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(part, file)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (dest / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))


def build_kimi_mini(dest: Path, shape: MiniShape = MiniShape(), seed: int = 0, tokenizer: bool = True) -> Path:
    """Write the miniature into `dest` (config, sharded weights under the wrapper's prefixes, and the tokenizer)."""
    from tests.support.kimi_target import kimi_model_dir

    dest.mkdir(parents=True, exist_ok=True)
    tensors = {f"language_model.{name}": t for name, t in text_body(shape, seed).items()}
    write_shards(dest, tensors)
    (dest / "config.json").write_text(json.dumps(wrapper_config(shape), indent=1), encoding="utf-8")
    if tokenizer:
        kimi_model_dir(dest)
    return dest
