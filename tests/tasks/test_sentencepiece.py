"""SentencePiece vocabularies (`▁` for a space, `<0xNN>` byte fallback, a dummy prefix space) from llama.cpp's
vocab-only GGUFs, against the reference tokenizations the corpus ships beside them (`.inp` / `.out`).

Loaded as a target loads them (`target.source: tokenizer_json` with a GGUF path); each text encodes to the
reference ids and those ids decode back to the text; a generated reply continues the prompt's run (no dummy
prefix of its own), and rows of real prompts through a real template rebuild exactly.
"""

from __future__ import annotations

from collections import Counter

import pytest

from tasks.config import TargetConfig
from tasks.target_model.assets import LLAMA_CPP, PackagedFile, fetch, resolve_path
from tasks.target_model.chat import chat_format_of, resolve_end_of_turn
from tasks.target_model.loader import gguf_vocab_tokenizer, load_tokenizer
from tasks.target_model.tokens import codec
from tasks.validate.simulate import simulate_rows
from tests.support.families import TEMPLATE_FAMILIES, template_family_tokenizer
from tests.support.family_rows import SHAPES, family_rows

VOCABS = ("llama-spm", "phi-3", "gemma-4")
MODELS = "vendor/llama.cpp/models"


def vocab_target(name: str) -> TargetConfig:
    return TargetConfig(
        model=name, source="tokenizer_json", path=f"pypi-sdist:llama-cpp-python=={LLAMA_CPP[1]}/{MODELS}/ggml-vocab-{name}.gguf"
    )


def references(name: str) -> list[tuple[str, list[int]]]:
    """(text, ids) pairs: llama.cpp's test inputs, split on its separator line, and the ids it expects for each."""
    inp = fetch(PackagedFile(*LLAMA_CPP, f"{MODELS}/ggml-vocab-{name}.gguf.inp", sdist=True)).read_text(encoding="utf-8")
    out = fetch(PackagedFile(*LLAMA_CPP, f"{MODELS}/ggml-vocab-{name}.gguf.out", sdist=True)).read_text(encoding="utf-8")
    texts = inp.removesuffix("\n__ggml_vocab_test__\n").split("\n__ggml_vocab_test__\n")
    ids = [[int(i) for i in line.split()] for line in out.removesuffix("\n").split("\n")]
    assert len(texts) == len(ids) > 40
    return list(zip(texts, ids, strict=True))


@pytest.mark.parametrize("name", VOCABS)
def test_the_reference_texts_encode_to_the_reference_ids_and_back(name):
    tokens = codec(load_tokenizer(vocab_target(name)))
    pairs = references(name)
    wrong = [(text, tokens.encode(text), ids) for text, ids in pairs if tokens.encode(text) != ids]
    assert not wrong, wrong[:3]
    lost = [(text, tokens.decode(ids)) for text, ids in pairs if not tokens.round_trips(ids, text)]
    assert not lost, lost[:3]
    assert any("<0x" in t for _, ids in pairs for t in tokens.tokenizer.convert_ids_to_tokens(ids))  # byte fallback ran


@pytest.mark.parametrize("name", ["llama-spm", "phi-3"])
def test_a_reply_continues_the_prompts_run_without_a_dummy_prefix(name):
    tokens = codec(load_tokenizer(vocab_target(name)))
    assert tokens.dummy_prefix
    prompt = tokens.encode("Say hi.\n")
    reply = tokens.encode_reply("Hi there")
    assert tokens.decode_bytes(reply) == b"Hi there"  # no space the model never wrote
    assert tokens.encode("Hi there") != reply and tokens.decode_bytes(tokens.encode("Hi there")) == b" Hi there"
    assert tokens.decode(reply, reply=True) == "Hi there" and tokens.round_trips(prompt + reply, "Say hi.\nHi there")


def test_gemma_4_writes_no_dummy_prefix_so_its_bytes_are_its_text():
    tokens = codec(load_tokenizer(vocab_target("gemma-4")))
    assert not tokens.dummy_prefix and tokens.exact


def llama_spm_chat(demo_tokenizer, workdir):
    """Llama-2's SentencePiece vocabulary with Phi-3.5's markers and real template: Phi-3's vocabulary is that one
    plus its chat markers, so the pairing is the real one. (tokenizer, target)"""
    from tokenizers import AddedToken

    phi, target = template_family_tokenizer(TEMPLATE_FAMILIES["phi-3.5"], demo_tokenizer, workdir)
    tokenizer = gguf_vocab_tokenizer(resolve_path(str(vocab_target("llama-spm").path)))  # its own: markers get added
    markers = ["<|user|>", "<|assistant|>", "<|end|>", "<|system|>"]
    tokenizer.add_tokens([AddedToken(m, special=True, normalized=False) for m in markers], special_tokens=True)
    tokenizer.chat_template = phi.chat_template
    return tokenizer, target


def test_llama_spm_rows_through_the_phi_3_5_template_rebuild_exactly(demo_tokenizer, tmp_path):
    tokenizer, target = llama_spm_chat(demo_tokenizer, tmp_path)
    fmt = chat_format_of(tokenizer, target)
    assert fmt.name == "template"
    eot = resolve_end_of_turn(tokenizer, target)
    shapes = tuple(s for s in SHAPES if s != "calls")
    for piecewise in (False, True):
        rows = family_rows(tokenizer, "phi-3.5", ({},), n=20, piecewise=piecewise, fmt=fmt, shapes=shapes)
        verdicts = simulate_rows(tokenizer, rows, target, eot, context=3)
        classes = Counter(v.klass for _, v in verdicts)
        assert not classes["semantic"], [(r["id"], v.rebuilt_context) for r, v in verdicts if v.klass == "semantic"][:2]
        assert classes["exact"] + classes["bpe_only"] == 20 and (piecewise or classes["exact"] == 20), classes


def test_guided_re_splits_sentencepiece_replies_keeping_every_byte(demo_tokenizer, tmp_path):
    """`guided` over Llama-2's SentencePiece vocabulary: a small Llama with that vocabulary scores the re-splits (its
    weights are random: what is proven is the mechanics, not which split wins): every row keeps its bytes and none
    turns semantic."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tasks.config import GuidedConfig
    from tasks.reconstruct.guided import guide
    from tasks.validate.simulate import replay_rows, simulate_guided

    tokenizer, target = llama_spm_chat(demo_tokenizer, tmp_path)
    torch.manual_seed(0)
    shape = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), **shape)).eval()
    fmt, eot = chat_format_of(tokenizer, target), resolve_end_of_turn(tokenizer, target)
    rows = family_rows(tokenizer, "phi-3.5", ({},), n=12, fmt=fmt, shapes=("text", "history", "cut"))
    replayed = replay_rows(tokenizer, rows, target, eot)
    search = lambda spans: guide(model, tokenizer, spans, GuidedConfig())  # noqa: E731
    verdicts, stats = simulate_guided(search, tokenizer, replayed, GuidedConfig(), context=3)
    assert len(verdicts) == 12 and not [v for _, v, _ in verdicts if v.klass == "semantic"], verdicts[:2]
    assert sum(s["searched"] for s in stats.values()) > 0
