"""Training rows for the draft: stored hidden-state shards (offline), a target forward (online), or the serving
engine (stream/cache, tasks/draft/states.py).

Either way a row is: input_ids (T,), loss_mask (T,), aux (T, 3*H_t) and final (T, H_t), the target's
last normed state from which its logits are recomputed through the frozen `lm_head`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from tasks.extract.batching import cut_shards
from tasks.extract.shards import StoredStates
from tasks.storage import read_table


@dataclass
class TrainingRow:
    id: str
    input_ids: list[int]
    loss_mask: list[int]


def read_meta(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "hidden_states" / "meta.json").read_text(encoding="utf-8"))


class OfflineSource:
    """Rows of one split from `hidden_states/` shards, each shard opened lazily."""

    def __init__(self, run_dir: Path, split: str = "train"):
        self.directory = Path(run_dir) / "hidden_states"
        self.meta = read_meta(run_dir)
        index = read_table("hidden_index", self.directory / "index.parquet").to_pylist()
        index = sorted((r for r in index if r["split"] == split), key=lambda r: r["id"])
        self.index = index
        self.rows = [TrainingRow(r["id"], r["input_ids"], r["loss_mask"]) for r in index]
        self._handles: dict[str, object] = {}

    def close(self) -> None:
        self._handles.clear()

    def _shard(self, name: str):
        if name not in self._handles:
            self._handles[name] = StoredStates(self.directory / name)
        return self._handles[name]

    def features(self, indices: list[int]) -> list[dict]:
        """aux (T, 3*H_t) and final (T, H_t) as float32 per requested row."""
        out = []
        for i in indices:
            entry = self.index[i]
            aux, final = self._shard(entry["shard"]).span(entry["offset"], entry["offset"] + entry["length"])
            out.append({"aux": aux, "final": final})
        return out


def merged_rows(run_dir: Path, split: str = "train") -> list[TrainingRow]:
    """The merge stage's rows of one split, by id (the order every source keeps)."""
    table = read_table("merged", Path(run_dir) / "merged" / split).to_pylist()
    table = sorted((r for r in table if r["split"] == split), key=lambda r: r["id"])
    return [TrainingRow(r["id"], r["input_ids"], r["loss_mask"]) for r in table]


class OnlineSource:
    """Rows of the merged table; features come from a target forward at load time (nothing on disk)."""

    def __init__(self, run_dir: Path, target, aux_layer_ids: list[int], split: str = "train"):
        self.rows = merged_rows(run_dir, split)
        self.target = target
        self.aux_layer_ids = aux_layer_ids

    def close(self) -> None:
        return None

    @torch.no_grad()
    def features(self, indices: list[int]) -> list[dict]:
        """One target forward over the rows, right-padded (causal attention: padding never reaches a real position)."""
        device = next(self.target.parameters()).device
        lengths = [len(self.rows[i].input_ids) for i in indices]
        ids = torch.zeros(len(indices), max(lengths), dtype=torch.long, device=device)
        for b, i in enumerate(indices):
            ids[b, : lengths[b]] = torch.tensor(self.rows[i].input_ids, device=device)
        states = self.target.model(input_ids=ids, output_hidden_states=True).hidden_states
        aux = torch.cat([states[k] for k in self.aux_layer_ids], dim=-1).float().cpu()  # (B, T, 3*H_t)
        final = states[-1].float().cpu()  # after the last norm
        return [{"aux": aux[b, :n], "final": final[b, :n]} for b, n in enumerate(lengths)]


def plan_batches(lengths: list[int], batch_tokens: int, seed: int, epoch: int, window: int = 64) -> list[list[int]]:
    """One epoch of global batches: rows shuffled by (seed, epoch), packed greedily up to `batch_tokens`.

    Each `window` of shuffled rows is sorted by length before packing, so a batch holds rows of like length and
    right-padding to its longest row costs little (on ShareGPT replies: 5% more positions than tokens, against
    26% unsorted); the batches are then shuffled, so the epoch does not run short rows first in each window.
    """
    rng = random.Random(seed * 1_000_003 + epoch)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    order = [i for start in range(0, len(order), window) for i in sorted(order[start : start + window], key=lengths.__getitem__)]
    batches = [[order[p] for p in cut] for cut in cut_shards([lengths[i] for i in order], batch_tokens)]
    rng.shuffle(batches)
    return batches


def schedule(lengths: list[int], batch_tokens: int, seed: int, epoch: int, position: int) -> Iterator[tuple[int, int, list[int]]]:
    """(epoch, position, rows) of every global batch from `position` of `epoch` on, epoch after epoch."""
    while True:
        batches = plan_batches(lengths, batch_tokens, seed, epoch)
        for at in range(position, len(batches)):
            yield epoch, at, batches[at]
        epoch, position = epoch + 1, 0


def rank_slice(batch: list[int], rank: int, world: int) -> tuple[list[int], bool]:
    """The rows of a global batch this rank reads, and whether it is idle.

    A global batch with fewer rows than ranks leaves some ranks idle; they still run the step (DDP
    needs every rank) on the batch's first row with its loss mask cleared, so they add nothing.
    """
    mine = batch[rank::world]
    return (mine, False) if mine else (batch[:1], True)


def collate(rows: list[TrainingRow], feats: list[dict]) -> dict[str, torch.Tensor]:
    """Right-pad to the longest row; padding has loss_mask 0 and causal attention never sees it."""
    T = max(len(r.input_ids) for r in rows)
    B = len(rows)
    h_aux, h_final = feats[0]["aux"].shape[-1], feats[0]["final"].shape[-1]
    batch = {
        "input_ids": torch.zeros(B, T, dtype=torch.long),
        "loss_mask": torch.zeros(B, T, dtype=torch.float32),
        "aux": torch.zeros(B, T, h_aux),
        "final": torch.zeros(B, T, h_final),
    }
    for b, (row, feat) in enumerate(zip(rows, feats, strict=True)):
        n = len(row.input_ids)
        batch["input_ids"][b, :n] = torch.tensor(row.input_ids)
        batch["loss_mask"][b, :n] = torch.tensor(row.loss_mask, dtype=torch.float32)
        batch["aux"][b, :n] = feat["aux"]
        batch["final"][b, :n] = feat["final"]
    return batch
