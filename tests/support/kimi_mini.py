"""Kimi-K2.5 in miniature: the real checkpoint's layout around a small random body, built reproducibly.

`config.json` is the wrapper's (`model_type: kimi_k25`, `KimiK25ForConditionalGeneration`) with a DeepSeek-V3 text
body under `text_config`: Kimi's MLA head sizes (`kv_lora_rank` 512 and `qk_rope_head_dim` 64, the one head size
vLLM's CPU MLA kernel takes), its routing (`noaux_tc`, sigmoid scores, a shared expert, the first layer dense) and a
small everything-else; a tiny `vision_config`. The weights are random (seeded) under the real prefixes
(`language_model.model.*`, `language_model.lm_head.*`, `vision_tower.*`, `mm_projector.*`) in two shards with an
index, as the real repository shards them. The tokenizer is the Kimi stand-in with K2.5's template
(`tests/support/kimi_target.py`). What it proves is that every stage runs on the shape; its τ says nothing of quality.

One part is not random: the output head (`successor_head`). A random head over 163,840 tokens gives a near-uniform
distribution whose top logits tie at bf16's resolution, and greedy decoding then depends on how a kernel batched
the sum: vLLM's own greedy server, asked the same prefix again as a prompt, picks the other of two tokens whose
log-probabilities are equal. Real targets are confident; the miniature is made so by giving each token a successor.
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
    num_hidden_layers: int = 8  # EAGLE-3's default aux layers (2, L//2, L-3) are distinct from 6 on
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
    """A DeepSeek-V3 body as Kimi-K2.5's `text_config` spells it (`kimi_k2`, which transformers' Kimi_K25Config
    builds as a DeepseekV3Config); vLLM needs the routing fields written out, or it has no parameter for
    `e_score_correction_bias`."""
    return {
        "model_type": "kimi_k2",
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


# A tiny MoonViT and its patch-merger projector: hidden, layers, heads, MLP, patch, position grid, frames, merge.
VISION = {"hidden": 64, "layers": 2, "heads": 2, "inter": 128, "patch": 14, "pos": 16, "time": 4, "merge": 2}
MEDIA_PAD = 163605  # <|media_pad|>: vLLM checks the config's image token against the tokenizer's


def vision_config() -> dict:
    """MoonViT's fields as transformers' Kimi_K25VisionConfig and vLLM's vision tower read them."""
    v = VISION
    return {
        "model_type": "kimi_k25_vision",
        "patch_size": v["patch"],
        **{f"{p}pos_emb_{a}": v["pos"] for p in ("", "init_") for a in ("height", "width")},
        **{f"{p}pos_emb_time": v["time"] for p in ("", "init_")},
        "hidden_size": v["hidden"],
        "num_hidden_layers": v["layers"],
        "num_attention_heads": v["heads"],
        "intermediate_size": v["inter"],
        "hidden_act": "gelu_pytorch_tanh",
        "merge_kernel_size": [v["merge"], v["merge"]],
        "merge_type": "sd2_tpool",
        "pos_emb_type": "divided_fixed",
        "video_attn_type": "spatial_temporal",
        "mm_projector_type": "patchmerger",
        "projector_hidden_act": "gelu",
        "projector_ln_eps": 1e-5,
    }


def wrapper_config(shape: MiniShape) -> dict:
    """The wrapper's config.json around the text body. `tie_word_embeddings` is written out: Kimi_K25Config defaults
    it to true, and K2.5 has an lm_head of its own."""
    return {
        "model_type": "kimi_k25",
        "architectures": ["KimiK25ForConditionalGeneration"],
        "text_config": text_config(shape),
        "vision_config": vision_config(),
        "projection_hidden_size": VISION["hidden"],
        "projection_layer_norm_eps": 1e-5,
        "image_token_id": MEDIA_PAD,
        "media_placeholder_token_id": MEDIA_PAD,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


# What vLLM's image processor reads at start-up, even for text: a small patch limit keeps its profiling image inside
# a 2048-token context.
MEDIA_PROCESSING = {
    "in_patch_limit": 1024,
    "patch_size": VISION["patch"],
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "merge_kernel_size": VISION["merge"],
    "fixed_output_tokens": None,  # every key is read, the unset ones as None
    "patch_limit_on_one_side": 64,
    "in_patch_limit_each_frame": 1024,
    "in_patch_limit_video": None,
    "sample_fps": 2.0,
    "max_num_frames_each_video": None,
    "temporal_merge_kernel_size": VISION["time"],
    "timestamp_mode": "hh:mm:ss.fff",
    "config_type": "kimi_k25",
}


def vision_weights(text_hidden: int, seed: int) -> dict:
    """MoonViT and its projector, random, bf16, under the real checkpoint's names."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    D, inner, P, merged = VISION["hidden"], VISION["inter"], VISION["patch"], VISION["hidden"] * VISION["merge"] ** 2

    def random(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    def norm(prefix: str, n: int) -> dict:
        return {f"{prefix}.weight": torch.ones(n, dtype=torch.bfloat16), f"{prefix}.bias": torch.zeros(n, dtype=torch.bfloat16)}

    def linear(prefix: str, out: int, inp: int) -> dict:
        return {f"{prefix}.weight": random(out, inp), f"{prefix}.bias": torch.zeros(out, dtype=torch.bfloat16)}

    tower = "vision_tower"
    tensors = {
        f"{tower}.patch_embed.proj.weight": random(D, 3, P, P),
        f"{tower}.patch_embed.proj.bias": torch.zeros(D, dtype=torch.bfloat16),
        f"{tower}.patch_embed.pos_emb.weight": random(VISION["pos"], VISION["pos"], D),
    }
    for i in range(VISION["layers"]):
        block = f"{tower}.encoder.blocks.{i}"
        tensors |= norm(f"{block}.norm0", D) | norm(f"{block}.norm1", D)
        tensors |= linear(f"{block}.wqkv", 3 * D, D) | linear(f"{block}.wo", D, D)
        tensors |= linear(f"{block}.mlp.fc0", inner, D) | linear(f"{block}.mlp.fc1", D, inner)
    tensors |= norm(f"{tower}.encoder.final_layernorm", D) | norm("mm_projector.pre_norm", D)
    return tensors | linear("mm_projector.proj.0", merged, merged) | linear("mm_projector.proj.2", text_hidden, merged)


def text_body(shape: MiniShape, seed: int) -> dict:
    """The text body's tensors, bf16, named as a DeepSeek-V3 checkpoint names them (transformers saves them so)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = dict(text_config(shape), model_type="deepseek_v3")  # the class transformers builds `kimi_k2` with
    config = AutoConfig.for_model(config.pop("model_type"), **config)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        return {name: t for f in sorted(Path(tmp).glob("*.safetensors")) for name, t in load_file(f).items()}


def text_tokens(vocab_size: int) -> list[int]:
    """Ids below `vocab_size` whose bytes (the stand-in tokenizer's tiktoken ranks) are printable UTF-8 text: what a
    reply's text carries, so the miniature's replies survive a text API."""
    import base64

    from tasks.target_model.assets import fetch
    from tests.support.kimi_target import CL100K

    ids = []
    for line in fetch(CL100K).read_text().splitlines():
        token, rank = line.split()
        try:
            text = base64.b64decode(token).decode("utf-8")
        except UnicodeDecodeError:
            continue
        if int(rank) < vocab_size and text.strip() and text.isprintable():
            ids.append(int(rank))
    return ids


# The logit of a token's successor; every other token scores about N(0, (it / 16)²). Greedy's margin is about 9 and
# sampling at temperature 1 leaves the successor about one token in four, so sampled replies differ.
SUCCESSOR_LOGIT = 13.5
UNREACHABLE_LOGIT = 40.0


def successor_head(embedding, successors, seed: int):
    """An lm_head under which token x is followed by a fixed text token by a wide margin: the row of token y is the
    sum of the embeddings of the tokens it follows, so the embedding the residual stream carries (random, unit
    variance, RMS-normed) scores its successor at SUCCESSOR_LOGIT. The layers still move the states; they do not
    move the argmax. Each text token follows one or two others. The embedding's last feature is 1 for every token:
    the head reads it only for the tokens no one is followed by (special tokens, ids without bytes), at
    -UNREACHABLE_LOGIT, so sampling never lands on them."""
    import torch

    vocab, hidden = embedding.shape
    g = torch.Generator().manual_seed(seed + 2)
    successors = torch.as_tensor(successors)
    follows = successors[torch.randperm(vocab, generator=g) % len(successors)]
    head = torch.zeros(vocab, hidden, dtype=torch.float32)
    head.index_add_(0, follows, embedding.float() * SUCCESSOR_LOGIT / hidden)
    head[:, -1] = 0.0
    unfollowed = torch.ones(vocab, dtype=torch.bool)
    unfollowed[follows] = False
    head[unfollowed, -1] = -UNREACHABLE_LOGIT
    return head.to(embedding.dtype)


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
    import torch

    from tests.support.kimi_target import kimi_model_dir

    dest.mkdir(parents=True, exist_ok=True)
    body = text_body(shape, seed)
    g = torch.Generator().manual_seed(seed + 3)
    embedding = torch.randn(shape.vocab_size, shape.hidden_size, generator=g)
    embedding[:, -1] = 1.0  # read by the head only for the tokens nothing precedes (successor_head)
    embedding = embedding.to(torch.bfloat16)
    body["model.embed_tokens.weight"] = embedding
    body["lm_head.weight"] = successor_head(embedding, text_tokens(shape.vocab_size), seed)
    tensors = {f"language_model.{name}": t for name, t in body.items()}
    write_shards(dest, tensors | vision_weights(shape.hidden_size, seed))
    (dest / "config.json").write_text(json.dumps(wrapper_config(shape), indent=1), encoding="utf-8")
    (dest / "preprocessor_config.json").write_text(json.dumps({"media_proc_cfg": MEDIA_PROCESSING}, indent=1))
    if tokenizer:
        kimi_model_dir(dest)
        lenient_decode(dest / "tokenization_kimi.py")
    return dest


def text_body_model(mini: Path, dtype="float32"):
    """The miniature's text body as transformers' DeepseekV3ForCausalLM, from the wrapper's shards with the prefix
    taken off: the reference for draftsmith's own decoding loop, which has no class for the wrapper itself."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    config = json.loads((mini / "config.json").read_text())["text_config"] | {"model_type": "deepseek_v3"}
    prefix = "language_model."
    tensors = {
        name[len(prefix) :]: t
        for f in sorted(mini.glob("*.safetensors"))
        for name, t in load_file(f).items()
        if name.startswith(prefix)
    }
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        save_file(tensors, Path(tmp) / "model.safetensors", metadata={"format": "pt"})
        return AutoModelForCausalLM.from_pretrained(tmp, dtype=getattr(torch, dtype)).eval()


# The stand-in's ranks are cl100k's (ids below 100256) and its specials start at 163584: the ids between have no
# bytes, and an engine decodes any id it scores (a logprob's alternatives), which would fail on them.
# The miniature's copy decodes them as empty text; the real tokenizer has no such gap.
STRICT_DECODE = "        return self.model.decode([token_ids] if isinstance(token_ids, int) else list(token_ids))\n"
LENIENT_DECODE = (
    "        ids = [token_ids] if isinstance(token_ids, int) else list(token_ids)\n"
    "        return self.model.decode([i for i in ids if i in self.decoder])  # ids without bytes: no text\n"
)


def lenient_decode(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    assert STRICT_DECODE in source, "tokenization_kimi.py changed: revisit lenient_decode"
    path.write_text(source.replace(STRICT_DECODE, LENIENT_DECODE), encoding="utf-8")


if __name__ == "__main__":
    import sys

    print(build_kimi_mini(Path(sys.argv[1])))
