"""What a hidden-state backend is: the contract any engine (transformers, vLLM, SGLang) must meet.

Layer ids follow the Hugging Face `hidden_states` index: id i is the *input* of decoder layer i
(id 0 = the token embeddings). EAGLE-3 takes ids [2, L//2, L-3]. Serving engines spell the same
layers differently: vLLM's `eagle_aux_hidden_state_layer_ids` use this index unchanged, SGLang adds
+1 to the ids it is given, so SGLang must be handed `id - 1` to capture the same tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

LAYER_CONVENTION = "hf_hidden_states_index: hidden_states[i] is the input of decoder layer i"
FINAL_CONVENTION = "post-norm last hidden state (lm_head input)"


@dataclass(frozen=True)
class TargetInfo:
    """The shape facts of the target a backend runs, recorded in the output metadata."""

    model: str
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    max_positions: int  # longest row the backend can run


@dataclass
class RowStates:
    """One row's states, padding already removed: aux (T, 3*H) and final (T, H), bf16 on CPU."""

    aux: torch.Tensor
    final: torch.Tensor


@runtime_checkable
class HiddenStateBackend(Protocol):
    """Runs the target over token rows and returns exactly what EAGLE-3 trains on.

    A backend must:
    - expose `info` (TargetInfo) and `aux_layer_ids` (HF index, in the order they are concatenated);
    - from `extract(rows)`, return one RowStates per input row, in input order, where for a row of
      T tokens `aux` is (T, 3*H) bf16 with the three aux states concatenated along the feature axis
      in `aux_layer_ids` order, and `final` is (T, H) bf16, the final normed hidden state (the
      lm_head input); position t is the state after reading tokens 0..t of that row alone;
    - never return padding, never keep all L layers in memory, and be deterministic: the same rows
      in the same batch give the same bytes;
    - be safe to call from several threads (serialise on the device if need be).
    """

    info: TargetInfo
    aux_layer_ids: list[int]

    def extract(self, rows: list[list[int]]) -> list[RowStates]: ...


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's default: the inputs of layers 2, L//2 and L-3."""
    return [2, num_layers // 2, num_layers - 3]


def check_aux_layer_ids(ids: list[int], num_layers: int) -> list[int]:
    """Three distinct ids, each the input of an existing decoder layer (0..L-1)."""
    if len(ids) != 3:
        raise ValueError(f"extract.aux_layer_ids: EAGLE-3 fuses exactly 3 aux states, got {ids}")
    if len(set(ids)) != 3:
        raise ValueError(f"extract.aux_layer_ids: ids must be distinct, got {ids}")
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"extract.aux_layer_ids: {bad} outside 0..{num_layers - 1} (id i = input of decoder layer i)")
    return list(ids)


def engine_layer_ids(hf_indices: list[int], engine: str) -> list[int]:
    """Aux layer ids as an engine reads them from `eagle_aux_hidden_state_layer_ids`.

    Our ids are HF hidden_states indices (the input of decoder layer i). vLLM captures the input of
    layer id as given; SGLang adds 1 to each id it is given, so it must be written one lower.
    """
    if engine == "vllm":
        return list(hf_indices)
    if engine == "sglang":
        return [i - 1 for i in hf_indices]
    raise ValueError(f"unknown engine {engine!r}; expected 'sglang' or 'vllm'")


def layer_id_forms(ids: list[int]) -> dict[str, list[int]]:
    """The same layers in each engine's spelling."""
    return {"hf_hidden_states": list(ids), **{e: engine_layer_ids(ids, e) for e in ("vllm", "sglang")}}
