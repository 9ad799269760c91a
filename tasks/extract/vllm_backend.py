"""The vLLM backend: a vLLM server (started by draftsmith) runs each row as a prompt with vLLM's own
`extract_hidden_states` speculative method, which caches the aux layers' inputs and the last layer's output of
every prompt token; its hidden-states connector (`tasks/extract/vllm_connector.py`) writes them to one
safetensors file per request. This backend reads each file, applies the target's final RMSNorm to the last
layer's output (vLLM stores it un-normed) and returns the same RowStates as the transformers backend.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch
from safetensors.torch import load_file

from tasks.config import RunConfig
from tasks.extract.backend import RowStates
from tasks.extract.plan import aux_layer_ids, read_target_info
from tasks.extract.transformers_backend import STORAGE_DTYPE
from tasks.failpoints import failpoint
from tasks.stages import stage_dir
from tasks.target_model.checkpoint import FINAL_NORM, TEXT_PREFIXES, read_config, read_tensor, tensor_files, text_config
from tasks.target_model.loader import model_dir
from tasks.vllm_server import VllmServer

log = logging.getLogger(__name__)


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


ENGINE_GONE = (httpx.TransportError, ConnectionError)  # what a request to a dead server raises


class EngineDied(RuntimeError):
    """The vLLM server died more often than `engine_restarts` allows."""


class VllmBackend:
    """vLLM computing hidden states: `ask` has the server write a row's states to a file under `store`, `states` reads
    it (and removes it). A server that dies is restarted and the request asked again, up to `restarts` times in all."""

    def __init__(self, config: RunConfig, store: Path | None = None, restarts: int = 0, log: Path | None = None):
        self.config = config
        self.info = read_target_info(config)
        self.aux_layer_ids = aux_layer_ids(config, self.info)
        # vLLM stores the captured layers in ascending id order; id L is the last layer's output.
        captured = sorted(self.aux_layer_ids) + [self.info.num_hidden_layers]
        self.columns = [captured.index(i) for i in self.aux_layer_ids]
        self.norm_weight, self.eps = final_norm(model_dir(config.target), self.info.architecture)
        self.store = Path(store or stage_dir(config, "extract") / "vllm").resolve()
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
        self._server_args = (options, longest)
        self.server = VllmServer(config, log or self.store / "server.log", options, longest)
        self.restart_limit, self.restarts = restarts, 0
        self._generation, self._lock, self._retired = 0, threading.Lock(), []
        self.busy_s, self._in_flight, self._busy_since = 0.0, 0, 0.0  # wall seconds with a request in flight
        self.client = httpx.Client(base_url=self.server.start(), timeout=3600)

    def close(self) -> None:
        self.server.stop()
        for client in [*self._retired, self.client]:
            client.close()

    def ask(self, row: list[int]) -> Path:
        """Have the server compute `row` and write its states; returns the file's path."""
        while True:
            generation = self._generation
            try:
                with self._busy():
                    failpoint("extract.engine", on_fire=self.server.kill)
                    reply = self.client.post("/v1/completions", json=self._body(row))
                break
            except ENGINE_GONE as error:
                self._restart(generation, error)
        if reply.status_code != 200:
            raise RuntimeError(f"vLLM refused a row of {len(row)} tokens: {reply.status_code} {reply.text[:500]}")
        path = Path((reply.json().get("kv_transfer_params") or {}).get("hidden_states_path", ""))
        if path.parent != self.store:
            raise RuntimeError(f"vLLM saved no hidden states under {self.store} (got {path}); see {self.server.log}")
        return path

    def _body(self, row: list[int]) -> dict:
        return {"model": self.config.target.model, "prompt": row, "max_tokens": 1, "temperature": 0}

    def _restart(self, generation: int, error: Exception) -> None:
        """Restart a dead server once per death (other threads' requests that failed with it just ask again)."""
        with self._lock:
            if generation != self._generation:
                return
            if not self.server.dead():
                raise error  # the server lives: a transport error of its own, not a death
            self.server.stop()
            if self.restarts >= self.restart_limit:
                raise EngineDied(
                    f"vLLM engine died ({type(error).__name__}: {error}) after {self.restarts} restart(s), the limit; "
                    f"its log: {self.server.log}"
                ) from error
            self.restarts += 1
            died = self.server.log.with_name(f"{self.server.log.stem}.died-{self.restarts}.log")
            self.server.log.replace(died)
            log.warning("vLLM engine died (%s); restart %d of %d (its log: %s)", error, self.restarts, self.restart_limit, died)
            # A new server on a new port, and a new client: a request still on its way to the dead one can never reach
            # the new one while it starts, and the old client is closed only at the end (closing a connection another
            # thread is reading from would leave that thread blocked).
            self._retired.append(self.client)
            self.server = VllmServer(self.config, self.server.log, *self._server_args)
            self.client = httpx.Client(base_url=self.server.start(), timeout=3600)
            self._generation += 1

    @contextlib.contextmanager
    def _busy(self):
        with self._lock:
            if self._in_flight == 0:
                self._busy_since = time.perf_counter()
            self._in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self.busy_s += time.perf_counter() - self._busy_since

    def states(self, path: Path, row: list[int]) -> RowStates:
        """The states of `row` in the file the server wrote (removed once read), as the extract contract has them."""
        saved = read_saved(path)
        if saved["token_ids"].tolist() != list(row):
            raise RuntimeError(f"vLLM saved states for other tokens than the row sent ({path})")
        states = saved["hidden_states"]  # (T, 4, H): the captured layers in ascending id order
        aux = torch.cat([states[:, c] for c in self.columns], dim=-1)  # (T, 3*H)
        final = rms_norm(states[:, -1], self.norm_weight, self.eps)  # (T, H)
        return RowStates(aux=aux.to(STORAGE_DTYPE), final=final.to(STORAGE_DTYPE))

    def one(self, row: list[int]) -> RowStates:
        return self.states(self.ask(row), row)

    def extract(self, rows: list[list[int]]) -> list[RowStates]:
        """All rows in flight at once (up to `vllm.concurrency`); vLLM batches them."""
        with ThreadPoolExecutor(self.config.vllm.concurrency) as pool:
            return list(pool.map(self.one, rows))
