"""The `target` section: the model whose drafts are trained, its tokenizer and chat format."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from tasks.config.base import StrictModel

# The chat formats of tasks/target_model/formats/ (a test keeps the two lists equal).
ChatFormatName = Literal[
    "auto",
    "kimi-k2.5",
    "kimi-k2",
    "deepseek-v3.2",
    "deepseek-v3.1",
    "glm-4.6",
    "gpt-oss",
    "qwen3.5",
    "qwen3-coder",
    "qwen3",
    "llama-3",
    "chatml",
    "template",
]


class TargetConfig(StrictModel):
    """The target model whose drafts we train."""

    model: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    """Model name sent to the chat API (OpenRouter slug, vLLM served name)."""
    source: Literal["demo", "gguf", "hf_dir", "tokenizer_json"] = "demo"
    """Where the tokenizer/weights come from: the embedded demo GGUF, a GGUF file, an HF model directory, or a bare
    tokenizer.json or vocabulary-only GGUF (tokenizer only: no extract/train/evaluate)."""
    path: Path | None = None
    """File (gguf, tokenizer_json) or directory (hf_dir); unused for the demo."""
    trust_remote_code: bool = False
    """Remote code runs arbitrary Python from the model repo: off unless asked for (Kimi needs it)."""
    chat_format: ChatFormatName = "auto"
    """How the model writes a generated turn (reasoning markers, tool-call syntax, end of turn); "auto" detects the family from
    the chat template (tasks/target_model/formats/), and falls back to "template": the turn as the template itself
    renders it (formats/template.py)."""
    special_tokens: dict[str, int] = Field(default_factory=dict)
    """Special-token ids the config pins, by token text; preflight checks each against the tokenizer."""
    extra_markers: list[str] = Field(default_factory=list)
    """Extra marker texts to verify beyond those found in the chat template."""
    chat_template: str | None = None
    """A Jinja chat template used instead of the tokenizer's own (or where it has none): a file, or a real template from the
    llama.cpp corpus, e.g. "pypi-sdist:llama-cpp-python==0.3.36/vendor/llama.cpp/models/templates/deepseek-ai-
    DeepSeek-V4.jinja"."""
    end_of_turn: str | None = None
    """Text of the end-of-turn token; None resolves it from the template (then eos)."""
    history_arguments: Literal["object", "as_sent"] = "object"
    """Tool-call arguments of earlier turns as the chat template gets them: decoded JSON objects (what vLLM and SGLang
    pass), or the strings as sent (what Moonshot's own Kimi-K2.5 template prints). The prompt-count verdict shows
    which one a provider used."""
    max_length: int = Field(2048, gt=0)
    """Tokens per training sequence; longer rows are quarantined, not truncated."""
