"""evaluate.engine: vllm — the held-out prompts decoded by vLLM servers draftsmith starts: one without a draft (the
greedy reference and its tokens/s), one with the export, and for the gate one with the untrained draft exported
the same way. Prompts go one at a time, as draftsmith's own loop decodes them; vLLM's spec-decode counters, read
before and after each request, give that prompt's verifying forwards and accepted tokens per draft position.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

from tasks.config import RunConfig
from tasks.evaluate.speculative import DecodeResult
from tasks.vllm_server import VllmServer, counter

DRAFTS = "vllm:spec_decode_num_drafts_total"
ACCEPTED_AT = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def speculative_options(export_dir: Path, k: int) -> list[str]:
    """Serve `export_dir` as an EAGLE-3 draft (a P-EAGLE one drafting in parallel), refusing an export whose layer
    ids are written for SGLang."""
    exported = json.loads((Path(export_dir) / "config.json").read_text(encoding="utf-8"))
    if (exported.get("draftsmith") or {}).get("layer_id_convention") == "sglang":
        raise ValueError(
            f"{export_dir}: its aux layer ids are written for SGLang, so vLLM would read other layers; "
            "export with train.export_engine: vllm (or EAGLE-3's default layers) to evaluate with vLLM"
        )
    method = {"method": "eagle3", "model": str(Path(export_dir).resolve()), "num_speculative_tokens": k}
    if exported.get("parallel_drafting"):
        method["parallel_drafting"] = True
    return ["--speculative-config", json.dumps(method)]


def counted_rounds(before: str, after: str, k: int, tokens: list[int]) -> DecodeResult:
    """One request's rounds from the counter deltas: drafts, and rounds accepting ≥ i tokens (chain drafts are
    accepted as a prefix, so position i's count is the rounds that accepted at least i + 1).

    vLLM counts a draft token accepted when it matches, even past max_tokens or a stop token, where the reply does not
    take it; draftsmith's loop counts only what the reply takes. The rounds yield the reply's tokens after the first
    (the prefill's), so accepted tokens beyond those are taken off the round that ran past the end (the last, which
    the histogram cannot place: the one accepting most)."""

    def delta(name: str, **labels: str) -> int:
        return round(counter(after, name, **labels) - counter(before, name, **labels))

    at_least = [delta(DRAFTS)] + [delta(ACCEPTED_AT, position=str(i)) for i in range(k)] + [0]
    accepted = sorted(n for n in range(k + 1) for _ in range(at_least[n] - at_least[n + 1]))
    excess = sum(accepted) + len(accepted) - (len(tokens) - 1)
    if accepted and excess > 0:
        accepted[-1] = max(0, accepted[-1] - excess)
    return DecodeResult(tokens=tokens, accepted=accepted, proposed=k)


def decode_served(
    config: RunConfig, log: Path, options: list[str], prompts: list[list[int]], eos_ids: set[int]
) -> list[tuple[DecodeResult, float]]:
    """Each prompt decoded greedily by one server; per prompt its result (rounds counted when drafting) and seconds."""
    ec = config.evaluate
    k = ec.num_draft_tokens if options else 0
    with VllmServer(config, log, options, served_length(config)) as server:
        return decode_on(server, config, prompts, eos_ids, k)


def served_length(config: RunConfig) -> int:
    """--max-model-len for the evaluate servers: the longest prompt, reply and draft a round can hold."""
    ec = config.evaluate
    return config.target.max_length + ec.max_new_tokens + ec.num_draft_tokens + 1


def decode_on(
    server: VllmServer, config: RunConfig, prompts: list[list[int]], eos_ids: set[int], k: int
) -> list[tuple[DecodeResult, float]]:
    """The prompts one at a time on a running server (drafting k tokens, or none: k = 0); per prompt its result and
    seconds."""
    out = []
    with httpx.Client(base_url=server.url, timeout=600) as client:
        for prompt in prompts:
            body = {
                "model": config.target.model,
                "prompt": prompt,
                "max_tokens": config.evaluate.max_new_tokens,
                "temperature": 0,
                "stop_token_ids": sorted(eos_ids),
                "return_token_ids": True,
            }
            before = server.metrics() if k else ""
            started = time.perf_counter()
            reply = client.post("/v1/completions", json=body)
            seconds = time.perf_counter() - started
            if reply.status_code != 200:
                raise RuntimeError(f"vLLM refused a prompt of {len(prompt)} tokens: {reply.status_code} {reply.text[:500]}")
            tokens = list(reply.json()["choices"][0].get("token_ids") or [])
            result = counted_rounds(before, server.metrics(), k, tokens) if k else DecodeResult(tokens=tokens)
            out.append((result, seconds))
    return out
