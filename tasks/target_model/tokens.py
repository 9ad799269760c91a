"""Token facts read from the tokenizer itself: each id's true bytes, one-pass encoding, the end-of-turn token.

Works for every tokenizer class a target ships: fast byte-level BPE (a Rust `backend_tokenizer`),
slow `PreTrainedTokenizer`s over tiktoken (Kimi's `TikTokenTokenizer`, no backend and no offsets),
and SentencePiece-style vocabularies. Offsets come from the tokens' own bytes, not from the backend.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from transformers.convert_slow_tokenizer import bytes_to_unicode

BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenResolutionError(ValueError):
    """A marker that does not resolve to exactly one id that round-trips."""


@dataclass(frozen=True)
class EndOfTurn:
    text: str
    id: int
    also: tuple[int, ...] = ()  # other ids that may close a turn (e.g. `<|call|>` after a tool call)

    @property
    def ids(self) -> tuple[int, ...]:
        return (self.id, *self.also)


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """GPT-2 byte-level alphabet, inverted: printable stand-in character -> byte."""
    return {c: b for b, c in bytes_to_unicode().items()}


def tiktoken_encoding(tokenizer):
    """The `tiktoken.Encoding` a remote-code tokenizer wraps (Kimi keeps it as `.model`), or None."""
    for name in ("model", "encoding", "tokenizer", "_tokenizer"):
        candidate = getattr(tokenizer, name, None)
        if candidate is not None and hasattr(candidate, "decode_single_token_bytes"):
            return candidate
    return None


def _backend_kind(tokenizer) -> str | None:
    """'byte_level' or 'metaspace' for a fast tokenizer's decoder, None for a slow tokenizer."""
    import json

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", [])}
    return "byte_level" if "ByteLevel" in kinds else "metaspace"


def _piece_bytes(piece: str, kind: str) -> bytes | None:
    if kind == "byte_level":
        decoder = byte_decoder()
        return bytes(decoder[c] for c in piece) if all(c in decoder for c in piece) else None
    match = BYTE_PIECE.fullmatch(piece)
    return bytes([int(match.group(1), 16)]) if match else piece.replace("▁", " ").encode("utf-8")


class TokenCodec:
    """Bytes of every id, encoding in one pass, and byte offsets: the same for fast and slow tokenizers."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.added = dict(tokenizer.get_added_vocab())  # text -> id
        self.backend = getattr(tokenizer, "backend_tokenizer", None)
        self.table, self.exact = self._bytes_table()
        self.lengths = np.fromiter((len(b) for b in self.table), dtype=np.int64, count=len(self.table))

    def _bytes_table(self) -> tuple[np.ndarray, bool]:
        """(V,) object array of each id's bytes, and whether joining them is exactly what decoding gives."""
        size = max(len(self.tokenizer), max(self.added.values(), default=-1) + 1)
        table = np.full(size, b"", dtype=object)
        encoding = tiktoken_encoding(self.tokenizer)
        kind = _backend_kind(self.tokenizer)
        exact = encoding is not None or kind == "byte_level"
        if encoding is not None:
            for token_id in range(size):
                try:
                    table[token_id] = encoding.decode_single_token_bytes(token_id)
                except KeyError:  # an id the ranks do not define (reserved or special)
                    pass
        else:
            pieces = self.backend.get_vocab(with_added_tokens=False) if self.backend else self.tokenizer.get_vocab()
            for piece, token_id in pieces.items():
                raw = _piece_bytes(piece, kind or "metaspace")
                if raw is None:
                    exact = False
                elif token_id < size:
                    table[token_id] = raw
        for text, token_id in self.added.items():
            table[token_id] = text.encode("utf-8")
        return table, exact

    def bytes_of(self, token_id: int) -> bytes:
        return self.table[token_id] if 0 <= token_id < len(self.table) else b""

    def encode(self, text: str) -> list[int]:
        """One pass over the whole text, special tokens recognised, nothing added."""
        if self.backend is not None:
            return self.backend.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if self.backend is not None:  # the Rust backend encodes the batch on its own threads
            return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=False)]
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        """Text of `ids`; byte-exact vocabularies join token bytes (a cut multi-byte char becomes U+FFFD)."""
        if self.exact:
            return self.decode_bytes(ids).decode("utf-8", errors="replace")
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def decode_bytes(self, ids) -> bytes:
        return b"".join(self.table[np.asarray(ids, dtype=np.int64)])

    def round_trips(self, ids, text: str) -> bool:
        if self.exact:
            return self.decode_bytes(ids) == text.encode("utf-8")
        return self.tokenizer.decode(list(ids), skip_special_tokens=False) == text


def _cached(tokenizer, kind: type):
    """One `kind` per tokenizer object, kept on it (building one walks the whole vocabulary)."""
    attribute = f"_draftsmith_{kind.__name__}"
    if getattr(tokenizer, attribute, None) is None:
        setattr(tokenizer, attribute, kind(tokenizer))
    return getattr(tokenizer, attribute)


def codec(tokenizer) -> TokenCodec:
    return _cached(tokenizer, TokenCodec)


class ByteVocab:
    """Maps a logprob entry (true bytes, or a special token's text) to its id."""

    def __init__(self, tokenizer):
        tokens = codec(tokenizer)
        if not tokens.exact:
            raise TokenResolutionError("logprob bytes can be mapped only for byte-exact vocabularies (byte-level BPE, tiktoken)")
        self.added = tokens.added
        added_ids = set(self.added.values())
        self.by_bytes = {raw: i for i, raw in enumerate(tokens.table) if raw and i not in added_ids}

    def lookup(self, token: str | None, raw: bytes | None) -> int | None:
        """Id of one logprob entry: `token_id:N` as vLLM can return it, a special token by text, else by bytes."""
        if token and token.startswith("token_id:") and token[9:].isdigit():
            return int(token[9:])
        if token is not None and token in self.added:
            return self.added[token]
        if raw is None and token is not None:
            raw = token.encode("utf-8")
        return self.by_bytes.get(raw) if raw is not None else None


def byte_vocab(tokenizer) -> ByteVocab:
    return _cached(tokenizer, ByteVocab)


def verify_single_token(tokenizer, text: str) -> int:
    """The id of `text`, proven by round trip: it encodes to one id that decodes back to `text`."""
    ids = codec(tokenizer).encode(text)
    if len(ids) != 1:
        raise TokenResolutionError(f"marker {text!r} encodes to {ids}, not one token")
    back = tokenizer.decode(ids, skip_special_tokens=False)
    if back != text:
        raise TokenResolutionError(f"marker {text!r} -> id {ids[0]} decodes to {back!r}")
    return ids[0]
