"""Export the draft as SGLang (`--speculative-algorithm EAGLE3`) and vLLM (`method: eagle3`) load it.

`config.json` is a Llama config with one layer plus the EAGLE-3 fields; `model.safetensors` holds
exactly `fc.weight`, `midlayer.*`, `norm.weight`, `lm_head.weight`, `d2t` and `t2d`: no embedding,
the engines take the target's.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tasks.draft.model import DraftConfig, Eagle3Draft
from tasks.extract.backend import engine_layer_ids
from tasks.storage import atomic_path

ARCHITECTURE = "LlamaForCausalLMEagle3"


def export_config(cfg: DraftConfig, hf_indices: list[int], engine: str, dtype: str, eos_token_id: int | None) -> dict:
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": cfg.hidden_act,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": cfg.max_position_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "eos_token_id": eos_token_id,
        "torch_dtype": dtype,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": engine_layer_ids(hf_indices, engine),
            "use_aux_hidden_state": True,
        },
        # The ids above in their engine's convention, and the HF hidden_states indices they mean.
        "draftsmith": {"layer_id_convention": engine, "aux_hidden_states_hf_indices": list(hf_indices)},
    }


def export_tensors(state: dict[str, torch.Tensor], dtype: str) -> dict[str, torch.Tensor]:
    """Checkpoint state -> export tensors: weights in `dtype`, d2t int64, t2d bool, no embedding."""
    out = {}
    for name, tensor in state.items():
        if name.startswith("embed_tokens."):
            continue
        if name == "d2t":
            out[name] = tensor.to(torch.int64)
        elif name == "t2d":
            out[name] = tensor.to(torch.bool)
        else:
            out[name] = tensor.detach().to(getattr(torch, dtype)).contiguous()
    return out


def export_draft(
    state: dict[str, torch.Tensor],
    cfg: DraftConfig,
    hf_indices: list[int],
    out_dir: Path,
    engine: str = "sglang",
    dtype: str = "bfloat16",
    eos_token_id: int | None = None,
) -> Path:
    """Write config.json and model.safetensors into `out_dir` (each atomically)."""
    out_dir = Path(out_dir)
    with atomic_path(out_dir / "model.safetensors") as tmp:
        save_file(export_tensors(state, dtype), str(tmp), metadata={"format": "pt"})
    with atomic_path(out_dir / "config.json") as tmp:
        tmp.write_text(json.dumps(export_config(cfg, hf_indices, engine, dtype, eos_token_id), indent=2), encoding="utf-8")
    return out_dir


def read_export_config(export_dir: Path) -> tuple[DraftConfig, list[int]]:
    """The draft config and the HF hidden_states indices of an export."""
    data = json.loads((Path(export_dir) / "config.json").read_text(encoding="utf-8"))
    fields = DraftConfig.__dataclass_fields__
    cfg = DraftConfig(**{k: data[k] for k in fields if k in data})
    meta = data.get("draftsmith") or {}
    if "aux_hidden_states_hf_indices" in meta:
        return cfg, list(meta["aux_hidden_states_hf_indices"])
    ids = data["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    return cfg, [i + 1 for i in ids]  # a plain export in SGLang's convention


def load_export(export_dir: Path, embed_weight: torch.Tensor, dtype: torch.dtype = torch.float32) -> Eagle3Draft:
    """Rebuild the draft from an export with the target's embedding; weights cast to `dtype`."""
    cfg, _ = read_export_config(export_dir)
    tensors = load_file(str(Path(export_dir) / "model.safetensors"))
    draft = Eagle3Draft(cfg, embed_weight, tensors["d2t"], tensors["t2d"])
    state = {k: (v if k in ("d2t", "t2d") else v.to(dtype)) for k, v in tensors.items()}
    draft.load_state_dict(state)
    return draft.to(dtype).eval()
