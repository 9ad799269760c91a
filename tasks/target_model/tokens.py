"""Token facts read from the tokenizer itself: each id's true bytes, one-pass encoding, the end-of-turn token.

Works for every tokenizer class a target ships: fast byte-level BPE (a Rust `backend_tokenizer`),
slow `PreTrainedTokenizer`s over tiktoken (Kimi's `TikTokenTokenizer`, no backend and no offsets),
and SentencePiece vocabularies (`▁` for a space, `<0xNN>` byte fallback). Offsets come from the tokens' own
bytes, not from the backend.

SentencePiece's dummy prefix: a Llama-2 / Phi-3 style tokenizer writes a space before every run of text it
encodes (at the start, and after each special token), which the text never had. Such a run's first token carries
it, and decoding drops it there. A generated reply continues the prompt's run, so its first run gets none
(`encode_reply`): the model wrote `Hi` after `\n`, not `▁Hi`.
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
        self.added_ids = frozenset(self.added.values())
        self.dummy_prefix = not self.exact and self._writes_dummy_prefix()
        if not self.exact and not self.dummy_prefix:  # SentencePiece without one (Gemma): its bytes are its text
            self.exact = self._joins_as_decoded(" Hello  world\n\tÄpfel 🦙 x")
        self.continuing = self._continuing_backend() if self.dummy_prefix else None

    def _writes_dummy_prefix(self) -> bool:
        ids = self.encode("a")
        return bool(ids) and self.table[ids[0]] in (b" a", b" ")

    def _joins_as_decoded(self, probe: str) -> bool:
        ids = self.encode(probe)
        return self.decode_bytes(ids) == probe.encode("utf-8") == self.tokenizer.decode(ids).encode("utf-8")

    def _continuing_backend(self):
        """The backend without its dummy prefix: how a run that continues earlier text is encoded."""
        import json

        from tokenizers import Tokenizer

        spec = json.loads(self.backend.to_str())
        normalizer = spec.get("normalizer") or {}
        if normalizer.get("type") == "Sequence":
            normalizer["normalizers"] = [n for n in normalizer["normalizers"] if n.get("type") != "Prepend"]
        elif normalizer.get("type") == "Prepend":
            spec["normalizer"] = None
        steps = [spec.get("pre_tokenizer") or {}, *(spec.get("pre_tokenizer") or {}).get("pretokenizers", [])]
        for step in steps:
            if step.get("type") == "Metaspace":
                step["prepend_scheme"] = "never"
        return Tokenizer.from_str(json.dumps(spec))

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

    def encode_reply(self, text: str, after_special: bool = False) -> list[int]:
        """A generated turn's ids: one pass, its first run continuing the prompt's (no dummy prefix), unless the
        prompt ended in a special token (then the reply starts a run of its own)."""
        if self.continuing is None or after_special:
            return self.encode(text)
        cut = min((i for i in (text.find(t) for t in self.added if t) if i >= 0), default=len(text))
        head = self.continuing.encode(text[:cut], add_special_tokens=False).ids if cut else []
        return head + (self.encode(text[cut:]) if cut < len(text) else [])

    def ends_in_special(self, ids) -> bool:
        return bool(len(ids)) and int(ids[-1]) in self.added_ids

    def decode(self, ids, reply: bool = False) -> str:
        """Text of `ids`; byte-exact vocabularies join token bytes (a cut multi-byte char becomes U+FFFD); with a
        dummy prefix, each run's first token loses its space (`reply`: the first run continues earlier text)."""
        if self.exact:
            return self.decode_bytes(ids).decode("utf-8", errors="replace")
        if self.dummy_prefix:
            return self.run_text(ids, reply).decode("utf-8", errors="replace")
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def pieces(self, ids, reply: bool = False) -> list[bytes]:
        """Each token's bytes in the text `ids` decode to: a run's first token without its dummy space, if any."""
        parts, starts = [], not reply
        for token_id in map(int, ids):
            raw = self.bytes_of(token_id)
            special = token_id in self.added_ids
            parts.append(raw[1:] if self.dummy_prefix and starts and not special and raw.startswith(b" ") else raw)
            starts = special
        return parts

    def run_text(self, ids, reply: bool = False) -> bytes:
        return b"".join(self.pieces(ids, reply))

    def decode_bytes(self, ids) -> bytes:
        return b"".join(self.table[np.asarray(ids, dtype=np.int64)])

    def round_trips(self, ids, text: str) -> bool:
        if self.exact:
            return self.decode_bytes(ids) == text.encode("utf-8")
        if self.dummy_prefix:
            return self.run_text(ids) == text.encode("utf-8")
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
        if not tokens.exact and not tokens.dummy_prefix:
            raise TokenResolutionError(
                "logprob bytes can be mapped only for vocabularies whose tokens' bytes are their text "
                "(byte-level BPE, tiktoken, SentencePiece)"
            )
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
