"""What a hidden-state backend is: the contract any engine (transformers, vLLM, SGLang) must meet.

Layer ids follow the Hugging Face `hidden_states` index: id i is the *input* of decoder layer i
(id 0 = the token embeddings). EAGLE-3 takes ids [2, L//2, L-3], and both serving engines capture
those when a draft's config names none. Named ids are read differently: vLLM uses
`eagle_aux_hidden_state_layer_ids` unchanged; SGLang (0.5, `set_eagle3_layers_to_capture` in
sglang/srt/models) adds 1 to each id for most targets, but for DeepSeek-V2/V3 bodies (Kimi-K2, Kimi-K2.5,
GLM-4 MoE Lite) only when the first id is 1, and for gpt-oss not when the largest id equals the layer count.
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
    architecture: str = ""  # the target's `architectures[0]` (how SGLang reads layer ids depends on it)


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


# Targets whose SGLang model adds 1 to the layer ids only when the first one is 1 (DeepSeek-V2/V3 bodies).
SGLANG_FIRST_ID_RULE = frozenset(
    {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration", "Glm4MoeLiteForCausalLM"}
)


def engine_layer_ids(hf_indices: list[int], engine: str, architecture: str = "") -> list[int]:
    """Aux layer ids as `engine` must read them from `eagle_aux_hidden_state_layer_ids` to capture the inputs
    of these decoder layers (HF hidden_states indices) of a target of this architecture."""
    if engine == "vllm":
        return list(hf_indices)
    if engine != "sglang":
        raise ValueError(f"unknown engine {engine!r}; expected 'sglang' or 'vllm'")
    if architecture not in SGLANG_FIRST_ID_RULE:
        return [i - 1 for i in hf_indices]  # read +1 (gpt-oss too: i - 1 never reaches the layer count)
    if hf_indices[0] == 1:
        raise ValueError(
            f"SGLang cannot capture hidden_states {hf_indices} of a {architecture} target: it reads a first id of 1 "
            "as 2 and any other id unchanged; put another layer first or use EAGLE-3's default layers"
        )
    return list(hf_indices)  # read unchanged, as the first id is not 1


def export_layer_ids(hf_indices: list[int], num_layers: int, engine: str, architecture: str) -> list[int] | None:
    """`eagle_aux_hidden_state_layer_ids` for an export: None (left out) for EAGLE-3's default layers, which
    vLLM and SGLang both capture when a draft names none, so one export serves both; else `engine`'s ids."""
    if list(hf_indices) == default_aux_layer_ids(num_layers):
        return None
    return engine_layer_ids(hf_indices, engine, architecture)


def layer_id_forms(ids: list[int], architecture: str = "") -> dict[str, list[int] | None]:
    """The same layers in each engine's spelling (None where the engine cannot name them)."""
    forms: dict[str, list[int] | None] = {"hf_hidden_states": list(ids)}
    for engine in ("vllm", "sglang"):
        try:
            forms[engine] = engine_layer_ids(ids, engine, architecture)
        except ValueError:
            forms[engine] = None
    return forms
