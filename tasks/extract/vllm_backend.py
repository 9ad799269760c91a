"""The vLLM backend: a vLLM server (started by draftsmith) runs each row as a prompt with vLLM's own
`extract_hidden_states` speculative method, which caches the aux layers' inputs and the last layer's output of
every prompt token; its hidden-states connector (`tasks/extract/vllm_connector.py`) writes them to one
safetensors file per request. This backend reads each file, applies the target's final RMSNorm to the last
layer's output (vLLM stores it un-normed) and returns the same RowStates as the transformers backend.
"""

from __future__ import annotations

import fcntl
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch
from safetensors.torch import load_file

from tasks.config import RunConfig
from tasks.extract.backend import RowStates
from tasks.extract.plan import aux_layer_ids, read_target_info
from tasks.extract.transformers_backend import STORAGE_DTYPE
from tasks.stages import stage_dir
from tasks.target_model.checkpoint import FINAL_NORM, TEXT_PREFIXES, read_config, read_tensor, tensor_files, text_config
from tasks.target_model.loader import model_dir
from tasks.vllm_server import VllmServer


def final_norm(directory: Path, architecture: str) -> tuple[torch.Tensor, float]:
    """The target's final RMSNorm (weight, eps), read by name from its checkpoint (a wrapper's `language_model.`
    included) without loading the model."""
    if architecture.startswith("Gemma"):
        raise ValueError(f"extract.backend=vllm: {architecture} scales its final norm by 1 + weight; use transformers")
    files = tensor_files(directory)
    names = [prefix + FINAL_NORM for prefix in TEXT_PREFIXES if prefix + FINAL_NORM in files]
    if len(names) != 1:
        raise ValueError(f"extract.backend=vllm: no single final norm weight (…{FINAL_NORM}) in {directory}")
    eps = text_config(read_config(directory)).get("rms_norm_eps")
    if eps is None:
        raise ValueError(f"{directory}/config.json has no rms_norm_eps for the final norm")
    return read_tensor(files, names[0]).float(), float(eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.float()
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def read_saved(path: Path) -> dict[str, torch.Tensor]:
    """A file the connector writes; its lock file is held until the write is done. Both are removed after."""
    lock = path.with_name(path.name + ".lock")
    with open(lock) as held:
        fcntl.flock(held, fcntl.LOCK_SH)
        data = load_file(str(path))
    path.unlink()
    lock.unlink(missing_ok=True)
    return data


class VllmBackend:
    def __init__(self, config: RunConfig):
        self.config = config
        self.info = read_target_info(config)
        self.aux_layer_ids = aux_layer_ids(config, self.info)
        # vLLM stores the captured layers in ascending id order; id L is the last layer's output.
        captured = sorted(self.aux_layer_ids) + [self.info.num_hidden_layers]
        self.columns = [captured.index(i) for i in self.aux_layer_ids]
        self.norm_weight, self.eps = final_norm(model_dir(config.target), self.info.architecture)
        self.store = (stage_dir(config, "extract") / "vllm").resolve()
        speculative = {
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": captured}},
        }
        transfer = {
            "kv_connector": "HostHiddenStatesConnector",
            "kv_connector_module_path": "tasks.extract.vllm_connector",
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": str(self.store)},
        }
        options = ["--speculative-config", json.dumps(speculative), "--kv-transfer-config", json.dumps(transfer)]
        options.append("--no-enable-prefix-caching")  # every row computed from its first token
        longest = min(self.info.max_positions, config.target.max_length + 1)  # each row plus the one token generated
        self.server = VllmServer(config, self.store / "server.log", options, longest)
        self.client = httpx.Client(base_url=self.server.start(), timeout=3600)

    def close(self) -> None:
        self.server.stop()
        self.client.close()

    def one(self, row: list[int]) -> RowStates:
        body = {"model": self.config.target.model, "prompt": row, "max_tokens": 1, "temperature": 0}
        reply = self.client.post("/v1/completions", json=body)
        if reply.status_code != 200:
            raise RuntimeError(f"vLLM refused a row of {len(row)} tokens: {reply.status_code} {reply.text[:500]}")
        path = Path((reply.json().get("kv_transfer_params") or {}).get("hidden_states_path", ""))
        if path.parent != self.store:
            raise RuntimeError(f"vLLM saved no hidden states under {self.store} (got {path}); see {self.server.log}")
        saved = read_saved(path)
        if saved["token_ids"].tolist() != list(row):
            raise RuntimeError(f"vLLM saved states for other tokens than the row sent ({path})")
        states = saved["hidden_states"]  # (T, 4, H): the captured layers in ascending id order
        aux = torch.cat([states[:, c] for c in self.columns], dim=-1)  # (T, 3*H)
        final = rms_norm(states[:, -1], self.norm_weight, self.eps)  # (T, H)
        return RowStates(aux=aux.to(STORAGE_DTYPE), final=final.to(STORAGE_DTYPE))

    def extract(self, rows: list[list[int]]) -> list[RowStates]:
        """All rows in flight at once (up to `vllm.concurrency`); vLLM batches them."""
        with ThreadPoolExecutor(self.config.vllm.concurrency) as pool:
            return list(pool.map(self.one, rows))
