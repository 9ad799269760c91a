"""Start the embedded target server as a subprocess for one run, and always stop it."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import yaml

from tasks.config import RunConfig
from tasks.prefect_env import PROJECT_ROOT
from tasks.storage import write_bytes_atomic

log = logging.getLogger(__name__)


class ServerStartError(RuntimeError):
    """The embedded server exited or did not answer /health in time."""


def die_with_parent() -> None:
    """In the server child: ask Linux to SIGTERM it when the process that started it dies (even by SIGKILL)."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def embedded_server(config: RunConfig, workdir: Path) -> Iterator[str]:
    """Yield the base URL of a freshly started server for `config.target`; SIGTERM it on exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "server-config.yaml"
    write_bytes_atomic(config_file, yaml.safe_dump(config.model_dump(mode="json")).encode("utf-8"))
    port = free_port()
    cmd = [sys.executable, "-m", "tasks.target_model.serve", "--config", str(config_file.resolve()), "--port", str(port)]
    with open(workdir / "server.log", "ab") as log_file:
        process = subprocess.Popen(
            cmd,
            cwd=PROJECT_ROOT,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=die_with_parent,
        )
    try:
        base_url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + config.generate.embedded.startup_s
        while True:
            if process.poll() is not None:
                raise ServerStartError(f"embedded server exited with {process.returncode}; see {workdir / 'server.log'}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise ServerStartError(f"embedded server not healthy after {config.generate.embedded.startup_s:g}s")
            time.sleep(0.5)
        log.info("embedded server for %s on %s (pid %d)", config.target.model, base_url, process.pid)
        yield base_url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
