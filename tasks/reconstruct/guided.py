"""Guided re-encoding: recover the target's own token boundaries of a reply from its text, by its likelihood.

Encoding the reply text in one pass gives the right text but often other boundaries than the target
produced ('\\n' '\\n' for '\\n\\n', ' res' 'ume' for ' resume'), and the target prefers its own. Starting
from the one-pass ids, each round:

1. one forward pass over the current ids (rows batched, KV cache kept) gives every token's log-probability;
2. at each reply token, the other tokens whose bytes also start the remaining text, and that the target
   finds nearly as likely as the current token there, are candidates (their log-probability is read off
   the same pass);
3. a candidate edit replaces the current tokens up to one of the next boundaries both share (filling the gap with
   the longest tokens that fit) and is scored by the target's log-likelihood of the edit plus a window of
   the tokens after it, against the same span as it stands: one batched forward of the edits over the
   cache, each edit seeing only the positions before it;
4. edits that gain more than the margin, and whose windows do not overlap, are applied.

Rounds repeat over the rows that changed until no edit gains (edits that interact are thus taken one
after the other). Bytes never change: every edit re-splits the same bytes, so the text round-trips by
construction.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from tasks.config import GuidedConfig, RunConfig
from tasks.contracts import conform
from tasks.target.loader import has_weights
from tasks.target.tokens import EndOfTurn, byte_vocab, codec
from tasks.validate.classify import through_turn_end

GUIDED = "guided"


def guided_runs(config: RunConfig) -> bool:
    """`guided` is configured and the target's weights are here to score with (else its rows are re-encoded)."""
    return GUIDED in config.reconstruct.methods and has_weights(config.target)


def text_methods(config: RunConfig) -> list[str]:
    """The configured methods, `guided` read as `reencode` where there are no weights to score with."""
    return [m if m != GUIDED or guided_runs(config) else "reencode" for m in config.reconstruct.methods]


@dataclass
class Span:
    """A sequence to re-split: ids (prompt + reply + end of turn) and the reply's token range [start, stop)."""

    ids: list[int]
    start: int
    stop: int
    changed: list[tuple[int, int]] | None = None  # token ranges edited last round; None: look everywhere
    tried: dict[tuple, float] | None = None  # gains scored in earlier rounds, by (byte offset, token, end byte)


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

    def prefixes(self, data: bytes, at: int) -> list[tuple[int, int]]:
        """(token id, byte length) of each token whose bytes are `data[at:at + n]`."""
        out = []
        for n in range(1, min(self.longest, len(data) - at) + 1):
            token = self.by_bytes.get(data[at : at + n])
            if token is not None:
                out.append((token, n))
        return out

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


class Pass:
    """One forward pass over a batch of rows (right-padded): next-token log-probabilities and the KV cache."""

    def __init__(self, model, rows: list[list[int]], first: int):
        """`first`: the earliest position whose next-token distribution is needed (logits start there)."""
        self.width = max(len(r) for r in rows)
        self.offset = first
        ids = torch.zeros((len(rows), self.width), dtype=torch.long)
        mask = torch.zeros((len(rows), self.width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = 1
        out = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=self.width - first)
        self.logits = out.logits.float()  # (R, width - first, V)
        self.norm = torch.logsumexp(self.logits, dim=-1)  # (R, width - first)
        self.cache = out.past_key_values

    def logprob(self, row: int, position: int, tokens) -> torch.Tensor:
        """log p(tokens | ids[:position + 1]) of one row."""
        at = position - self.offset
        return self.logits[row, at, tokens] - self.norm[row, at]


def candidate_edits(splitter: Resplitter, span: Span, row: int, base: Pass, cfg: GuidedConfig) -> list[Edit]:
    """Plausible re-splits of one row, each ending on a boundary the current ids share."""
    ids = span.ids
    token_bytes = [splitter.codec.bytes_of(t) for t in ids[span.start : span.stop]]
    data = b"".join(token_bytes)
    starts = np.concatenate([[0], np.cumsum([len(b) for b in token_bytes])]).astype(int)
    boundary = {int(s): span.start + k for k, s in enumerate(starts)}
    positions = torch.arange(span.start - 1, len(ids) - 1)
    scored = base.logprob(row, positions, torch.tensor(ids[span.start :])).tolist()
    current = [0.0] * (span.start - 1) + scored  # current[u - 1] = log p(ids[u]) (the prompt's are not needed)

    def near(t: int) -> bool:
        return any(lo - cfg.window <= t < hi + cfg.window for lo, hi in span.changed or [])

    edits = []
    for t in range(span.start, span.stop):
        if span.changed is not None and t < min(lo for lo, _ in span.changed) - cfg.window:
            continue  # before every change, the context is as it was last round: so are the scores
        at = int(starts[t - span.start])
        here = current[t - 1]
        options = [(token, n) for token, n in splitter.prefixes(data, at) if token != ids[t]]
        if not options:
            continue
        firsts = base.logprob(row, t - 1, torch.tensor([token for token, _ in options])).tolist()
        for (token, n), first in zip(options, firsts, strict=True):
            if first < here - cfg.candidate_nats or first < cfg.min_logprob:
                continue
            first_end = int(np.searchsorted(starts, at + n))
            for end in starts[first_end : first_end + cfg.ends].tolist():
                gap = splitter.fill(data[at + n : end])
                stop = boundary[end]
                if gap is None or [token, *gap] == ids[t:stop]:
                    continue
                key = (at, token, end)
                if span.tried and span.tried.get(key, math.inf) < cfg.margin_nats - cfg.retry_nats and not near(t):
                    continue  # far below the margin last round; a change elsewhere will not lift it that far
                window_end = min(len(ids), stop + cfg.window)
                stands = sum(current[t - 1 : window_end - 1])
                edits.append(Edit(row, t, stop, (token, *gap), stands, first, key))
    return edits


def score_edits(model, spans: list[Span], base: Pass, edits: list[Edit], cfg: GuidedConfig) -> list[float]:
    """Log-likelihood gain of each edit: its tokens and the window after it, over the same span as it stands."""
    from transformers import DynamicCache

    gains = {}
    layers = [(layer.keys, layer.values) for layer in base.cache.layers]
    ordered = sorted(range(len(edits)), key=lambda i: edits[i].start)  # a chunk reads the cache up to its last start
    for lo in range(0, len(ordered), cfg.batch_edits):
        chunk = [edits[i] for i in ordered[lo : lo + cfg.batch_edits]]
        width = max(e.start for e in chunk)
        inputs = [list(e.tokens) + spans[e.row].ids[e.stop : e.stop + cfg.window] for e in chunk]
        n = max(len(x) for x in inputs)
        ids = torch.zeros((len(chunk), n), dtype=torch.long)
        mask = torch.zeros((len(chunk), width + n), dtype=torch.long)
        positions = torch.zeros((len(chunk), n), dtype=torch.long)
        for b, (e, x) in enumerate(zip(chunk, inputs, strict=True)):
            ids[b, : len(x)] = torch.tensor(x)
            mask[b, : e.start] = 1  # only the positions before the edit
            mask[b, width : width + len(x)] = 1
            positions[b] = torch.arange(e.start, e.start + n)
        rows = torch.tensor([e.row for e in chunk])
        picked = DynamicCache(ddp_cache_data=[(k[rows, :, :width], v[rows, :, :width]) for k, v in layers])
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=picked, use_cache=True)
        logits = out.logits.float()  # (B, n, V)
        norm = torch.logsumexp(logits, dim=-1)  # (B, n)
        for b, (i, x) in enumerate(zip(ordered[lo : lo + cfg.batch_edits], inputs, strict=True)):
            steps = torch.arange(len(x) - 1)
            follow = float((logits[b, steps, torch.tensor(x[1:])] - norm[b, steps]).sum())
            gains[i] = edits[i].first + follow - edits[i].base
    return [gains[i] for i in range(len(edits))]


def choose(edits: list[Edit], gains: list[float], cfg: GuidedConfig) -> dict[int, list[tuple[Edit, float]]]:
    """Per row, the best edits over the margin whose spans and windows do not overlap."""
    taken: dict[int, list[tuple[Edit, float]]] = {}
    for gain, edit in sorted(zip(gains, edits, strict=True), key=lambda p: -p[0]):
        if gain <= cfg.margin_nats:
            break
        reach = edit.stop + cfg.window
        mine = taken.setdefault(edit.row, [])
        if all(reach <= other.start or other.stop + cfg.window <= edit.start for other, _ in mine):
            mine.append((edit, gain))
    return taken


@torch.inference_mode()
def guide(model, tokenizer, spans: list[Span], cfg: GuidedConfig) -> list[Guided]:
    """Re-split each span's reply tokens to the target's most likely segmentation of the same bytes."""
    splitter = Resplitter(tokenizer)
    results = [Guided(list(s.ids), s.stop) for s in spans]
    order = sorted(range(len(spans)), key=lambda i: len(spans[i].ids))  # similar lengths share a batch
    for lo in range(0, len(order), cfg.batch_rows):
        group, changed, tried = order[lo : lo + cfg.batch_rows], {}, {}
        for _ in range(cfg.max_rounds):
            current = [Span(results[i].ids, spans[i].start, results[i].stop, changed.get(i), tried.get(i)) for i in group]
            base = Pass(model, [s.ids for s in current], min(s.start for s in current) - 1)
            edits = [e for k, s in enumerate(current) for e in candidate_edits(splitter, s, k, base, cfg)]
            if not edits:
                break
            gains = score_edits(model, current, base, edits, cfg)
            for edit, gain in zip(edits, gains, strict=True):
                tried.setdefault(group[edit.row], {})[edit.key] = gain
            taken = choose(edits, gains, cfg)
            if not taken:
                break
            changed = {}
            for k, chosen in taken.items():
                result, ids, ranges = results[group[k]], current[k].ids, []
                for edit, gain in sorted(chosen, key=lambda p: -p[0].start):  # right to left keeps indices valid
                    ids = ids[: edit.start] + list(edit.tokens) + ids[edit.stop :]
                    shift = len(edit.tokens) - (edit.stop - edit.start)
                    ranges = [(lo + shift, hi + shift) for lo, hi in ranges] + [(edit.start, edit.start + len(edit.tokens))]
                    result.stop += shift
                    result.edits += 1
                    result.nats += gain
                result.ids = ids
                changed[group[k]] = ranges
            group = [group[k] for k in taken]  # only rows that changed can change again
    return results


def guide_table(model, tokenizer, table: pa.Table, end_of_turn: EndOfTurn, cfg: GuidedConfig) -> tuple[pa.Table, dict]:
    """Re-split the reply of every `guided` row of a reconstructed table; returns the table and what changed."""
    picked = [i for i, method in enumerate(table.column("method").to_pylist()) if method == GUIDED]
    if not picked:
        return table, {"rows": 0, "changed": 0, "edits": 0, "nats": 0.0, "tokens": 0, "seconds": 0.0}
    rows = table.to_pylist()
    spans = [reply_span(rows[i]["input_ids"], rows[i]["loss_mask"], end_of_turn) for i in picked]
    started = time.perf_counter()
    results = guide(model, tokenizer, spans, cfg)
    seconds = time.perf_counter() - started
    tokens = codec(tokenizer)
    for i, span, result in zip(picked, spans, results, strict=True):
        if not result.edits:
            continue
        row = rows[i]
        if tokens.decode_bytes(result.ids) != tokens.decode_bytes(span.ids):  # impossible by construction
            raise RuntimeError(f"row {row['id']!r}: guided re-split changed the bytes of the reply")
        tail = row["input_ids"][len(span.ids) :]
        row["input_ids"] = result.ids + tail
        row["loss_mask"] = [0] * span.start + [1] * (len(result.ids) - span.start) + row["loss_mask"][len(span.ids) :]
        row["num_tokens"] = len(row["input_ids"])
        row["num_trained"] = sum(row["loss_mask"])
    stats = {
        "rows": len(picked),
        "changed": sum(bool(r.edits) for r in results),
        "edits": sum(r.edits for r in results),
        "nats": round(sum(r.nats for r in results), 3),
        "tokens": sum(len(s.ids) for s in spans),
        "seconds": round(seconds, 3),
    }
    return conform("reconstructed", pa.Table.from_pylist(rows, schema=table.schema)), stats


def reply_span(input_ids, loss_mask, end_of_turn: EndOfTurn) -> Span:
    """The ids through the end of turn, with the reply's own tokens (not the end-of-turn id) as the span."""
    ids = through_turn_end(np.asarray(input_ids), np.asarray(loss_mask)).tolist()
    stop = len(ids) - 1 if ids[-1] in end_of_turn.ids else len(ids)
    return Span(ids, int(np.flatnonzero(loss_mask)[0]), stop)
