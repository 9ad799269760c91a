"""Token facts resolved from the tokenizer itself: the end-of-turn token and the bytes -> id table."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from tasks.reconstruct.adapters import adapt_message


class TokenResolutionError(ValueError):
    """A marker that does not resolve to exactly one id that round-trips."""


@dataclass(frozen=True)
class EndOfTurn:
    text: str
    id: int


def added_token_ids(tokenizer) -> dict[str, int]:
    """Added (special and marker) tokens by their text."""
    return dict(tokenizer.get_added_vocab())


def end_of_turn_from_template(tokenizer, chat_format: str) -> str | None:
    """The first added token the template puts after a probe reply: the token that closes a turn."""
    probe = "pong"
    prompt = [{"role": "user", "content": "ping"}]
    reply = adapt_message({"role": "assistant", "content": probe}, chat_format)
    head = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(prompt + [reply], tokenize=False)
    if not full.startswith(head) or probe not in full[len(head):]:
        return None
    after = full[full.rfind(probe) + len(probe):]
    added = added_token_ids(tokenizer)
    encoding = tokenizer.backend_tokenizer.encode(after, add_special_tokens=False)
    for token_id, (start, end) in zip(encoding.ids, encoding.offsets, strict=True):
        text = after[start:end]
        if added.get(text) == token_id:
            return text
    return None


def resolve_end_of_turn(tokenizer, end_of_turn: str | None, chat_format: str) -> EndOfTurn:
    """The end-of-turn token: the configured text, else the template's, else eos; checked by round trip."""
    text = end_of_turn or end_of_turn_from_template(tokenizer, chat_format) or tokenizer.eos_token
    if not text:
        raise TokenResolutionError("no end-of-turn token: set target.end_of_turn")
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise TokenResolutionError(f"end-of-turn {text!r} encodes to {ids}, not one token")
    back = tokenizer.decode(ids, skip_special_tokens=False)
    if back != text:
        raise TokenResolutionError(f"end-of-turn {text!r} -> id {ids[0]} decodes to {back!r}")
    return EndOfTurn(text, ids[0])


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of the GPT-2 byte-level alphabet: printable stand-in character -> byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def is_byte_level(tokenizer) -> bool:
    return type(tokenizer.backend_tokenizer.decoder).__name__ == "ByteLevel"


class ByteVocab:
    """Maps a token's true bytes (or a special token's text) to its id, for logprob entries."""

    def __init__(self, tokenizer):
        if not is_byte_level(tokenizer):
            raise TokenResolutionError("logprob bytes can be mapped only for byte-level BPE tokenizers")
        decoder = _byte_decoder()
        self.added = added_token_ids(tokenizer)
        added_ids = set(self.added.values())
        self.by_bytes: dict[bytes, int] = {}
        for token, token_id in tokenizer.backend_tokenizer.get_vocab(with_added_tokens=False).items():
            if token_id in added_ids or any(c not in decoder for c in token):
                continue
            self.by_bytes[bytes(decoder[c] for c in token)] = token_id

    def lookup(self, token: str | None, raw: bytes | None) -> int | None:
        """Id of one logprob entry: `token_id:N` as vLLM can return it, a special token by text, else by bytes."""
        if token and token.startswith("token_id:") and token[9:].isdigit():
            return int(token[9:])
        if token is not None and token in self.added:
            return self.added[token]
        if raw is None and token is not None:
            raw = token.encode("utf-8")
        return self.by_bytes.get(raw) if raw is not None else None


def token_bytes_table(tokenizer) -> np.ndarray | None:
    """(V,) object array of each id's bytes, for byte-level BPE (where decoding is concatenating them); else None."""
    cached = getattr(tokenizer, "_draftsmith_token_bytes", None)
    if cached is not None or not is_byte_level(tokenizer):
        return cached
    decoder = _byte_decoder()
    backend = tokenizer.backend_tokenizer
    added = {token_id: text for text, token_id in added_token_ids(tokenizer).items()}
    vocab = backend.get_vocab(with_added_tokens=True)
    table = np.full(max(vocab.values()) + 1, b"", dtype=object)
    for token, token_id in vocab.items():
        if token_id in added:
            table[token_id] = added[token_id].encode("utf-8")
        elif all(c in decoder for c in token):
            table[token_id] = bytes(decoder[c] for c in token)
        else:
            return None
    tokenizer._draftsmith_token_bytes = table
    return table


def round_trips(tokenizer, ids: list[np.ndarray], texts: list[str]) -> list[bool]:
    """decode(ids) == text per row; byte-level vocabularies decode by joining token bytes, others via decode_batch."""
    table = token_bytes_table(tokenizer)
    if table is None:
        decoded = tokenizer.backend_tokenizer.decode_batch([i.tolist() for i in ids], skip_special_tokens=False)
        return [d == t for d, t in zip(decoded, texts, strict=True)]
    return [b"".join(table[i]) == t.encode("utf-8") for i, t in zip(ids, texts, strict=True)]


def byte_vocab(tokenizer) -> ByteVocab:
    """ByteVocab cached on the tokenizer object (building it walks the whole vocabulary)."""
    cached = getattr(tokenizer, "_draftsmith_byte_vocab", None)
    if cached is None:
        cached = ByteVocab(tokenizer)
        tokenizer._draftsmith_byte_vocab = cached
    return cached
