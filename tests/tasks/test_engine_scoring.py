"""Guided scored by a serving engine (tasks/reconstruct/engine_scoring.py), against a stub engine that answers
`/v1/completions` with fixed prompt log-probabilities: the requests it is sent, the top-k candidate rule, the
margin, and bytes that never change."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pyarrow as pa
import pytest

from tasks.config import GuidedConfig, TargetConfig
from tasks.contracts import conform
from tasks.reconstruct.engine_scoring import EngineScorer, guide_with_engine
from tasks.reconstruct.guided import guide_table
from tasks.reconstruct.spans import SITE_TOKENS, Guided, Resplitter, Span, ambiguous_sites, to_search
from tasks.target_model.chat import resolve_end_of_turn
from tasks.target_model.tokens import codec

LIKELY, UNLIKELY, ELSEWHERE = -0.1, -6.0, -3.0


class StubEngine:
    """An engine whose target writes `truth`: on the truth's own prefix, its next token has log-probability LIKELY and
    any other UNLIKELY; off it, every token ELSEWHERE. Its top-k are the truth's token then `others` (or `others`
    first), and the prompt's own token comes with them, as vLLM returns it."""

    def __init__(self, truth: list[int], others: list[int], truth_first: bool = True):
        self.truth, self.others, self.truth_first, self.bodies = truth, others, truth_first, []

    def logprob(self, prompt: list[int], u: int, token: int) -> float:
        if prompt[:u] != self.truth[:u]:
            return ELSEWHERE
        return LIKELY if u < len(self.truth) and token == self.truth[u] else UNLIKELY

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        prompt, k = body["prompt"], body["prompt_logprobs"]
        entries = [None]
        for u in range(1, len(prompt)):
            own = [self.truth[u]] if u < len(self.truth) else []
            offered = own + self.others if self.truth_first else self.others + own
            chosen = [*offered[:k], prompt[u]]
            entries.append({str(t): {"logprob": self.logprob(prompt, u, t), "rank": 1} for t in dict.fromkeys(chosen)})
        return httpx.Response(200, json={"choices": [{"text": "", "prompt_logprobs": entries}]})


def case(tokenizer):
    """A reply the target wrote with '\\n\\n' as one token, rebuilt in one pass as '\\n' '\\n' (BPE before a digit)."""
    tokens = codec(tokenizer)
    prompt = tokens.encode("<|im_start|>user\nSteps?<|im_end|>\n<|im_start|>assistant\n")
    eot = resolve_end_of_turn(tokenizer, TargetConfig()).id
    truth = prompt + tokens.encode("Steps:") + tokens.encode("\n\n") + tokens.encode("1. go") + [eot]
    canonical = prompt + tokens.encode("Steps:\n\n1. go") + [eot]
    assert truth != canonical and tokens.decode_bytes(truth) == tokens.decode_bytes(canonical)
    return truth, Span(canonical, len(prompt), len(canonical) - 1)


def scorer_for(engine: StubEngine) -> EngineScorer:
    return EngineScorer("http://engine", "target", concurrency=4, transport=httpx.MockTransport(engine.handle))


def test_the_engine_recovers_the_targets_split_and_is_asked_as_documented(demo_tokenizer):
    truth, span = case(demo_tokenizer)
    engine = StubEngine(truth, others=[])
    cfg = GuidedConfig(backend="vllm", top_k=3)
    [result] = guide_with_engine(scorer_for(engine), demo_tokenizer, [span], cfg)
    assert result.ids == truth and result.edits == 1 and result.stop == len(truth) - 1
    rows = [b for b in engine.bodies if b["prompt_logprobs"] == 3]  # one per row and round, the row's ids as the prompt
    scores = [b for b in engine.bodies if b["prompt_logprobs"] == 0]  # one per candidate edit: prefix, edit, window
    assert rows[0]["prompt"] == span.ids and all(b["model"] == "target" and b["max_tokens"] == 1 for b in engine.bodies)
    assert scores and all(b["prompt"][: span.start] == span.ids[: span.start] for b in scores)
    assert max(len(b["prompt"]) for b in scores) <= len(span.ids)  # an edit is scored with its window, no further


def test_only_the_engines_top_k_start_a_candidate(demo_tokenizer):
    """The target's own '\n\n' is not among the top 1 the engine returns (an unrelated token is): nothing is tried."""
    truth, span = case(demo_tokenizer)
    engine = StubEngine(truth, others=codec(demo_tokenizer).encode(" zebra"), truth_first=False)
    [result] = guide_with_engine(scorer_for(engine), demo_tokenizer, [span], GuidedConfig(backend="vllm", top_k=1))
    assert result.ids == span.ids and result.edits == 0
    assert not [b for b in engine.bodies if b["prompt_logprobs"] == 0]  # no candidate, so nothing scored
    [result] = guide_with_engine(scorer_for(engine), demo_tokenizer, [span], GuidedConfig(backend="vllm", top_k=2))
    assert result.ids == truth  # within the top 2 it is found


def test_an_edit_needs_the_margin(demo_tokenizer):
    truth, span = case(demo_tokenizer)
    [result] = guide_with_engine(scorer_for(StubEngine(truth, [])), demo_tokenizer, [span], GuidedConfig(margin_nats=1e6))
    assert result.ids == span.ids and result.edits == 0


def test_a_row_at_its_count_is_searched_by_the_engine_at_its_sites_only(demo_tokenizer):
    """The target wrote 'ND' 'I' where one pass gives 'N' 'DI' (the same length, so the provider's count matches):
    with `counted_rows: ambiguous` the engine is asked about the reply only through a margin after its last site, and
    the re-split comes back with the rest of the reply as it was. The same row at a density threshold above its own is
    not searched at all."""
    tokens, splitter = codec(demo_tokenizer), Resplitter(demo_tokenizer)
    prompt = tokens.encode("<|im_start|>user\nWhat is NDI?<|im_end|>\n<|im_start|>assistant\n")
    eot = resolve_end_of_turn(demo_tokenizer, TargetConfig()).id
    rest = tokens.encode(" is a protocol for sending video over a local network, used by studios to share live video.")
    canonical = prompt + tokens.encode("NDI") + rest + [eot]
    truth = prompt + [splitter.by_bytes[b"ND"], splitter.by_bytes[b"I"]] + rest + [eot]
    assert len(truth) == len(canonical) and tokens.decode_bytes(truth) == tokens.decode_bytes(canonical)
    one_pass = Span(canonical, len(prompt), len(canonical) - 1)
    assert ambiguous_sites(splitter, one_pass)[0] == (len(prompt), len(prompt) + 2)
    cfg, count = GuidedConfig(backend="vllm", top_k=3, ambiguous_per_token=0.0), len(truth) - len(prompt)
    span = to_search(one_pass, count, cfg, splitter)
    engine = StubEngine(truth, others=[])
    [result] = guide_with_engine(scorer_for(engine), demo_tokenizer, [span], cfg)
    assert result.ids == truth and result.edits == 1 and result.stop == len(truth) - 1
    asked = max(len(b["prompt"]) for b in engine.bodies)
    assert asked <= span.sites[-1][1] + SITE_TOKENS + cfg.ends + cfg.window < len(canonical)  # the reply's tail never sent
    dense = 1.01 * len(ambiguous_sites(splitter, one_pass)) / (one_pass.stop - one_pass.start)
    assert to_search(one_pass, count, cfg.model_copy(update={"ambiguous_per_token": dense}), splitter) is None


def test_bytes_never_change_and_a_table_that_would_is_refused(demo_tokenizer):
    truth, span = case(demo_tokenizer)
    tokens = codec(demo_tokenizer)
    mask = [0] * span.start + [1] * (len(span.ids) - span.start)
    row = {"id": "r", "source": "s", "input_ids": span.ids, "loss_mask": mask, "num_tokens": len(span.ids)}
    row |= {"num_trained": sum(mask), "last_trained_id": span.ids[-1], "method": "guided", "round_trip": True}
    row |= {"finish_reason": "stop", "prompt_text": "user: Steps?"}
    table = conform("reconstructed", pa.Table.from_pylist([row]))
    eot = resolve_end_of_turn(demo_tokenizer, TargetConfig())
    cfg = GuidedConfig(backend="vllm")
    search = lambda spans: guide_with_engine(scorer_for(StubEngine(truth, [])), demo_tokenizer, spans, cfg)  # noqa: E731
    rebuilt, stats, changed = guide_table(search, demo_tokenizer, table, eot, cfg)
    ids = rebuilt.column("input_ids").to_pylist()[0]
    assert ids == truth and tokens.decode_bytes(ids) == tokens.decode_bytes(span.ids) and changed == {"r"}
    assert stats["changed"] == 1 and np.flatnonzero(rebuilt.column("loss_mask").to_pylist()[0])[0] == span.start

    # A search whose edit wrote other bytes would change the text: the table refuses it, naming the row.
    def broken(spans):
        ids = spans[0].ids[: spans[0].stop - 1] + tokens.encode("?") + spans[0].ids[spans[0].stop :]
        return [Guided(ids, spans[0].stop, edits=1)]

    with pytest.raises(RuntimeError, match="row 'r': guided re-split changed the bytes"):
        guide_table(broken, demo_tokenizer, table, eot, cfg)
