"""The target's checkpoint read by name, without building the model: its text config and the tensors training needs.

A vision-language wrapper such as Kimi-K2.5 (`model_type: kimi_k25`) keeps its language model's config under
`text_config` and its weights under `language_model.` (beside `vision_tower.*` and `mm_projector.*`), sharded, with
the experts quantized. transformers has no class for it, so only an engine runs it; training needs two of its tensors
(the token embedding and the lm_head), read here from whichever shard holds them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tasks.config import UserError

# Where a checkpoint keeps its language model's weights: at the top (a causal LM) or under a wrapper's prefix.
TEXT_PREFIXES = ("", "language_model.")
EMBED = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"
FINAL_NORM = "model.norm.weight"
INDEX = "model.safetensors.index.json"


class CheckpointError(UserError, ValueError):
    """A checkpoint that lacks what a stage reads from it; the message names the directory and the tensors sought."""


def read_config(directory: Path) -> dict:
    return json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))


def text_config(config: dict) -> dict:
    """The language model's config: a wrapper's `text_config`, else the config itself."""
    return config.get("text_config") or config


def causal_lm_class(config: dict) -> str | None:
    """The transformers causal-LM class that runs this checkpoint in-process (None: AutoModelForCausalLM cannot load
    it, only an engine can). A vision-language wrapper has none: its text body's weights sit under another prefix and
    its forward takes images too."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.get("model_type", ""))


def tensor_files(directory: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it: from the shard index, else from each file's header."""
    from safetensors import safe_open

    directory = Path(directory)
    index = directory / INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return {name: directory / file for name, file in weight_map.items()}
    found = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            found.update((name, path) for name in f.keys())
    return found


def read_tensor(files: dict[str, Path], name: str):
    """One tensor by name, as stored (no other tensor of its shard is read)."""
    from safetensors import safe_open

    with safe_open(files[name], "pt") as f:
        return f.get_tensor(name)


@dataclass
class TextWeights:
    """The language model's frozen pieces a draft is trained against."""

    config: object  # a transformers config of the text body (DeepseekV3Config for Kimi-K2.5)
    embed: object  # (V, H) fp32
    lm_head: object  # (V, H) fp32
    prefix: str  # where the text body's weights live in the checkpoint


def text_weights(directory: Path) -> TextWeights:
    """The text body's config, embedding and lm_head, read by name from the (nested, sharded) checkpoint."""
    directory = Path(directory)
    text = text_config(read_config(directory))
    files = tensor_files(directory)
    prefix = next((p for p in TEXT_PREFIXES if p + EMBED in files), None)
    if prefix is None:
        sought = " or ".join(p + EMBED for p in TEXT_PREFIXES)
        raise CheckpointError(f"{directory}: no tensor {sought} in its safetensors files: not a language model's weights")
    embed = read_tensor(files, prefix + EMBED).float()
    if prefix + LM_HEAD in files:
        lm_head = read_tensor(files, prefix + LM_HEAD).float()
    elif text.get("tie_word_embeddings"):
        lm_head = embed
    else:
        raise CheckpointError(f"{directory}: no tensor {prefix + LM_HEAD}, and the config does not tie it to the embedding")
    return TextWeights(body_config(directory), embed, lm_head, prefix)


def body_config(directory: Path):
    """The text body's transformers config: a wrapper's `text_config` as its own config class builds it (Kimi-K2.5's
    `kimi_k2` body is a DeepseekV3Config), else the checkpoint's config."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(directory))
    except (ValueError, KeyError):  # a model type only remote code knows: build the body from its own fields
        text = dict(text_config(read_config(directory)))
        return AutoConfig.for_model(text.pop("model_type"), **text)
    return getattr(config, "text_config", None) or config


# Settings that run the target in this process, by the stage that reads them: (stage, key, in-process value, the fix).
IN_PROCESS = (
    ("reconstruct", "reconstruct.guided.backend", "transformers", "set reconstruct.guided.backend: vllm"),
    ("extract", "extract.backend", "transformers", "set extract.backend: vllm"),
    ("train", "train.hidden_states", "online", "set train.hidden_states: offline or stream (states from the engine)"),
    ("evaluate", "evaluate.engine", "transformers", "set evaluate.engine: vllm"),
)


def setting(config, dotted: str):
    for key in dotted.split("."):
        config = getattr(config, key)
    return config


def in_process_problems(config, stages) -> list[str]:
    """One line per stage of `stages` set to run in this process a target transformers has no class for (a
    vision-language wrapper such as Kimi-K2.5), naming the setting and the engine backend to use instead."""
    target = config.target
    if target.source != "hf_dir" or target.path is None or not (Path(target.path) / "config.json").is_file():
        return []  # the demo and GGUF targets are Llama bodies; a tokenizer-only target runs no such stage
    model_config = read_config(Path(target.path))
    if causal_lm_class(model_config) is not None:
        return []
    kind = f"model_type {model_config.get('model_type')!r} has no transformers causal-LM class"
    problems = []
    for stage, key, in_process, fix in IN_PROCESS:
        uses_it = stage != "reconstruct" or "guided" in config.reconstruct.methods
        if stage in stages and uses_it and setting(config, key) == in_process:
            problems.append(f"{key}: {in_process} cannot run target.path {target.path} ({kind}): {fix}")
    return problems


def require_in_process_runnable(config, stages) -> None:
    """CheckpointError listing `in_process_problems`, before any of `stages` starts."""
    problems = in_process_problems(config, stages)
    if problems:
        raise CheckpointError("\n".join(problems))
