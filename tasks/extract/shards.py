"""Hidden-state shards on disk: safetensors `aux` (T, 3*H) and `final` (T, H) in bf16, plus completion markers.

Rows are concatenated along the token axis with no padding; the index says where each row starts.
A shard counts as done by tasks/completions.py's rule: its marker names the same input fingerprint
and the shard file has the recorded size. Both files are written atomically, the shard first.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tasks.extract.backend import RowStates
from tasks.storage import atomic_path
from tasks.target_model.assets import sha256_of


def shard_name(number: int) -> str:
    return f"shard-{number:05d}.safetensors"


def write_shard(path: Path, rows: list[RowStates]) -> dict:
    """Concatenate rows along the token axis and write them atomically; returns tokens, bytes, sha256."""
    aux = torch.cat([r.aux for r in rows], dim=0).contiguous()  # (T, 3*H)
    final = torch.cat([r.final for r in rows], dim=0).contiguous()  # (T, H)
    with atomic_path(Path(path)) as tmp:
        save_file({"aux": aux, "final": final}, str(tmp))
    return {"tokens": int(aux.shape[0]), "bytes": Path(path).stat().st_size, "sha256": sha256_of(Path(path))}


def read_rows(path: Path, spans: list[tuple[int, int]]) -> list[RowStates]:
    """The rows at (offset, length) spans of one shard, as stored (bf16)."""
    out = []
    with safe_open(str(path), framework="pt") as shard:
        aux, final = shard.get_slice("aux"), shard.get_slice("final")
        for offset, length in spans:
            out.append(RowStates(aux=aux[offset : offset + length], final=final[offset : offset + length]))
    return out


def read_shard(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole shard: aux (T, 3*H) and final (T, H)."""
    with safe_open(str(path), framework="pt") as shard:
        return shard.get_tensor("aux"), shard.get_tensor("final")
