"""Dynamic batching for the embedded server: concurrent requests share each forward pass.

Requests that arrive together are left-padded into one batch, prefilled once, then decoded step
by step over a shared KV cache; a row that finishes is dropped from the cache so the rest run on.
"""

from __future__ import annotations

import inspect
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

log = logging.getLogger(__name__)
GATHER_S = 0.02  # after the first request, wait this long for others to join the batch


@dataclass
class GenRequest:
    """One completion to generate; `on_done` is called from the engine thread."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0
    on_done: Callable[[GenResult], None] = lambda result: None
    queued_at: float = 0.0  # time.monotonic() when submitted


@dataclass
class Timing:
    """Where one request's time went on the server (seconds): waiting for a batch slot, prefill, decode."""

    queue_s: float
    first_token_s: float  # scheduled -> first token (prefill)
    generation_s: float  # first token -> last token

    def metrics(self, tokens: int) -> dict:
        """vLLM's per-request `metrics` object (`--enable-per-request-metrics`), in its field names."""
        busy = self.first_token_s + self.generation_s
        return {
            "queue_time_ms": round(self.queue_s * 1000, 3),
            "time_to_first_token_ms": round(self.first_token_s * 1000, 3),
            "generation_time_ms": round(self.generation_s * 1000, 3),
            "tokens_per_second": round(tokens / busy, 3) if busy > 0 else None,
        }


@dataclass
class GenResult:
    """Generated ids (with the end-of-turn id when the turn ended on it) and per-token logprobs."""

    token_ids: list[int]
    finish_reason: str
    # Per generated token: (logprob, [(top id, top logprob), ...]); None unless asked for.
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None
    stop_text: str | None = None  # the stop string that ended the reply
    error: str | None = None
    timing: Timing | None = None


@dataclass
class RowState:
    request: GenRequest
    generator: torch.Generator | None
    ids: list[int] = field(default_factory=list)
    logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)
    scheduled_at: float = 0.0
    first_token_at: float = 0.0

    def timing(self, now: float) -> Timing:
        r = self.request
        return Timing(self.scheduled_at - r.queued_at, self.first_token_at - self.scheduled_at, now - self.first_token_at)


def pick_next(logits: torch.Tensor, rows: list[RowState]) -> list[int]:
    """Sample one id per row with its own temperature, top_p and seed. logits: (B, V) float32."""
    chosen = []
    for i, row in enumerate(rows):
        r = row.request
        if r.temperature == 0:
            chosen.append(int(logits[i].argmax()))
            continue
        probs = torch.softmax(logits[i] / r.temperature, dim=-1)  # (V,)
        if r.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            keep = sorted_probs.cumsum(0) - sorted_probs < r.top_p  # always keeps the top token
            probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_probs[keep])
        chosen.append(int(torch.multinomial(probs, 1, generator=row.generator)))
    return chosen


def left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """Zero-pad `t` on the left of `dim` up to `width` (padded positions are masked out)."""
    missing = width - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


@dataclass
class Batch:
    """Rows decoding together: their KV cache, attention mask (B, T) and next-token logits (B, V)."""

    rows: list[RowState]
    cache: object
    mask: torch.Tensor
    logits: torch.Tensor

    def merge(self, other: Batch) -> None:
        """Append `other`'s rows: left-pad both caches to one length, concatenate on the batch dim."""
        width = max(self.mask.shape[1], other.mask.shape[1])
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys = torch.cat([left_pad(mine.keys, width, 2), left_pad(theirs.keys, width, 2)])  # (B, H, T, D)
            mine.values = torch.cat([left_pad(mine.values, width, 2), left_pad(theirs.values, width, 2)])
        self.mask = torch.cat([left_pad(self.mask, width, 1), left_pad(other.mask, width, 1)])
        self.logits = torch.cat([self.logits, other.logits])
        self.rows += other.rows

    def keep(self, index: list[int]) -> None:
        chosen = torch.tensor(index)
        for layer in self.cache.layers:
            layer.batch_select_indices(chosen)
        self.mask = self.mask[chosen]
        self.logits = self.logits[chosen]
        self.rows = [self.rows[i] for i in index]


class BatchEngine:
    """Owns the model on one thread; `submit` queues a request from any thread.

    New requests join the running batch between decode steps (prefilled, then merged into its
    cache), so a long reply never makes a newcomer wait for the whole batch to finish.
    """

    def __init__(self, model, tokenizer, stop_ids: set[int], max_batch: int = 16):
        self.model = model
        self.tokenizer = tokenizer
        self.stop_ids = stop_ids
        self.max_batch = max_batch
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stop_ids)
        self.max_context = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        # transformers renamed `past_key_values` to `cache`; pass whichever this version reads.
        self.cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.batches = 0  # prefills (each one a shared forward over the requests that arrived together)
        self.batched_rows = 0
        self._queue: queue.Queue[GenRequest] = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name="batch-engine", daemon=True)
        self._thread.start()

    def submit(self, request: GenRequest) -> None:
        request.queued_at = time.monotonic()
        self._queue.put(request)

    def _take(self, room: int, wait: bool) -> list[GenRequest]:
        """Up to `room` queued requests; when idle, block for one and give others GATHER_S to arrive."""
        taken = []
        if wait:
            taken.append(self._queue.get())
            deadline = time.monotonic() + GATHER_S
            while len(taken) < room:
                try:
                    taken.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
        while len(taken) < room:
            try:
                taken.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return taken

    def _serve(self) -> None:
        batch: Batch | None = None
        while True:
            rows = batch.rows if batch else []
            new = self._take(self.max_batch - len(rows), wait=not rows)
            try:
                with torch.inference_mode():
                    if new:
                        joined = self._prefill(new)
                        batch = joined if batch is None else (batch.merge(joined) or batch)
                    batch = self._step(batch)
            except Exception as e:  # a failed batch answers every request in it, the server lives on
                log.exception("batch failed")
                failed = {id(r): r for r in new}
                failed.update({id(row.request): row.request for row in (batch.rows if batch else [])})
                for request in failed.values():
                    request.on_done(GenResult([], "error", error=f"{type(e).__name__}: {e}"))
                batch = None

    def _finish(self, row: RowState) -> str | None:
        """The finish reason once a row is complete, else None."""
        r = row.request
        if row.ids[-1] in self.stop_ids:
            return "stop"
        if r.stop:
            text = self.tokenizer.decode(row.ids, skip_special_tokens=True)
            if any(s in text for s in r.stop):
                return "stop"
        if len(row.ids) >= r.max_tokens or len(r.prompt_ids) + len(row.ids) >= self.max_context:
            return "length"
        return None

    def _prefill(self, requests: list[GenRequest]) -> Batch:
        self.batches += 1
        self.batched_rows += len(requests)
        rows, scheduled = [], time.monotonic()
        for r in requests:
            gen = None
            if r.temperature > 0:
                gen = torch.Generator().manual_seed(r.seed if r.seed is not None else int(time.time_ns() % 2**31))
            rows.append(RowState(r, gen, scheduled_at=scheduled))
        width = max(len(r.prompt_ids) for r in requests)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)  # (B, T) left-padded
        mask = torch.zeros((len(rows), width), dtype=torch.long)  # (B, T)
        for i, r in enumerate(requests):
            input_ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            mask[i, width - len(r.prompt_ids) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, T)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        cache = out["cache"] if "cache" in out else out.past_key_values
        first_token = time.monotonic()
        for row in rows:
            row.first_token_at = first_token
        return Batch(rows, cache, mask, out.logits[:, -1, :].float())  # logits (B, V)

    def _step(self, batch: Batch) -> Batch | None:
        """Sample one token per row, answer finished rows, run one forward for the rest."""
        rows = batch.rows
        next_ids = pick_next(batch.logits, rows)
        want_lp = any(row.request.logprobs for row in rows)
        log_probs = torch.log_softmax(batch.logits, dim=-1) if want_lp else None  # (B, V)
        keep = []
        for i, (row, token) in enumerate(zip(rows, next_ids, strict=True)):
            row.ids.append(token)
            if row.request.logprobs:
                top = []
                if row.request.top_logprobs:
                    values, ids = log_probs[i].topk(row.request.top_logprobs)
                    top = list(zip(ids.tolist(), values.tolist(), strict=True))
                row.logprobs.append((float(log_probs[i, token]), top))
            reason = self._finish(row)
            if reason is None:
                keep.append(i)
            else:
                lps = row.logprobs if row.request.logprobs else None
                row.request.on_done(GenResult(row.ids, reason, lps, timing=row.timing(time.monotonic())))
        if not keep:
            return None
        if len(keep) < len(rows):
            batch.keep(keep)
            next_ids = [next_ids[i] for i in keep]
        batch.mask = torch.cat([batch.mask, batch.mask.new_ones((len(batch.rows), 1))], dim=-1)  # (B, T+1)
        positions = batch.mask.sum(-1, keepdim=True) - 1  # (B, 1)
        out = self.model(
            input_ids=torch.tensor(next_ids)[:, None],
            attention_mask=batch.mask,
            position_ids=positions,
            use_cache=True,
            **{self.cache_kwarg: batch.cache},
        )
        batch.logits = out.logits[:, -1, :].float()
        return batch
