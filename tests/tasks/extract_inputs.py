"""Merged rows for extract tests: real ChatML renders of the demo tokenizer, of varied length."""

from __future__ import annotations

from pathlib import Path

from tasks.storage import write_table

TOPICS = [
    "the water cycle",
    "prime numbers",
    "a sourdough starter",
    "binary search",
    "the French revolution",
    "photosynthesis",
    "TCP handshakes",
    "the rules of chess",
    "compound interest",
    "black holes",
    "regular expressions",
    "the immune system",
    "solar panels",
    "haiku",
    "garbage collection",
]


def chat_row(tokenizer, i: int, split: str) -> dict:
    """One conversation whose reply grows with `i`, so rows differ in length."""
    topic = TOPICS[i % len(TOPICS)]
    prompt = [{"role": "user", "content": f"Explain {topic} briefly."}]
    reply = " ".join([f"Here is point {k} about {topic}." for k in range(1 + i % 7)])
    prompt_ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)["input_ids"]
    ids = tokenizer.apply_chat_template(prompt + [{"role": "assistant", "content": reply}], tokenize=True)["input_ids"]
    mask = [0] * len(prompt_ids) + [1] * (len(ids) - len(prompt_ids))
    return {
        "id": f"{split}-{i:03d}",
        "source": "chat",
        "split": split,
        "input_ids": ids,
        "loss_mask": mask,
        "num_tokens": len(ids),
    }


def write_merged(run_dir: Path, tokenizer, train: int = 24, eval_: int = 6) -> list[dict]:
    """Write merged/train and merged/eval (one part each); returns every row."""
    rows = {s: [chat_row(tokenizer, i, s) for i in range(n)] for s, n in (("train", train), ("eval", eval_))}
    for split, split_rows in rows.items():
        write_table("merged", split_rows, Path(run_dir) / "merged" / split / "part-00000.parquet")
    return rows["train"] + rows["eval"]
