"""The target's checkpoint read by name (a Kimi-K2.5-shaped wrapper, nested and sharded, and the demo's Llama), the
draft and export configs for Kimi's shape, and the refusal of in-process backends for a target only an engine runs."""

import json

import pytest
import torch
from typer.testing import CliRunner

from tasks.target_model.checkpoint import (
    CheckpointError,
    causal_lm_class,
    in_process_problems,
    read_config,
    read_tensor,
    tensor_files,
    text_config,
    text_weights,
)
from tests.support.kimi_mini import MiniShape, build_kimi_mini

# Kimi-K2.5's layout and latent attention sizes around a body small enough to build in seconds.
SMALL = MiniShape(vocab_size=1024, hidden_size=64, num_attention_heads=2, intermediate_size=128, moe_intermediate_size=32)
KIMI_CONFIG = "configs/kimi-k2-openrouter.yaml"


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    return build_kimi_mini(tmp_path_factory.mktemp("kimi-mini"), SMALL)


def test_the_text_bodys_embedding_and_lm_head_are_read_by_name_from_the_wrappers_shards(mini):
    files = tensor_files(mini)
    assert len(set(files.values())) == 2  # sharded, with an index
    assert {name.split(".")[0] for name in files} == {"language_model", "vision_tower", "mm_projector"}
    weights = text_weights(mini)
    assert weights.prefix == "language_model."
    assert torch.equal(weights.embed, read_tensor(files, "language_model.model.embed_tokens.weight").float())
    assert torch.equal(weights.lm_head, read_tensor(files, "language_model.lm_head.weight").float())
    assert weights.embed.dtype == torch.float32 and not torch.equal(weights.embed, weights.lm_head)
    body = weights.config
    assert type(body).__name__ == "DeepseekV3Config" and (body.kv_lora_rank, body.qk_rope_head_dim) == (512, 64)
    assert (body.hidden_size, body.vocab_size, body.num_hidden_layers) == (64, 1024, 8)
    # AutoModelForCausalLM loads neither the wrapper nor its `kimi_k2` body: only an engine runs the checkpoint.
    assert causal_lm_class(read_config(mini)) is None and causal_lm_class(text_config(read_config(mini))) is None


def test_the_demo_targets_pieces_by_name_equal_the_loaded_models(demo_model):
    from tasks.config import TargetConfig
    from tasks.target_model.loader import model_dir

    weights = text_weights(model_dir(TargetConfig()))
    assert causal_lm_class(read_config(model_dir(TargetConfig()))) == "LlamaForCausalLM"
    assert weights.prefix == "" and weights.config.hidden_size == demo_model.config.hidden_size
    assert torch.equal(weights.embed, demo_model.get_input_embeddings().weight.float())
    assert torch.equal(weights.lm_head, demo_model.get_output_embeddings().weight.float())  # tied: the embedding


def test_a_checkpoint_without_a_language_models_embedding_is_named(tmp_path):
    from safetensors.torch import save_file

    save_file({"vision_tower.patch_embed.weight": torch.zeros(2, 2)}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(CheckpointError, match="no tensor model.embed_tokens.weight or language_model.model.embed_tokens"):
        text_weights(tmp_path)


@pytest.mark.parametrize("arch", ["llama", "mla"])
def test_the_drafts_export_config_for_kimis_shape(mini, arch):
    from tasks.draft.export import ExportTarget, export_config
    from tasks.draft.model import DraftConfig
    from tasks.extract.backend import default_aux_layer_ids

    body = text_weights(mini).config
    cfg = DraftConfig.from_target(body, 512, None, {"arch": arch, "fc_norm": True, "norm_output": True})
    kimi = ExportTarget(61, "KimiK25ForConditionalGeneration")
    config = export_config(cfg, default_aux_layer_ids(61), kimi, "sglang", "bfloat16", None)
    assert "eagle_aux_hidden_state_layer_ids" not in config["eagle_config"]  # (2, 30, 58): both engines' default
    assert (config["vocab_size"], config["draft_vocab_size"], config["target_hidden_size"]) == (1024, 512, 64)
    assert config["fc_norm"] is True and config["norm_output"] is True
    if arch == "mla":  # the published Kimi-K2.5 drafts' class, with the body's latent sizes
        assert config["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and config["model_type"] == "deepseek_v2"
        assert (config["kv_lora_rank"], config["qk_rope_head_dim"]) == (512, 64)
    else:
        assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    # Other layers: SGLang reads a DeepSeek-V3 body's ids unchanged unless the first is 1; vLLM as given.
    custom = export_config(cfg, [3, 30, 57], kimi, "sglang", "bfloat16", None)
    assert custom["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [3, 30, 57]


def test_in_process_backends_are_refused_for_a_target_only_an_engine_runs(mini):
    from tasks.config import load_config
    from tasks.stages import STAGE_NAMES

    engine_only = load_config(KIMI_CONFIG, {"target.path": str(mini)})
    assert in_process_problems(engine_only, STAGE_NAMES) == []  # the Kimi config runs every stage through vLLM
    overrides = {
        "target.path": str(mini),
        "extract.backend": "transformers",
        "reconstruct.guided.backend": "transformers",
        "train.hidden_states": "online",
        "evaluate.engine": "transformers",
    }
    in_process = load_config(KIMI_CONFIG, overrides)
    problems = in_process_problems(in_process, STAGE_NAMES)
    keys = ["reconstruct.guided.backend", "extract.backend", "train.hidden_states", "evaluate.engine"]
    assert [p.split(":")[0] for p in problems] == keys
    assert all("model_type 'kimi_k25' has no transformers causal-LM class" in p for p in problems)
    assert "set extract.backend: vllm" in problems[1] and "set train.hidden_states: offline or stream" in problems[2]
    assert [p.split(":")[0] for p in in_process_problems(in_process, ["extract"])] == ["extract.backend"]
    without_guided = load_config(KIMI_CONFIG, overrides | {"reconstruct.methods": ["server_ids", "logprobs"]})
    assert "reconstruct.guided.backend" not in " ".join(in_process_problems(without_guided, STAGE_NAMES))


def test_the_cli_refuses_an_in_process_backend_before_any_flow(mini, tmp_path):
    from flows.cli import app

    args = ["--config", KIMI_CONFIG, "--set", f"target.path={mini}", "--set", f"runs_dir={tmp_path}"]
    refused = [*args, "--set", "extract.backend=transformers"]
    result = CliRunner().invoke(app, ["preflight", *refused], terminal_width=400)
    assert result.exit_code == 1 and "extract.backend: transformers cannot run target.path" in result.output
    result = CliRunner().invoke(app, ["run", "--stage", "extract", *refused], terminal_width=400)
    assert result.exit_code == 2 and "set extract.backend: vllm" in result.output
    assert "Traceback" not in result.output and not any(tmp_path.iterdir())  # no run started
    assert CliRunner().invoke(app, ["preflight", *args], terminal_width=400).exit_code == 0


def test_offline_training_takes_the_targets_pieces_without_building_the_model(mini):
    """transformers cannot build the wrapper: reading two tensors by name is the only way in, and all training needs."""
    from tasks.config import load_config
    from tasks.draft.train import load_target_pieces

    pieces = load_target_pieces(load_config(KIMI_CONFIG, {"target.path": str(mini)}), keep_model=False)
    assert pieces.model is None and type(pieces.config).__name__ == "DeepseekV3Config"
    assert torch.equal(pieces.embed, text_weights(mini).embed) and torch.equal(pieces.lm_head, text_weights(mini).lm_head)


def test_sglangs_kimi_k25_loader_takes_every_tensor_of_a_draft_of_the_miniatures_shape(mini, tmp_path):
    """SGLang 0.5.23's own `load_weights` of `Eagle3DeepseekV2ForCausalLM` (kimi_k25_eagle3.py) over the MLA export of
    a draft built from the miniature's body (Kimi's latent sizes, a 512-token vocabulary with d2t), exported for the
    real target's 61 layers: every tensor lands in a parameter, q_a and kv_a in the fused one."""
    from safetensors.torch import load_file

    from tasks.draft.export import ExportTarget, export_draft
    from tasks.draft.model import DraftConfig, Eagle3Draft
    from tasks.draft.vocab import build_draft_vocab
    from tasks.extract.backend import default_aux_layer_ids
    from tests.tasks.test_draft_shapes import SGLANG, SGLANG_MLA_PARAMS, Recorder, Skipped, engine_method

    weights = text_weights(mini)
    shape = {"arch": "mla", "fc_norm": True, "norm_output": True}
    cfg = DraftConfig.from_target(weights.config, 512, None, shape)
    vocab = build_draft_vocab(torch.arange(SMALL.vocab_size).flip(0).numpy(), 512)
    draft = Eagle3Draft(cfg, weights.embed, vocab.d2t, vocab.t2d)
    kimi = ExportTarget(61, "KimiK25ForConditionalGeneration")
    out = export_draft(draft.state_dict(), cfg, default_aux_layer_ids(61), kimi, tmp_path / "mla")
    tensors = load_file(str(out / "model.safetensors"))
    assert tensors["d2t"].shape == (512,) and tensors["t2d"].shape == (SMALL.vocab_size,)
    assert tensors["midlayer.self_attn.kv_a_proj_with_mqa.weight"].shape == (512 + 64, 2 * 64)  # latent + rope, of 2H
    skipped = Skipped()
    cls = "Eagle3DeepseekV2ForCausalLM"
    load = engine_method(SGLANG + "kimi_k25_eagle3.py", cls, "load_weights", logger=skipped, default_weight_loader=None)
    model = Recorder(SGLANG_MLA_PARAMS)
    load(model, list(tensors.items()))
    assert skipped == [] and set(model.loaded) == set(SGLANG_MLA_PARAMS), set(SGLANG_MLA_PARAMS) ^ set(model.loaded)
    assert model.hot_token_id is not None  # d2t read as the hot-token map
