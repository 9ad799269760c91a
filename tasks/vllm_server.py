"""A vLLM OpenAI-compatible server that draftsmith starts itself on 127.0.0.1 (extract.backend and evaluate.engine
`vllm`), from the Python environment vLLM is installed in (`vllm.python`, else $DRAFTSMITH_VLLM_PYTHON)."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx

from tasks.config import RunConfig
from tasks.prefect_env import PROJECT_ROOT

log = logging.getLogger(__name__)


def vllm_python(config: RunConfig) -> str:
    python = config.vllm.python or os.environ.get("DRAFTSMITH_VLLM_PYTHON")
    if not python:
        raise ValueError(
            "vllm.python is not set and neither is DRAFTSMITH_VLLM_PYTHON: name the Python of an environment with vLLM "
            "installed (`make test-vllm` sets one up in .venv-vllm)"
        )
    return python


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    """`python -m vllm.entrypoints.openai.api_server` on the target (`vllm serve` trips on the package name), killed
    with its process group on stop or at exit. Use as a context manager, or `start()` / `stop()`."""

    def __init__(self, config: RunConfig, log: Path, options: list[str], max_model_len: int):
        from tasks.extract.transformers_backend import resolve_dtype
        from tasks.target_model.loader import model_dir, pick_device

        self.config, self.log, self.port = config, Path(log), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [
            vllm_python(config),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir(config.target)),
            "--served-model-name",
            config.target.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-model-len",
            str(max_model_len),
            "--dtype",
            resolve_dtype(config.compute.dtype, pick_device(config.compute.device)),
            *config.vllm.args,
            *options,
        ]
        self.process: subprocess.Popen | None = None
        self.startup_s: float | None = None  # seconds from launch to the first healthy answer
        self._sigterm = None  # the SIGTERM handler before ours, while ours is installed

    def start(self) -> str:
        """Start the server and wait for /health; returns its base URL."""
        path = os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)  # our connector
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(self.config.vllm.cpu_kvcache_gib), PYTHONPATH=path)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._kill_orphan()
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.pid_file.write_text(str(self.process.pid), encoding="utf-8")
        atexit.register(self.stop)
        self._stop_on_sigterm()
        started = time.monotonic()
        deadline = started + self.config.vllm.startup_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM exited {self.process.returncode} while starting; {self.log}:\n{self.tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    self.startup_s = time.monotonic() - started
                    log.info("vLLM ready on %s in %.0f s (log %s)", self.url, self.startup_s, self.log.name)
                    return self.url
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                waited = self.config.vllm.startup_s
                raise TimeoutError(f"vLLM did not answer /health in {waited:.0f} s; {self.log}:\n{self.tail()}")
            time.sleep(2)

    @property
    def pid_file(self) -> Path:
        return self.log.with_name(self.log.name + ".pid")

    def _kill_orphan(self) -> None:
        """A server this log's last user started and never stopped (it was killed with SIGKILL, so neither atexit nor
        a signal handler ran) would keep its cores and memory: kill its process group before starting anew."""
        try:
            pid = int(self.pid_file.read_text(encoding="utf-8"))
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return
        if b"vllm" in command:
            log.warning("killing the vLLM server (pid %d) a killed run left behind (log %s)", pid, self.log)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)

    def _stop_on_sigterm(self) -> None:
        """A SIGTERM to this process (a cancelled flow run, `kill`) stops the server first: atexit does not run on a
        signal, and the server, in a session of its own, would keep the machine's cores. Then the handler before ours
        runs, or the process exits as the default handler would have it."""
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may set handlers; a worker thread's server is stopped by its caller
        before = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum, frame):
            self.stop()
            if callable(before):
                before(signum, frame)
            elif before != signal.SIG_IGN:
                raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, on_sigterm)
        self._sigterm = signal.SIG_DFL if before is None else before  # None: set outside Python

    def stop(self) -> None:
        if self._sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None
        if self.process is None or self.process.poll() is not None:
            self.pid_file.unlink(missing_ok=True)
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.pid_file.unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL the server's process group, as a crash would (no cleanup)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)

    def dead(self, wait_s: float = 5.0) -> bool:
        """Whether the server has exited (a dying one is given `wait_s` to finish)."""
        if self.process is None:
            return True
        try:
            self.process.wait(wait_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=30).text

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def counter(metrics: str, name: str, **labels: str) -> float:
    """A Prometheus counter's value, summed over the label sets that carry `labels`."""
    total = 0.0
    for label_text, value in re.findall(rf"^{re.escape(name)}(?:{{([^}}]*)}})? ([0-9.e+-]+)$", metrics, re.M):
        found = dict(re.findall(r'(\w+)="([^"]*)"', label_text))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(value)
    return total
