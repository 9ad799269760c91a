"""Guided re-splitting scored by a serving engine: the same search as tasks/reconstruct/guided.py, with each round's
likelihoods asked of a vLLM server as prompt log-probabilities, for targets transformers cannot hold in-process.

A round sends, concurrently, one request per searched row (its ids as the prompt, `prompt_logprobs: top_k`: each
token's log-probability and the top-k alternatives at every position), then one request per candidate edit (the
row up to the edit, the edit, the window after it, `prompt_logprobs: 0`). Requests of a row share its prefix, which
the engine's prefix cache computes once. A candidate starts with one of the top-k alternatives whose bytes also
start the remaining text; it is kept as the transformers backend keeps it (gain over the margin, toward the
provider's count where there is one). Bytes never change: every edit re-splits the same bytes.
"""

from __future__ import annotations

import asyncio
import math
import threading
from pathlib import Path

import httpx

from tasks.config import GuidedConfig, RunConfig
from tasks.reconstruct.guided import apply_edits, bar, choose, still_open
from tasks.reconstruct.spans import Edit, Guided, Resplitter, Span, rejoined, searched_part


class EngineScorer:
    """Prompt log-probabilities of token sequences from an OpenAI-compatible completions endpoint (vLLM's extension
    `prompt_logprobs`)."""

    def __init__(self, base_url: str, model: str, concurrency: int, transport: httpx.AsyncBaseTransport | None = None):
        self.base_url, self.model, self.concurrency, self.transport = base_url.rstrip("/"), model, concurrency, transport
        self.tokens_scored = 0  # prompt tokens sent, over every request

    def body(self, ids: list[int], top_k: int) -> dict:
        """One request: the ids as the prompt, no sampling worth speaking of, the prompt's log-probabilities."""
        return {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": top_k}

    def logprobs(self, sequences: list[list[int]], top_k: int) -> list[list[dict[int, float]]]:
        """Per sequence and position u: {token id: log p(token | ids[:u])} for ids[u] and the top-k (position 0: {})."""
        return asyncio.run(self._all(sequences, top_k))

    async def _all(self, sequences: list[list[int]], top_k: int) -> list[list[dict[int, float]]]:
        limit = asyncio.Semaphore(self.concurrency)
        async with httpx.AsyncClient(base_url=self.base_url, timeout=600, transport=self.transport) as client:

            async def one(ids: list[int]) -> list[dict[int, float]]:
                async with limit:
                    reply = await client.post("/v1/completions", json=self.body(ids, top_k))
                if reply.status_code != 200:
                    raise RuntimeError(f"guided: the engine refused a prompt of {len(ids)} tokens: {reply.text[:300]}")
                self.tokens_scored += len(ids)
                entries = reply.json()["choices"][0]["prompt_logprobs"]
                return [{int(t): float(e["logprob"]) for t, e in (entry or {}).items()} for entry in entries]

            return list(await asyncio.gather(*(one(ids) for ids in sequences)))


def engine_edits(splitter: Resplitter, span: Span, row: int, table: list[dict[int, float]], cfg: GuidedConfig) -> list[Edit]:
    """The candidate re-splits of one row from the engine's top-k: an alternative whose bytes start the remaining text,
    likely enough, up to one of the next boundaries both splits share."""
    ids = span.ids
    token_bytes = [splitter.codec.bytes_of(t) for t in ids[span.start : span.stop]]
    data = b"".join(token_bytes)
    starts = [0]
    for piece in token_bytes:
        starts.append(starts[-1] + len(piece))
    boundary = {s: span.start + k for k, s in enumerate(starts)}
    candidate_nats, min_logprob = span.reach(cfg)
    edits = []
    for t in range(span.start, span.stop):
        if not span.at_site(t):
            continue
        current = table[t].get(ids[t], -math.inf)
        at = starts[t - span.start]
        fits = dict(splitter.prefixes(data, at))  # token -> byte length, for tokens the remaining bytes start with
        for token, first in table[t].items():
            n = fits.get(token)
            if n is None or token == ids[t] or first < min_logprob or first < current - candidate_nats:
                continue  # out of the widest reach any edit of this row gets
            first_end = next(k for k, s in enumerate(starts) if s >= at + n)
            for end in starts[first_end : first_end + cfg.ends]:
                gap = splitter.fill(data[at + n : end])
                stop = boundary[end]
                if gap is None or [token, *gap] == ids[t:stop] or (span.keeps_length() and len(gap) + 1 != stop - t):
                    continue
                delta = len(gap) + 1 - (stop - t)
                nats, floor = span.reach(cfg, delta)
                if first < floor or first < current - nats:
                    continue  # the wider reach is for edits toward the provider's count (or of the same length)
                needed = bar(span.need, delta, cfg)
                window_end = min(len(ids), stop + cfg.window)
                stands = sum(table[u].get(ids[u], -math.inf) for u in range(t, window_end))
                if first - stands <= needed:
                    continue  # the rest of the edit and its window can only lower its gain
                edits.append(Edit(row, t, stop, (token, *gap), stands, first, (at, token, end)))
    return edits


def edited(span: Span, edit: Edit, window: int) -> list[int]:
    """The row up to the edit, the edit, and the window of tokens after it: what scoring the edit needs."""
    return span.ids[: edit.start] + list(edit.tokens) + span.ids[edit.stop : edit.stop + window]


def guide_with_engine(scorer: EngineScorer, tokenizer, spans: list[Span], cfg: GuidedConfig) -> list[Guided]:
    """`guided.guide` with the engine scoring: rounds over the rows still open, until no edit gains."""
    splitter = Resplitter(tokenizer)
    whole, spans = spans, [searched_part(s, cfg) for s in spans]
    results = [Guided(list(s.ids), s.stop) for s in spans]
    group = list(range(len(spans)))
    for _ in range(cfg.max_rounds):
        current = [
            Span(results[i].ids, spans[i].start, results[i].stop, target=spans[i].target, sites=spans[i].sites) for i in group
        ]
        tables = scorer.logprobs([s.ids for s in current], cfg.top_k)
        edits = [e for k, s in enumerate(current) for e in engine_edits(splitter, s, k, tables[k], cfg)]
        if not edits:
            break
        scored = scorer.logprobs([edited(current[e.row], e, cfg.window) for e in edits], 0)
        gains = []
        for edit, table in zip(edits, scored, strict=True):
            sequence = edited(current[edit.row], edit, cfg.window)
            gains.append(sum(table[u][sequence[u]] for u in range(edit.start, len(sequence))) - edit.base)
        taken = choose(edits, gains, cfg, current)
        apply_edits(results, group, current, taken)
        kept = still_open(spans, results, group, taken)
        if not kept:
            break
        group = [group[k] for k in kept]
    return [rejoined(w, s, r) for w, s, r in zip(whole, spans, results, strict=True)]


_engines: dict[str, tuple] = {}
_engines_lock = threading.Lock()


def shared_engine(config: RunConfig, log_dir: Path) -> EngineScorer:
    """The vLLM server guided scores with, started once per process on the run's `vllm` settings (as extract's);
    `stop_engines` ends it when the stage is done."""
    from tasks.vllm_server import VllmServer

    key = config.model_dump_json(include={"target", "vllm", "compute"})
    with _engines_lock:
        if key not in _engines:
            server = VllmServer(
                config, log_dir / "vllm-guided.log", [], config.target.max_length + config.reconstruct.guided.window
            )
            server.start()
            _engines[key] = (server, EngineScorer(server.url, config.target.model, config.reconstruct.guided.engine_concurrency))
        return _engines[key][1]


def stop_engines() -> None:
    with _engines_lock:
        for server, _ in _engines.values():
            server.stop()
        _engines.clear()


def guided_search(config: RunConfig, tokenizer, log_dir: Path):
    """The configured backend's search: spans -> re-split results (the target in this process, or the engine, started
    when the first spans come: a run whose rows all carry the server's ids loads no engine)."""
    from tasks.reconstruct.guided import guide
    from tasks.target_model.loader import model_placement, shared_model

    cfg = config.reconstruct.guided
    if cfg.backend == "vllm":
        return lambda spans: guide_with_engine(shared_engine(config, log_dir), tokenizer, spans, cfg) if spans else []
    model = shared_model(config.target, *model_placement(config.compute))
    return lambda spans: guide(model, tokenizer, spans, cfg)
