"""The transformers backend: one forward pass per batch, hooks keep only the 3 aux inputs and the final state."""

from __future__ import annotations

import threading

import torch

from tasks.config import ComputeConfig, ExtractConfig, TargetConfig
from tasks.extract.backend import RowStates, TargetInfo, check_aux_layer_ids, default_aux_layer_ids
from tasks.target_model.loader import load_model, pick_device, resolve_dtype

STORAGE_DTYPE = torch.bfloat16


def decoder_parts(model) -> tuple[torch.nn.Module, torch.nn.ModuleList, torch.nn.Module]:
    """(base model without lm_head, its decoder layers, its final norm) for HF decoder-only models."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = getattr(base, "layers", None)
    norm = getattr(base, "norm", None)
    if not isinstance(layers, torch.nn.ModuleList) or norm is None:
        raise TypeError(f"{type(model).__name__}: expected a decoder with `.layers` and a final `.norm`")
    return base, layers, norm


class TransformersBackend:
    """Captures hidden states from a transformers causal LM with forward hooks (no output_hidden_states)."""

    def __init__(self, model, aux_layer_ids: list[int] | None = None, name: str | None = None):
        self.model = model.eval()
        self.base, layers, norm = decoder_parts(model)
        config = model.config
        num_layers = len(layers)
        ids = default_aux_layer_ids(num_layers) if aux_layer_ids is None else aux_layer_ids
        self.aux_layer_ids = check_aux_layer_ids(ids, num_layers)
        self.info = TargetInfo(
            model=name or getattr(config, "name_or_path", "") or type(model).__name__,
            num_hidden_layers=num_layers,
            hidden_size=config.hidden_size,
            vocab_size=config.vocab_size,
            max_positions=getattr(config, "max_position_embeddings", None) or 1 << 30,
            architecture=(getattr(config, "architectures", None) or [type(model).__name__])[0],
        )
        self.pad_id = config.pad_token_id if config.pad_token_id is not None else 0
        self.device = next(model.parameters()).device
        # One forward at a time: the hooks write into shared slots, and the device is one device anyway.
        self._lock = threading.Lock()
        self._slots: dict[str, torch.Tensor] = {}
        for i in self.aux_layer_ids:
            layers[i].register_forward_pre_hook(self._keep_input(f"aux{i}"), with_kwargs=True)
        norm.register_forward_hook(self._keep_output("final"))

    def _keep_input(self, slot: str):
        def hook(module, args, kwargs):
            self._slots[slot] = args[0] if args else kwargs["hidden_states"]

        return hook

    def _keep_output(self, slot: str):
        def hook(module, args, output):
            self._slots[slot] = output

        return hook

    @torch.inference_mode()
    def extract(self, rows: list[list[int]]) -> list[RowStates]:
        """One right-padded forward over `rows`; states per row with padding cut off."""
        lengths = [len(r) for r in rows]
        width = max(lengths)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)  # (B, T)
        mask = torch.zeros((len(rows), width), dtype=torch.long)  # (B, T): 1 = real token
        for b, row in enumerate(rows):
            ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[b, : len(row)] = 1
        with self._lock:
            self._slots.clear()
            # Right padding: position ids 0..n-1 of each row are those of the row alone, and causal
            # attention never lets a real token see the padding after it.
            self.base(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), use_cache=False)
            aux = torch.cat(
                [self._slots[f"aux{i}"].to(STORAGE_DTYPE) for i in self.aux_layer_ids], dim=-1
            ).cpu()  # 3 x (B, T, H) -> (B, T, 3*H)
            final = self._slots["final"].to(STORAGE_DTYPE).cpu()  # (B, T, H)
            self._slots.clear()
        return [RowStates(aux=aux[b, :n], final=final[b, :n]) for b, n in enumerate(lengths)]


def load_transformers_backend(target: TargetConfig, extract: ExtractConfig, compute: ComputeConfig) -> TransformersBackend:
    """Load the target with the configured dtype on the configured (or automatic) device."""
    device = pick_device(compute.device)
    if device == "cpu" and extract.cpu_threads is not None:
        torch.set_num_threads(extract.cpu_threads)
    dtype = resolve_dtype(compute.dtype, device)
    model = load_model(target, dtype=dtype, device=device)
    return TransformersBackend(model, extract.aux_layer_ids, name=target.model)
