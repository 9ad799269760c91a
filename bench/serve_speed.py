"""Speed where a draft is served: vLLM with the target alone and with each draft, at each k, on the same prompts.

    DRAFTSMITH_VLLM_PYTHON=.venv-vllm/bin/python .venv/bin/python bench/quality.py --train-mode offline \
        --budgets 200000 --variants 3.1 p-eagle --ks 3 5 7 --serve-ks 1 2 3 4 5 6 7 --serve-reps 3

(`bench/quality.py --serve-ks` trains and scores the drafts, then calls `measure` here on their exports.)

One server without a draft stays up while each (draft, k) server starts beside it in turn; the prompts then go
through greedy, then the draft, `reps` times alternately, so a drift of the machine reaches both sides alike.
tokens/s is a pass's output tokens over its summed request seconds (one request at a time, as a single user
sees it); a pass's speed-up is the draft pass over the greedy pass just before it, and the spread over the passes
is what the machine's noise leaves. τ comes from vLLM's spec-decode counters over the passes. Servers run with
--enforce-eager unless `compiled` (the CPU build recompiles at every start, 1.5-2.5 min on 2 cores).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.publish import Table
from tasks.config import RunConfig
from tasks.evaluate.speculative import DecodeResult
from tasks.evaluate.stage import pooled_tau
from tasks.evaluate.vllm_engine import decode_on, served_length, speculative_options
from tasks.vllm_server import VllmServer


def tokens_per_s(decoded: list[tuple[DecodeResult, float]]) -> float:
    return sum(len(r.tokens) for r, _ in decoded) / sum(s for _, s in decoded)


def spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values), "values": values}


def measure(
    config: RunConfig,
    drafts: dict[str, Path],
    prompts: list[list[int]],
    eos_ids: set[int],
    ks: list[int],
    reps: int,
    out: Path,
    compiled: bool = False,
) -> list[dict]:
    """One row per (draft, k): τ by vLLM, greedy and speculative tokens/s per pass, the speed-up per pass, and
    whether every speculative reply was the greedy one."""
    args = config.vllm.args if compiled else [*config.vllm.args, "--enforce-eager"]
    config = config.model_copy(
        update={
            "vllm": config.vllm.model_copy(update={"args": args}),
            "evaluate": config.evaluate.model_copy(update={"num_draft_tokens": max(ks)}),
        }
    )
    longest = served_length(config)
    rows = []
    with VllmServer(config, out / "greedy.log", [], longest) as greedy:
        decode_on(greedy, config, prompts[:1], eos_ids, 0)  # warm-up, not timed
        for name, export in drafts.items():
            for k in ks:
                with VllmServer(config, out / f"{name}-k{k}.log", speculative_options(export, k), longest) as drafting:
                    decode_on(drafting, config, prompts[:1], eos_ids, k)
                    passes = []
                    for _ in range(reps):
                        plain = decode_on(greedy, config, prompts, eos_ids, 0)
                        passes.append((plain, decode_on(drafting, config, prompts, eos_ids, k)))
                greedy_tps = [tokens_per_s(plain) for plain, _ in passes]
                draft_tps = [tokens_per_s(spec) for _, spec in passes]
                rows.append(
                    {
                        "draft": name,
                        "k": k,
                        "tau": pooled_tau([r for _, spec in passes for r, _ in spec]),
                        # Prompts whose reply equals greedy's in every pass: all of them in fp32; in bf16 vLLM's CPU
                        # kernels round a verifying forward of k + 1 tokens otherwise than a one-token one, so a
                        # near-tie can go the other way and the two replies part there.
                        "identical": sum(
                            all(plain[i][0].tokens == spec[i][0].tokens for plain, spec in passes) for i in range(len(prompts))
                        ),
                        "prompts": len(prompts),
                        "greedy_tokens_per_s": spread(greedy_tps),
                        "speculative_tokens_per_s": spread(draft_tps),
                        "speed_up": spread([d / g for d, g in zip(draft_tps, greedy_tps, strict=True)]),
                    }
                )
                print(f"serve speed {name} k={k}: τ {rows[-1]['tau']:.3f}, speed-up {rows[-1]['speed_up']}", flush=True)
    return rows


def speed_table(results: list[dict]) -> list[Table]:
    """vLLM's output tokens/s with each shape against the target alone, at each k served."""
    served = [(r, m) for r in results for m in r.get("serve", [])]
    if not served:
        return []
    reps = len(served[0][1]["speed_up"]["values"])
    table = Table(
        f"Served by vLLM: tokens/s with the draft against the target alone, {reps} alternating passes each",
        ["target tokens", "shape", "k", "τ by vLLM", "greedy tokens/s", "speculative tokens/s", "speed-up", "min", "max",
         "replies = greedy's"],
        note="Mean over the passes; min and max: the passes' own speed-ups (each draft pass over the greedy pass before it). "
        "replies = greedy's: prompts whose speculative reply was the greedy one in every pass; in bfloat16 vLLM's CPU "
        "kernels round a forward of k + 1 tokens otherwise than a one-token forward, so a near-tie can part them.",
    )  # fmt: skip
    for r, m in served:
        up = m["speed_up"]
        table.add(
            r["tokens"], r["variant"], m["k"], m["tau"], m["greedy_tokens_per_s"]["mean"],
            m["speculative_tokens_per_s"]["mean"], up["mean"], up["min"], up["max"], f"{m['identical']}/{m['prompts']}",
        )  # fmt: skip
    return [table]
