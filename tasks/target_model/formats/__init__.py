"""Chat formats by family: how a generated turn is written after the template's prompt, and split back.

`target.chat_format: auto` picks the family whose template signature matches the target's template, and the
template itself (`template`: formats/template.py) where none does.
"""

from __future__ import annotations

from tasks.target_model.formats.base import ChatFormat, Reply, RowError, ToolCall
from tasks.target_model.formats.deepseek import DEEPSEEK_V31, DEEPSEEK_V32
from tasks.target_model.formats.glm import GLM_46
from tasks.target_model.formats.harmony import GPT_OSS
from tasks.target_model.formats.hermes import CHATML, QWEN3, QWEN3_CODER, QWEN35
from tasks.target_model.formats.kimi import KIMI_K2, KIMI_K25
from tasks.target_model.formats.llama3 import LLAMA3
from tasks.target_model.formats.template import TemplateFormat, template_format

# Most specific first: detection takes the first whose signature the template carries.
FORMATS: dict[str, ChatFormat] = {
    f.name: f
    for f in [KIMI_K25, KIMI_K2, DEEPSEEK_V32, DEEPSEEK_V31, GLM_46, GPT_OSS, QWEN35, QWEN3_CODER, QWEN3, LLAMA3, CHATML]
}
FORMAT_NAMES = (*FORMATS, "template")

__all__ = [
    "FORMATS",
    "FORMAT_NAMES",
    "ChatFormat",
    "FormatError",
    "Reply",
    "RowError",
    "TemplateFormat",
    "ToolCall",
    "detect",
    "get_format",
]


class FormatError(ValueError):
    """An unknown chat format, or a template that matches none."""


def detect(template: str | None, tokenizer=None) -> ChatFormat:
    """The family whose signature the template carries, else the template itself (with a tokenizer to render it)."""
    if not template:
        raise FormatError(
            f"the target has no chat template: set target.chat_template, and target.chat_format to one of {list(FORMAT_NAMES)}"
        )
    for chat_format in FORMATS.values():
        if chat_format.matches(template):
            return chat_format
    if tokenizer is not None:
        return template_format(tokenizer)
    raise FormatError(f"the chat template matches no known format: set target.chat_format to one of {list(FORMAT_NAMES)}")


def get_format(name: str, template: str | None, tokenizer=None) -> ChatFormat:
    """`auto` detects from the template; `template` writes turns with it; any other name must be a known format."""
    if name == "auto":
        return detect(template, tokenizer)
    if name == "template":
        if not template or tokenizer is None:
            raise FormatError("target.chat_format 'template' needs a chat template: set target.chat_template")
        return template_format(tokenizer)
    if name not in FORMATS:
        raise FormatError(f"target.chat_format {name!r}: expected 'auto' or one of {list(FORMAT_NAMES)}")
    return FORMATS[name]
