"""vLLM's hidden-states connector, made to run on a CPU worker too. Imported by the vLLM server, not by draftsmith.

vLLM 0.32's `ExampleHiddenStatesConnector` saves each finished request's hidden states (cached by the
`extract_hidden_states` speculative method) to a safetensors file. Its copy out of the cache uses CUDA only:
pinned host memory, a copy stream and a CUDA event. On a CPU worker the cache is already in host memory, so
this subclass copies it synchronously and writes the same file; on a CUDA worker it is the stock connector.
"""

from __future__ import annotations

import fcntl
import os

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _Done:
    """Stands for the CUDA event of a copy that has already finished."""

    @staticmethod
    def query() -> bool:
        return True

    @staticmethod
    def synchronize() -> None:
        return None


class HostHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending: PendingSave) -> None:
        if self._kv_cache is None or self._kv_cache.is_cuda:
            return super()._submit_async_write(pending)
        if not self._is_tp_rank_zero:
            return None
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (blocks[:, None] * self._block_size + torch.arange(self._block_size)).flatten()
        states = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        tensors = {"hidden_states": states, "token_ids": pending.token_ids.clone()}
        self._write_tensors(tensors, _Done(), pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = _Done()
        return None
