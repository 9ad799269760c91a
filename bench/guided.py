"""Guided vs canonical re-encoding in simulate mode: exact rows recovered, at what cost against extract.

    .venv/bin/python bench/guided.py                  # 200 replies at T=0.7 and 200 at T=0, 128 new tokens
    .venv/bin/python bench/guided.py --rows 40 --quick

Samples SmolLM2 replies with their true ids, plays them through the text API (decode, split, drop the
ids), rebuilds each by one-pass re-encoding (canonical) and by `guided`, and classifies both against
the true ids. Cost is set beside the extract stage's forward pass over the same rows (same model,
same threads, batched by length the way extract batches).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tasks  # noqa: E402,F401  (offline defaults)
from bench.simulate_reencode import sharegpt_prompts  # noqa: E402
from tasks.config import GuidedConfig, TargetConfig  # noqa: E402
from tasks.extract.batching import pack_batches  # noqa: E402
from tasks.extract.transformers_backend import TransformersBackend  # noqa: E402
from tasks.reconstruct.guided import guide  # noqa: E402
from tasks.target_model.chat import resolve_end_of_turn  # noqa: E402
from tasks.target_model.loader import load_model, load_tokenizer  # noqa: E402
from tasks.validate.simulate import replay_rows  # noqa: E402
from tests.support.sample import sample_generations  # noqa: E402


def split(counts: Counter, rows: int) -> str:
    return f"{counts['exact']} ({counts['exact'] / rows:.0%}) / {counts['bpe_only']} / {counts['semantic']}"


def extract_seconds(model, rows: list[list[int]], batch_tokens: int) -> float:
    """The extract stage's forward work on these rows: hooks on, length-packed batches."""
    backend = TransformersBackend(model, name="bench")
    rows = sorted(rows, key=len, reverse=True)
    started = time.perf_counter()
    for batch in pack_batches([len(r) for r in rows], batch_tokens):
        backend.extract([rows[i] for i in batch])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200, help="replies per temperature")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="40 rows per temperature, 64 new tokens")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.max_new_tokens = 40, 64

    import torch

    torch.set_num_threads(args.threads)
    target = TargetConfig()
    tokenizer, model = load_tokenizer(target), load_model(target)
    end_of_turn = resolve_end_of_turn(tokenizer, target)
    prompts = sharegpt_prompts(args.rows, 400)
    cfg = GuidedConfig()
    print(f"\nSmolLM2-135M-Instruct, {args.rows} ShareGPT replies per temperature, <= {args.max_new_tokens} new tokens,")
    print(f"{args.threads} thread(s); guided: {cfg.model_dump()}\n")
    header = "| T | rows | canonical exact / bpe_only / semantic | guided exact / bpe_only / semantic | exact -> not |"
    header += " rows changed | mean nats gained | guided s/1k tok | extract s/1k tok | guided / extract |"
    print(header)
    print("|" + "---|" * 10)
    for temperature in (0.7, 0.0):
        rows = sample_generations(
            model, tokenizer, prompts, end_of_turn, max_new_tokens=args.max_new_tokens, temperature=temperature
        )
        spans = [r for r in replay_rows(tokenizer, rows, target, end_of_turn) if r.span is not None]
        started = time.perf_counter()
        guided = guide(model, tokenizer, [s.span for s in spans], cfg)
        guided_s = time.perf_counter() - started
        extract_s = extract_seconds(model, [s.span.ids for s in spans], 4096)
        before = [s.verdict(tokenizer, s.span.ids).klass for s in spans]
        after = [s.verdict(tokenizer, g.ids).klass for s, g in zip(spans, guided, strict=True)]
        worse = sum(b == "exact" and a != "exact" for b, a in zip(before, after, strict=True))
        changed = [g for g in guided if g.edits]
        gained = statistics.mean(g.nats for g in changed) if changed else 0.0
        tokens = sum(len(s.span.ids) for s in spans) / 1000
        print(
            f"| {temperature} | {len(spans)} | {split(Counter(before), len(spans))} | {split(Counter(after), len(spans))} "
            f"| {worse} | {len(changed)} | {gained:.1f} | {guided_s / tokens:.2f} | {extract_s / tokens:.2f} "
            f"| {guided_s / extract_s:.2f}x |"
        )


if __name__ == "__main__":
    main()
