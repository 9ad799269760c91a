"""What a guided search works on: a reply's token span, its result and edits, the vocabulary's byte splits, and
which rows the provider's counts leave to search, and where (a row already at its count: its ambiguous sites)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from tasks.config import GuidedConfig
from tasks.target_model.tokens import EndOfTurn, byte_vocab, codec
from tasks.validate.classify import through_turn_end

SITE_TOKENS = 3  # the most tokens of one ambiguous site
SPACES = frozenset(b" \t\r\n")


@dataclass
class Span:
    """A sequence to re-split: ids (prompt + reply + end of turn) and the reply's token range [start, stop)."""

    ids: list[int]
    start: int
    stop: int
    changed: list[tuple[int, int]] | None = None  # token ranges edited last round; None: look everywhere
    tried: dict[tuple, float] | None = None  # gains scored in earlier rounds, by (byte offset, token, end byte)
    target: int | None = None  # reply tokens the provider counted (None: no count to go by)
    sites: list[tuple[int, int]] | None = None  # a row at its count: the only token ranges an edit may begin in

    def at_site(self, t: int) -> bool:
        """Whether an edit may begin at token t: anywhere, or inside one of the row's ambiguous sites."""
        return self.sites is None or any(lo <= t < hi for lo, hi in self.sites)

    def keeps_length(self) -> bool:
        """A row searched at its sites is only re-split there: no edit may change its length."""
        return self.sites is not None

    @property
    def need(self) -> int | None:
        """Tokens the reply must gain (or, negative, lose) to have the provider's count; None without a count."""
        return None if self.target is None else self.target - (self.stop - self.start)

    def reach(self, cfg: GuidedConfig, delta: int | None = None) -> tuple[float, float]:
        """(candidate_nats, min_logprob) of an edit that changes the row's length by `delta` (None: the widest any
        edit of this row gets): wider for one that brings it toward the provider's count, where the count says the
        current split is not the target's."""
        wide = self.need and (delta is None or delta == 0 or toward(self.need, delta))
        return (cfg.count_candidate_nats, cfg.count_min_logprob) if wide else (cfg.candidate_nats, cfg.min_logprob)


@dataclass
class Guided:
    ids: list[int]
    stop: int  # the reply's end after edits (the number of reply tokens can change)
    edits: int = 0
    nats: float = 0.0  # total log-likelihood gained by the accepted edits (each over its window)


@dataclass(frozen=True)
class Edit:
    row: int
    start: int  # first replaced token
    stop: int  # one past the last replaced token
    tokens: tuple[int, ...]  # what replaces them
    base: float  # log-likelihood of the current span + window
    first: float  # log-probability of the edit's first token (from the base pass)
    key: tuple  # (byte offset, first token, end byte): the same edit in any round


class Resplitter:
    """The candidate tokens at a byte position: every vocabulary token the remaining bytes start with."""

    def __init__(self, tokenizer):
        self.codec = codec(tokenizer)
        self.by_bytes = byte_vocab(tokenizer).by_bytes
        self.longest = max(len(b) for b in self.by_bytes)
        self._alike: dict[tuple[bytes, int], bool] = {}

    def prefixes(self, data: bytes, at: int) -> list[tuple[int, int]]:
        """(token id, byte length) of each token whose bytes are `data[at:at + n]`."""
        out = []
        for n in range(1, min(self.longest, len(data) - at) + 1):
            token = self.by_bytes.get(data[at : at + n])
            if token is not None:
                out.append((token, n))
        return out

    def splits_alike(self, data: bytes, count: int) -> bool:
        """Whether `data` splits into `count` vocabulary tokens in more than one way."""
        key = (data, count)
        if key not in self._alike:
            ways: list[dict[int, int]] = [{} for _ in range(len(data) + 1)]  # per byte offset: tokens so far -> ways (≤ 2)
            ways[0][0] = 1
            for at in range(len(data)):
                for tokens, n_ways in ways[at].items():
                    if tokens < count:
                        for _, n in self.prefixes(data, at):
                            ways[at + n][tokens + 1] = min(2, ways[at + n].get(tokens + 1, 0) + n_ways)
            self._alike[key] = ways[-1].get(count, 0) > 1
        return self._alike[key]

    def fill(self, data: bytes) -> list[int] | None:
        """Longest-match tokens for a short byte gap (None when some byte has no token)."""
        out, at = [], 0
        while at < len(data):
            best = next(((t, n) for t, n in reversed(self.prefixes(data, at))), None)
            if best is None:
                return None
            out.append(best[0])
            at += best[1]
        return out


def toward(need: int, delta: int) -> bool:
    """Whether a change of `delta` tokens brings a row that lacks `need` tokens of its count toward it, never past."""
    return delta * need > 0 and abs(delta) <= abs(need)


def searched_part(span: Span, cfg: GuidedConfig) -> Span:
    """What a search needs of a span: all of it, or for a row searched at its sites only, its ids through the last
    site and a margin for the edits' ends and windows (the forward over the rest would score nothing)."""
    if span.sites is None:
        return span
    cut = min(len(span.ids), span.sites[-1][1] + SITE_TOKENS + cfg.ends + cfg.window)
    return replace(span, ids=span.ids[:cut], stop=min(span.stop, cut), target=min(span.stop, cut) - span.start)


def rejoined(whole: Span, part: Span, result: Guided) -> Guided:
    """A search's result over `part` with the rest of `whole` after it."""
    tail = whole.ids[len(part.ids) :]
    return replace(result, ids=result.ids + tail, stop=result.stop + whole.stop - part.stop)


def ambiguous_sites(splitter: Resplitter, span: Span) -> list[tuple[int, int]]:
    """Token ranges of the reply, two or three tokens inside one word (no token but the first begins with white
    space), whose bytes also split into as many vocabulary tokens another way: the only places where a single re-split
    keeps the reply's length, so the only places a row at the provider's count can be wrong alone ('ENT' 'R' for
    'EN' 'TR')."""
    pieces = [splitter.codec.bytes_of(t) for t in span.ids[span.start : span.stop]]
    sites = []
    for i in range(len(pieces)):
        for j in range(i + 2, min(i + SITE_TOKENS, len(pieces)) + 1):
            if not pieces[j - 1] or pieces[j - 1][0] in SPACES:
                break
            if splitter.splits_alike(b"".join(pieces[i:j]), j - i):
                sites.append((span.start + i, span.start + j))
                break
    return sites


def to_search(span: Span, expected_reply: int | None, cfg: GuidedConfig, splitter: Resplitter) -> Span | None:
    """The span to search, with the provider's count as its target; None when its one-pass length already has that
    count and `counted_rows` leaves it: always (`skip`), or (`ambiguous`) when fewer than `ambiguous_per_token` of its
    reply tokens begin an ambiguous site. With `ambiguous`, a row at its count is searched at its sites only."""
    target = None if expected_reply is None else expected_reply - (len(span.ids) - span.stop)
    if target != span.stop - span.start or cfg.counted_rows == "search":
        return replace(span, target=target)
    if cfg.counted_rows == "skip":
        return None
    sites = ambiguous_sites(splitter, span)
    if not sites or len(sites) < cfg.ambiguous_per_token * (span.stop - span.start):
        return None
    return replace(span, target=target, sites=sites)


def reply_span(input_ids, loss_mask, end_of_turn: EndOfTurn) -> Span:
    """The ids through the end of turn, with the reply's own tokens (not the end-of-turn id) as the span."""
    ids = through_turn_end(np.asarray(input_ids), np.asarray(loss_mask)).tolist()
    stop = len(ids) - 1 if ids[-1] in end_of_turn.ids else len(ids)
    return Span(ids, int(np.flatnonzero(loss_mask)[0]), stop)
