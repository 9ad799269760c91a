"""Guided re-encoding: recover the target's own token boundaries of a reply from its text, by its likelihood.

Encoding the reply text in one pass gives the right text but often other boundaries than the target
produced ('\\n' '\\n' for '\\n\\n', ' res' 'ume' for ' resume'), and the target prefers its own. Starting
from the one-pass ids, each round:

1. one forward pass over the current ids (rows batched, KV cache kept) gives the decoder's states;
2. at each reply token, the other tokens whose bytes also start the remaining text, and whose logit is
   within `candidate_nats` of the current token's, are candidates (logits are single dot products with
   the lm_head; the whole vocabulary is projected only where an edit will be judged);
3. a candidate edit replaces the current tokens up to one of the next boundaries both share (filling the
   gap with the longest tokens that fit) and is scored by the target's log-likelihood of the edit plus a
   window of the tokens after it, against the same span as it stands. A row's edits form a token tree
   (edits that begin alike share nodes) that reads the cache before each edit through a 4D mask; trees
   of similar size from the rows searched together share a forward;
4. edits that gain more than the margin, and whose windows do not overlap, are applied.

Rounds repeat over the rows that changed until no edit gains (edits that interact are thus taken one
after the other); a changed row is run again only from a little before its first change, the cache
before it reused. Bytes never change: every edit re-splits the same bytes, so the text round-trips by
construction.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import torch

from tasks.config import GuidedConfig, RunConfig
from tasks.contracts import conform
from tasks.reconstruct.spans import (
    Edit,
    Guided,
    Resplitter,
    Span,
    rejoined,
    reply_span,
    searched_part,
    to_search,
    toward,
)
from tasks.reconstruct.tree_scoring import Pass, score_edits
from tasks.target_model.loader import has_weights, memory_bytes, weight_bytes
from tasks.target_model.tokens import EndOfTurn, codec

GUIDED = "guided"
log = logging.getLogger(__name__)


def guided_unavailable(config: RunConfig) -> str | None:
    """Why `guided` cannot score on this machine as configured (None: it can)."""
    if config.reconstruct.guided.backend == "vllm":
        if config.vllm.python or os.environ.get("DRAFTSMITH_VLLM_PYTHON"):
            return None
        return "reconstruct.guided.backend is vllm, but neither vllm.python nor $DRAFTSMITH_VLLM_PYTHON names a Python with vLLM"
    if not has_weights(config.target):
        return f"the target's weights are not here (target.source {config.target.source!r})"
    size, room = weight_bytes(config.target), memory_bytes(config.compute.device)
    if size > room:
        return (
            f"the target's weights ({size / 2**30:.0f} GiB) do not fit this machine's memory ({room / 2**30:.0f} GiB) for "
            "the transformers backend: set reconstruct.guided.backend: vllm (with the vllm section extract uses)"
        )
    return None


def guided_runs(config: RunConfig) -> bool:
    """`guided` is configured and can score (else its rows are re-encoded, with a warning that says why)."""
    if GUIDED not in config.reconstruct.methods:
        return False
    why = guided_unavailable(config)
    if why is not None:
        warn_once(f"guided: text-only rows are re-encoded in one pass instead: {why}")
    return why is None


def text_methods(config: RunConfig) -> list[str]:
    """The configured methods, `guided` read as `reencode` where it cannot score."""
    return [m if m != GUIDED or guided_runs(config) else "reencode" for m in config.reconstruct.methods]


_warned: set[str] = set()


def warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


def candidate_edits(splitter: Resplitter, span: Span, row: int, base: Pass, cfg: GuidedConfig) -> list[Edit]:
    """Plausible re-splits of one row, each ending on a boundary the current ids share."""
    ids = span.ids
    token_bytes = [splitter.codec.bytes_of(t) for t in ids[span.start : span.stop]]
    data = b"".join(token_bytes)
    starts = np.concatenate([[0], np.cumsum([len(b) for b in token_bytes])]).astype(int)
    boundary = {int(s): span.start + k for k, s in enumerate(starts)}
    low = first_needed(span, cfg)  # after a change, positions well before it keep last round's scores
    logits = [0.0] * low + base.raw(row, torch.arange(low, len(ids) - 1), torch.tensor(ids[low + 1 :])).tolist()
    candidate_nats, _ = span.reach(cfg)

    def near(t: int) -> bool:
        return any(lo - cfg.window <= t < hi + cfg.window for lo, hi in span.changed or [])

    drafts = []  # (start, stop, tokens, first token's logit, key, window end, bar, least first log-prob)
    for t in range(span.start, span.stop):
        if span.changed is not None and t < min(lo for lo, _ in span.changed) - cfg.window:
            continue  # before every change, the context is as it was last round: so are the scores
        if not span.at_site(t):
            continue
        at = int(starts[t - span.start])
        options = [(token, n) for token, n in splitter.prefixes(data, at) if token != ids[t]]
        if not options:
            continue
        rivals = base.raw(row, t - 1, torch.tensor([token for token, _ in options])).tolist()
        for (token, n), rival in zip(options, rivals, strict=True):
            if rival < logits[t - 1] - candidate_nats:  # out of the widest reach (logits differ as log-probs do)
                continue
            first_end = int(np.searchsorted(starts, at + n))
            for end in starts[first_end : first_end + cfg.ends].tolist():
                gap = splitter.fill(data[at + n : end])
                stop = boundary[end]
                if gap is None or [token, *gap] == ids[t:stop] or (span.keeps_length() and len(gap) + 1 != stop - t):
                    continue
                delta = len(gap) + 1 - (stop - t)
                nats, floor = span.reach(cfg, delta)
                if rival < logits[t - 1] - nats:
                    continue  # the wider reach is for edits toward the provider's count (or of the same length)
                key, needed = (at, token, end), bar(span.need, delta, cfg)
                if span.tried and span.tried.get(key, math.inf) < needed - cfg.retry_nats and not near(t):
                    continue  # far below the bar last round; a change elsewhere will not lift it that far
                drafts.append((t, stop, (token, *gap), rival, key, min(len(ids), stop + cfg.window), needed, floor))
    # Only the positions an edit's span and window cover need the whole vocabulary's normalizer.
    base.normalize(row, {u for t, _, _, _, _, end, _, _ in drafts for u in range(t - 1, end - 1)})
    edits = []
    for t, stop, tokens, rival, key, end, needed, floor in drafts:
        first = rival - float(base.norm[int(base.at[row]) + t - 1])
        if first < floor:
            continue
        stands = float(base.logprob(row, torch.arange(t - 1, end - 1), torch.tensor(ids[t:end])).sum())
        if first - stands <= needed:
            continue  # the edit's other tokens and its window can only lower its gain: it cannot pass
        edits.append(Edit(row, t, stop, tokens, stands, first, key))
    return edits


def first_needed(span: Span, cfg: GuidedConfig) -> int:
    """The earliest position whose next-token distribution a round needs for this span."""
    if span.changed is None:
        return span.start - 1
    return max(span.start - 1, min(lo for lo, _ in span.changed) - cfg.window - 1)


def bar(need: int | None, delta: int, cfg: GuidedConfig) -> float:
    """What an edit that changes its row's length by `delta` must gain to be taken, where the row lacks `need` tokens
    of the provider's count (None: no count)."""
    if need is None or delta == 0:  # no count, or a re-split of the same length: the margin alone decides
        return cfg.margin_nats
    if toward(need, delta):  # the count says a re-split is due
        return cfg.count_margin_nats
    return cfg.break_nats  # away from the count (or off it): only strong evidence says errors cancel there


def acceptable(edit: Edit, gain: float, need: int | None, cfg: GuidedConfig) -> bool:
    """Whether an edit may be taken; `need` is what its row still lacks of the provider's count after the edits taken
    before this one (None: no count)."""
    return gain > bar(need, len(edit.tokens) - (edit.stop - edit.start), cfg)


def choose(edits: list[Edit], gains: list[float], cfg: GuidedConfig, spans: list[Span]) -> dict[int, list[tuple[Edit, float]]]:
    """Per row, the best acceptable edits whose spans and windows do not overlap."""
    taken: dict[int, list[tuple[Edit, float]]] = {}
    need = {k: span.need for k, span in enumerate(spans)}
    for gain, edit in sorted(zip(gains, edits, strict=True), key=lambda p: -p[0]):
        if not acceptable(edit, gain, need[edit.row], cfg):
            continue
        reach = edit.stop + cfg.window
        mine = taken.setdefault(edit.row, [])
        if all(reach <= other.start or other.stop + cfg.window <= edit.start for other, _ in mine):
            mine.append((edit, gain))
            if need[edit.row] is not None:
                need[edit.row] -= len(edit.tokens) - (edit.stop - edit.start)
    return taken


@torch.inference_mode()
def guide(model, tokenizer, spans: list[Span], cfg: GuidedConfig, shared: bool = True) -> list[Guided]:
    """Re-split each span's reply tokens to the target's most likely segmentation of the same bytes (`shared`: the
    leading tokens rows have in common are run once, see `Pass`)."""
    splitter = Resplitter(tokenizer)
    whole, spans = spans, [searched_part(s, cfg) for s in spans]
    results = [Guided(list(s.ids), s.stop) for s in spans]
    order = sorted(range(len(spans)), key=lambda i: len(spans[i].ids))  # similar lengths share a batch
    for lo in range(0, len(order), cfg.search_rows):
        group, changed, tried, previous = order[lo : lo + cfg.search_rows], {}, {}, None
        for _ in range(cfg.max_rounds):
            current = [
                Span(
                    results[i].ids, spans[i].start, results[i].stop, changed.get(i), tried.get(i), spans[i].target, spans[i].sites
                )
                for i in group
            ]
            firsts = [first_needed(s, cfg) for s in current]
            base = Pass(model, [s.ids for s in current], firsts, cfg.batch_rows, previous, shared)
            edits = [e for k, s in enumerate(current) for e in candidate_edits(splitter, s, k, base, cfg)]
            if not edits:
                break
            gains = score_edits(model, current, base, edits, cfg)
            for edit, gain in zip(edits, gains, strict=True):
                tried.setdefault(group[edit.row], {})[edit.key] = gain
            taken = choose(edits, gains, cfg, current)
            changed = apply_edits(results, group, current, taken)
            # Only rows that changed can change again, and their tokens before the first change are as they were; a
            # row that reached the provider's count is done.
            kept = still_open(spans, results, group, taken)
            if not kept:
                break
            group, previous = [group[k] for k in kept], (base, kept)
    return [rejoined(w, s, r) for w, s, r in zip(whole, spans, results, strict=True)]


def apply_edits(results: list[Guided], group: list[int], current: list[Span], taken: dict) -> dict[int, list]:
    """Apply each row's chosen edits (right to left keeps indices valid); per changed row, the token ranges edited."""
    changed = {}
    for k, chosen in taken.items():
        result, ids, ranges = results[group[k]], current[k].ids, []
        for edit, gain in sorted(chosen, key=lambda p: -p[0].start):
            ids = ids[: edit.start] + list(edit.tokens) + ids[edit.stop :]
            shift = len(edit.tokens) - (edit.stop - edit.start)
            ranges = [(lo + shift, hi + shift) for lo, hi in ranges] + [(edit.start, edit.start + len(edit.tokens))]
            result.stop += shift
            result.edits += 1
            result.nats += gain
        result.ids = ids
        changed[group[k]] = ranges
    return changed


def still_open(spans: list[Span], results: list[Guided], group: list[int], taken: dict) -> list[int]:
    """The rows (indices into `group`) to search again: those that changed, less those a search brought to the
    provider's count. A row that had its count from the start goes on while it changes: a re-split of the same
    length can make the next one likely (a name or word that comes back is re-split one occurrence per round)."""
    reached = {
        k for k in taken if spans[group[k]].need and spans[group[k]].target == results[group[k]].stop - spans[group[k]].start
    }
    return sorted(set(taken) - reached)


def guide_table(
    search: Callable[[list[Span]], list[Guided]], tokenizer, table: pa.Table, end_of_turn: EndOfTurn, cfg: GuidedConfig
) -> tuple[pa.Table, dict, set]:
    """Re-split the reply of every `guided` row of a reconstructed table with `search` (a backend's `guide`); returns
    the table, what changed, and the ids of the rows it changed.

    A row whose one-pass length is already the provider's count is left as it is (`counted_rows: skip`), searched at
    its ambiguous sites (`ambiguous`) or everywhere at that count (`search`); a row whose length differs is searched
    toward it; a row without a count is searched as is.
    """
    rows = table.to_pylist()
    splitter = Resplitter(tokenizer)
    picked, spans = [], []
    for i, row in enumerate(rows):
        if row["method"] != GUIDED:
            continue
        span = reply_span(row["input_ids"], row["loss_mask"], end_of_turn)
        span = to_search(span, row["provider_reply_count"], cfg, splitter)
        if span is not None:
            picked.append(i)
            spans.append(span)
    started = time.perf_counter()
    results = search(spans) if spans else []
    seconds = time.perf_counter() - started
    tokens = codec(tokenizer)
    changed = set()
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
        changed.add(row["id"])
    counted = [(s, r) for s, r in zip(spans, results, strict=True) if s.target is not None and s.need]
    at_count = [(s, r) for s, r in zip(spans, results, strict=True) if s.target is not None and not s.need]
    stats = {
        "rows": sum(row["method"] == GUIDED for row in rows),
        "searched": len(spans),
        "changed": len(changed),
        "edits": sum(r.edits for r in results),
        "nats": round(sum(r.nats for r in results), 3),
        "tokens": sum(len(s.ids) for s in spans),
        "seconds": round(seconds, 3),
        "off_count": len(counted),  # searched because the one-pass length was not the provider's count
        "to_count": sum(r.stop - s.start == s.target for s, r in counted),  # ... and brought to it
        "at_count": len(at_count),  # searched at the count their one-pass length already had
        "at_count_changed": sum(r.edits > 0 for _, r in at_count),  # ... and re-split all the same
    }
    table = conform("reconstructed", pa.Table.from_pylist(rows, schema=table.schema)) if changed else table
    return table, stats, changed
