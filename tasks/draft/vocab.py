"""Draft vocabulary: the N most frequent trained tokens, sorted by id, with the d2t / t2d maps."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from tasks.storage import atomic_path


@dataclass
class DraftVocab:
    draft_to_target: torch.Tensor  # (N,) int64, ascending target ids
    d2t: torch.Tensor  # (N,) int64, target = draft + d2t[draft]
    t2d: torch.Tensor  # (V,) bool
    counts: torch.Tensor  # (V,) int64 trained-token frequencies the choice came from

    @property
    def size(self) -> int:
        return int(self.draft_to_target.numel())

    def coverage(self) -> float:
        """Share of trained tokens the draft vocab can predict."""
        total = int(self.counts.sum())
        return float(self.counts[self.draft_to_target].sum()) / total if total else 0.0


def count_trained_tokens(rows: list[tuple[list[int], list[int]]], vocab_size: int) -> np.ndarray:
    """Frequency of each target id under the loss mask; rows are (input_ids, loss_mask)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for ids, mask in rows:
        ids, mask = np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=bool)
        counts += np.bincount(ids[mask], minlength=vocab_size)[:vocab_size]
    return counts


def build_draft_vocab(counts: np.ndarray, size: int) -> DraftVocab:
    """Top-`size` ids by count (ties: lower id first), filled with the lowest unseen ids, sorted by id."""
    vocab_size = len(counts)
    size = min(size, vocab_size)
    order = np.lexsort((np.arange(vocab_size), -counts))  # count descending, then id ascending
    chosen = np.sort(order[:size])
    draft_to_target = torch.from_numpy(chosen.astype(np.int64))
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[draft_to_target] = True
    d2t = draft_to_target - torch.arange(size, dtype=torch.int64)
    return DraftVocab(draft_to_target, d2t, t2d, torch.from_numpy(counts.astype(np.int64)))


def save_vocab(vocab: DraftVocab, path: Path) -> None:
    tensors = {"draft_to_target": vocab.draft_to_target, "d2t": vocab.d2t, "t2d": vocab.t2d, "counts": vocab.counts}
    with atomic_path(Path(path)) as tmp:
        save_file(tensors, str(tmp))


def load_vocab(path: Path) -> DraftVocab:
    t = load_file(str(path))
    return DraftVocab(t["draft_to_target"], t["d2t"], t["t2d"], t["counts"])
