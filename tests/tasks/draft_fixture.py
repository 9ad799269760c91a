"""A small run directory in the extract stage's format, made with the real demo target.

Writes merged/{train,eval}/part-00000.parquet and hidden_states/ (shard, index.parquet, meta.json)
for a handful of short chat renders, so that train and evaluate tests read exactly what they read
in a pipeline run.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from tasks.storage import write_table

AUX_LAYER_IDS = [2, 15, 27]

CHATS = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("Name a primary color.", "Red is a primary color."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("What is 2 plus 2?", "2 plus 2 equals 4."),
    ("Say hello in Spanish.", "Hello in Spanish is hola."),
    ("What color is the sky on a clear day?", "On a clear day the sky is blue."),
    ("Which planet is closest to the Sun?", "Mercury is the closest planet to the Sun."),
    ("What do bees make?", "Bees make honey."),
    ("How many days are in a week?", "There are seven days in a week."),
    ("What is the opposite of hot?", "The opposite of hot is cold."),
    ("What animal says moo?", "A cow says moo."),
    ("What is frozen water called?", "Frozen water is called ice."),
    ("Give me a synonym for happy.", "A synonym for happy is joyful."),
    ("What is the largest ocean?", "The Pacific Ocean is the largest ocean."),
    ("Write a haiku about rain.", "Soft rain on the roof,\nwhispers through the quiet night,\nthe earth drinks and sleeps."),
    ("What is the boiling point of water?", "Water boils at 100 degrees Celsius at sea level."),
]


def render(tokenizer, user: str, reply: str) -> tuple[list[int], list[int]]:
    """ChatML ids of one exchange and a loss mask over the reply and its end-of-turn token."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    reply_ids = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    ids = prompt + reply_ids
    return ids, [0] * len(prompt) + [1] * len(reply_ids)


@torch.no_grad()
def write_run(run_dir: Path, tokenizer, model, n_eval: int = 4) -> Path:
    """Write the merged table and the hidden-state shards for CHATS (the last `n_eval` are eval rows)."""
    run_dir = Path(run_dir)
    rows, index, aux_parts, final_parts, offset = [], [], [], [], 0
    for n, (user, reply) in enumerate(CHATS):
        ids, mask = render(tokenizer, user, reply)
        split = "eval" if n >= len(CHATS) - n_eval else "train"
        row_id = f"chat-{n:03d}"
        rows.append(
            {"id": row_id, "source": "fixture", "split": split, "input_ids": ids, "loss_mask": mask, "num_tokens": len(ids)}
        )
        states = model.model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
        aux_parts.append(torch.cat([states[i][0] for i in AUX_LAYER_IDS], dim=-1).to(torch.bfloat16))
        final_parts.append(states[-1][0].to(torch.bfloat16))
        index.append(
            {
                "id": row_id,
                "split": split,
                "shard": "shard-00000.safetensors",
                "offset": offset,
                "length": len(ids),
                "input_ids": ids,
                "loss_mask": mask,
            }
        )
        offset += len(ids)
    for split in ("train", "eval"):
        write_table("merged", [r for r in rows if r["split"] == split], run_dir / "merged" / split / "part-00000.parquet")
    hidden = run_dir / "hidden_states"
    hidden.mkdir(parents=True, exist_ok=True)
    save_file({"aux": torch.cat(aux_parts), "final": torch.cat(final_parts)}, str(hidden / "shard-00000.safetensors"))
    write_table("hidden_index", index, hidden / "index.parquet")
    cfg = model.config
    meta = {
        "num_hidden_layers": cfg.num_hidden_layers,
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
        "aux_layer_ids": AUX_LAYER_IDS,
        "dtype": "bfloat16",
        "tokens": offset,
        "shards": 1,
    }
    (hidden / "meta.json").write_text(json.dumps(meta))
    return run_dir
