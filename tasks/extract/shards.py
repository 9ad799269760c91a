"""Hidden-state shards on disk: safetensors `aux` (T, 3*H) and `final` (T, H), plus completion markers.

Stored in bf16, or (`extract.storage_dtype: float8_e4m3fn`) in fp8 e4m3 with one fp32 scale per token and state
(`aux_scale` (T, 3), `final_scale` (T, 1)): each state is divided by its absolute maximum / 448 (e4m3's largest
value) before the cast, so every state keeps e4m3's full 3-bit mantissa range whatever its norm.
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


FP8_MAX = 448.0  # float8_e4m3fn's largest finite value
STORAGE_DTYPES = ("bfloat16", "float8_e4m3fn")


def bytes_per_token(hidden_size: int, storage_dtype: str = "bfloat16") -> int:
    """Stored bytes of one token's states: 3 aux + 1 final state of `hidden_size` values (plus fp8's 4 scales)."""
    if storage_dtype == "bfloat16":
        return 8 * hidden_size
    return 4 * hidden_size + 4 * 4


def _quantize(x: torch.Tensor, states: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(T, states*H) -> fp8 values (T, states*H) and one fp32 scale per token and state (T, states)."""
    grouped = x.float().view(x.shape[0], states, -1)
    scale = grouped.abs().amax(dim=-1).clamp(min=1e-12) / FP8_MAX
    values = (grouped / scale.unsqueeze(-1)).to(torch.float8_e4m3fn)
    return values.view(x.shape[0], -1), scale


def dequantize(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp8 values (T, states*H) and their scales (T, states) -> fp32 (T, states*H)."""
    grouped = values.float().view(values.shape[0], scale.shape[1], -1)
    return (grouped * scale.unsqueeze(-1)).view(values.shape[0], -1)


def encode_states(aux: torch.Tensor, final: torch.Tensor, storage_dtype: str = "bfloat16") -> dict[str, torch.Tensor]:
    """The tensors to store for aux (T, 3*H) and final (T, H) (bf16 in) in `storage_dtype`."""
    if storage_dtype not in STORAGE_DTYPES:
        raise ValueError(f"storage dtype {storage_dtype!r}: expected one of {sorted(STORAGE_DTYPES)}")
    if storage_dtype == "bfloat16":
        return {"aux": aux.to(torch.bfloat16).contiguous(), "final": final.to(torch.bfloat16).contiguous()}
    (aux_q, aux_scale), (final_q, final_scale) = _quantize(aux, 3), _quantize(final, 1)
    return {"aux": aux_q, "aux_scale": aux_scale, "final": final_q, "final_scale": final_scale}


def decode_states(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Stored tensors (as `encode_states` makes them) back to fp32 aux and final."""
    if "aux_scale" not in tensors:
        return {"aux": tensors["aux"].float(), "final": tensors["final"].float()}
    return {name: dequantize(tensors[name], tensors[f"{name}_scale"]) for name in ("aux", "final")}


class StoredStates:
    """An open safetensors file of stored states (a shard or a cache entry); `span` reads tokens as fp32."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._file = safe_open(str(path), framework="pt")
        self._names = set(self._file.keys())

    @property
    def tokens(self) -> int:
        return self._file.get_slice("final").get_shape()[0]

    def _read(self, name: str, start: int, stop: int) -> torch.Tensor:
        values = self._file.get_slice(name)[start:stop]
        if f"{name}_scale" not in self._names:
            return values.float()
        return dequantize(values, self._file.get_slice(f"{name}_scale")[start:stop])

    def span(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """aux (n, 3*H) and final (n, H) of tokens start..stop, fp32."""
        return self._read("aux", start, stop), self._read("final", start, stop)


def write_shard(path: Path, rows: list[RowStates], storage_dtype: str = "bfloat16") -> dict:
    """Concatenate rows along the token axis and write them atomically; returns tokens, bytes, sha256."""
    aux = torch.cat([r.aux for r in rows], dim=0)  # (T, 3*H)
    final = torch.cat([r.final for r in rows], dim=0)  # (T, H)
    with atomic_path(Path(path)) as tmp:
        save_file(encode_states(aux, final, storage_dtype), str(tmp))
    return {"tokens": int(aux.shape[0]), "bytes": Path(path).stat().st_size, "sha256": sha256_of(Path(path))}


def read_rows(path: Path, spans: list[tuple[int, int]]) -> list[RowStates]:
    """The rows at (offset, length) spans of one shard, in bf16 (fp8 shards dequantized)."""
    stored = StoredStates(path)
    out = []
    for offset, length in spans:
        aux, final = stored.span(offset, offset + length)
        out.append(RowStates(aux=aux.to(torch.bfloat16), final=final.to(torch.bfloat16)))
    return out


def read_shard(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole shard: aux (T, 3*H) and final (T, H), as stored in bf16 (fp8 dequantized to bf16)."""
    stored = StoredStates(path)
    aux, final = stored.span(0, stored.tokens)
    return aux.to(torch.bfloat16), final.to(torch.bfloat16)
