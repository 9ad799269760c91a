"""Export the draft as SGLang (`--speculative-algorithm EAGLE3`) and vLLM (`method: eagle3`) load it.

`config.json` is a Llama config with one layer (a DeepSeek-V3 one for an MLA draft) plus the EAGLE-3 fields and
EAGLE-3.1's switches; `model.safetensors` holds exactly `fc.weight` (and `fc_norm.{i}.weight` for 3.1),
`midlayer.*`, `norm.weight`, `lm_head.weight`, `d2t` and `t2d` (and P-EAGLE's `mask_hidden`, (1, 3·H_t), with
`mask_token_id` and `parallel_drafting: true` in the config): no embedding, the engines take the target's.
One export serves both engines when the aux layers are EAGLE-3's default
(the layer ids are then left out, and each engine captures its default), and when the draft vocabulary
is the whole vocabulary `d2t` is left out (vLLM then has no parameter to load it into and refuses it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tasks.draft.model import DraftConfig, Eagle3Draft
from tasks.extract.backend import export_layer_ids
from tasks.storage import atomic_path

# What each engine instantiates for a draft of this shape (vLLM and SGLang both register these names).
ARCHITECTURES = {"llama": "LlamaForCausalLMEagle3", "mla": "Eagle3DeepseekV2ForCausalLM"}
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


@dataclass(frozen=True)
class ExportTarget:
    """What an export must know of the target: its layer count and architecture (how engines read layer ids)."""

    num_layers: int
    architecture: str = ""

    @classmethod
    def from_meta(cls, meta: dict) -> ExportTarget:
        """From the extract stage's meta.json."""
        return cls(meta["num_hidden_layers"], meta.get("architecture", ""))


def export_config(
    cfg: DraftConfig, hf_indices: list[int], target: ExportTarget, engine: str, dtype: str, eos_token_id: int | None
) -> dict:
    layer_ids = export_layer_ids(hf_indices, target.num_layers, engine, target.architecture)
    eagle = {"use_aux_hidden_state": True}
    if layer_ids is not None:
        eagle["eagle_aux_hidden_state_layer_ids"] = layer_ids
    if cfg.arch == "mla":  # a DeepSeek-V2 config: latent sizes, one head set for keys and values, a dense MLP
        # Not `deepseek_v3`: vLLM rewrites every draft of that type into its MTP module (`Eagle3DeepSeekMTPModel`,
        # which it then refuses); a `deepseek_v2` draft keeps its architecture and vLLM's MLA cache layout.
        attention = {"model_type": "deepseek_v2", "num_key_value_heads": cfg.num_attention_heads}
        attention |= {name: getattr(cfg, name) for name in MLA_FIELDS}
        # The one draft layer dense as DeepSeek configs say it (the config class refuses `n_routed_experts: null`).
        attention |= {"first_k_dense_replace": 1, "rope_interleave": True}
    else:
        attention = {"model_type": "llama", "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim}
    return {
        "architectures": [ARCHITECTURES[cfg.arch]],
        **attention,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
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
        # EAGLE-3.1 (read by vLLM and SGLang; both false is EAGLE-3), and the one-norm alternative to fc_norm.
        "fc_norm": cfg.fc_norm,
        "norm_output": cfg.norm_output,
        "norm_before_fc": cfg.norm_before_fc,
        # P-EAGLE: vLLM reads mask_token_id; it serves the draft in parallel only when told ("parallel_drafting": true
        # in its speculative config), which draftsmith's evaluate reads from this flag.
        **({"parallel_drafting": True, "mask_token_id": cfg.mask_token_id} if cfg.parallel_drafting else {}),
        "eos_token_id": eos_token_id,
        "torch_dtype": dtype,
        "eagle_config": eagle,
        # The HF hidden_states indices the draft was trained on, and whom the ids above (if any) are written for.
        "draftsmith": {
            "layer_id_convention": engine if layer_ids is not None else "default (any engine)",
            "aux_hidden_states_hf_indices": list(hf_indices),
            "target_architecture": target.architecture,
            "target_num_layers": target.num_layers,
        },
    }


def export_tensors(state: dict[str, torch.Tensor], dtype: str, full_vocab: bool) -> dict[str, torch.Tensor]:
    """Checkpoint state -> export tensors: weights in `dtype`, d2t int64 (none for a full vocab), t2d bool, no
    embedding."""
    out = {}
    for name, tensor in state.items():
        if name.startswith("embed_tokens.") or (name == "d2t" and full_vocab):
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
    target: ExportTarget,
    out_dir: Path,
    engine: str = "sglang",
    dtype: str = "bfloat16",
    eos_token_id: int | None = None,
) -> Path:
    """Write config.json and model.safetensors into `out_dir` (each atomically)."""
    out_dir = Path(out_dir)
    with atomic_path(out_dir / "model.safetensors") as tmp:
        tensors = export_tensors(state, dtype, full_vocab=cfg.draft_vocab_size == cfg.vocab_size)
        save_file(tensors, str(tmp), metadata={"format": "pt"})
    with atomic_path(out_dir / "config.json") as tmp:
        config = export_config(cfg, hf_indices, target, engine, dtype, eos_token_id)
        tmp.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return out_dir


def export_like(state: dict[str, torch.Tensor], export_dir: Path, out_dir: Path) -> Path:
    """Other weights of the same draft written as `export_dir` is: its config.json unchanged, tensors in its dtype."""
    config = json.loads((Path(export_dir) / "config.json").read_text(encoding="utf-8"))
    full_vocab = config["draft_vocab_size"] == config["vocab_size"]
    with atomic_path(Path(out_dir) / "model.safetensors") as tmp:
        save_file(export_tensors(state, config["torch_dtype"], full_vocab), str(tmp), metadata={"format": "pt"})
    with atomic_path(Path(out_dir) / "config.json") as tmp:
        tmp.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return Path(out_dir)


def read_export_config(export_dir: Path) -> tuple[DraftConfig, list[int]]:
    """The draft config and the HF hidden_states indices of an export."""
    data = json.loads((Path(export_dir) / "config.json").read_text(encoding="utf-8"))
    fields = DraftConfig.__dataclass_fields__
    arch = next(a for a, name in ARCHITECTURES.items() if name in data["architectures"])
    head_dim = data.get("head_dim") or data["hidden_size"] // data["num_attention_heads"]
    cfg = DraftConfig(**{k: data[k] for k in fields if k in data} | {"arch": arch, "head_dim": head_dim})
    meta = data.get("draftsmith") or {}
    if "aux_hidden_states_hf_indices" in meta:
        return cfg, list(meta["aux_hidden_states_hf_indices"])
    ids = (data.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        raise ValueError(f"{export_dir}/config.json names no aux layers: EAGLE-3's default needs the target's layer count")
    return cfg, [i + 1 for i in ids]  # a plain export in SGLang's convention for a Llama-like target


def load_export(export_dir: Path, embed_weight: torch.Tensor, dtype: torch.dtype = torch.float32) -> Eagle3Draft:
    """Rebuild the draft from an export with the target's embedding; weights cast to `dtype`."""
    cfg, _ = read_export_config(export_dir)
    tensors = load_file(str(Path(export_dir) / "model.safetensors"))
    d2t = tensors.get("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))  # none: draft id = target id
    draft = Eagle3Draft(cfg, embed_weight, d2t, tensors["t2d"])
    state = {"d2t": d2t, **{k: (v if k in ("d2t", "t2d") else v.to(dtype)) for k, v in tensors.items()}}
    draft.load_state_dict(state)
    return draft.to(dtype).eval()
