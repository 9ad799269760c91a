"""64-bit row digests (blake2b) for dedup and seeded shuffling, computed batch by batch.

Digests are stored as uint64 so dedup sets cost 8 bytes a row; at a million rows the chance of any
collision is about 3e-8.
"""

from __future__ import annotations

from hashlib import blake2b

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

DIGEST_BYTES = 8
# Whitespace of any kind (ASCII and Unicode separators) collapses to one space.
WHITESPACE = r"[\s\p{Z}]+"


def normalise_prompts(prompts: pa.Array) -> pa.Array:
    """NFKC, lower-cased, whitespace runs collapsed to one space, trimmed; nulls stay null."""
    text = pc.utf8_normalize(prompts, form="NFKC")
    text = pc.utf8_lower(text)
    text = pc.replace_substring_regex(text, pattern=WHITESPACE, replacement=" ")
    return pc.utf8_trim_whitespace(text)


def _digest_spans(data: pa.Buffer | None, starts: list[int], ends: list[int], key: bytes = b"") -> np.ndarray:
    view = memoryview(data) if data is not None else memoryview(b"")
    digests = b"".join(blake2b(view[a:b], digest_size=DIGEST_BYTES, key=key).digest() for a, b in zip(starts, ends, strict=True))
    return np.frombuffer(digests, dtype="<u8").copy()


def hash_strings(values: pa.Array, key: bytes = b"") -> np.ndarray:
    """Digest of each string's UTF-8 bytes (a null hashes like the empty string; mask nulls yourself)."""
    values = values.cast(pa.string()) if not pa.types.is_string(values.type) else values
    _, offsets, data = values.buffers()
    positions = np.frombuffer(offsets, dtype=np.int32)[values.offset : values.offset + len(values) + 1]
    return _digest_spans(data, positions[:-1].tolist(), positions[1:].tolist(), key)


def hash_token_lists(lists: pa.ListArray) -> np.ndarray:
    """Digest of each list's little-endian int32 bytes (equal lists, equal digests)."""
    offsets = lists.offsets.to_numpy().astype(np.int64)
    child = lists.values
    width = child.type.byte_width
    base = child.offset * width
    data = child.buffers()[1]
    return _digest_spans(data, (base + offsets[:-1] * width).tolist(), (base + offsets[1:] * width).tolist())


def shuffle_key(seed: int, source: str) -> bytes:
    """The blake2b key that turns row ids into a seeded, per-source shuffle order."""
    return blake2b(f"{seed}\x00{source}".encode(), digest_size=32).digest()


def list_sums(lists: pa.ListArray) -> np.ndarray:
    """Non-zero entries per list (trained tokens per loss mask); a null list counts 0."""
    offsets = lists.offsets.to_numpy().astype(np.int64)
    flags = lists.values.to_numpy(zero_copy_only=False) != 0
    running = np.concatenate([[0], np.cumsum(flags, dtype=np.int64)])
    return running[offsets[1:]] - running[offsets[:-1]]
