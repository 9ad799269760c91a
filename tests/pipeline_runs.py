"""Run the `draftsmith` command as a user would (a separate process, or in this one for deploy), and read what it wrote."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "configs" / "tiny.yaml"


def run_cli(
    args: list[str],
    api_url: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 900,
) -> subprocess.CompletedProcess:
    """`python -m flows.cli ARGS` with output captured; PREFECT_API_URL points at `api_url` when given."""
    full_env = os.environ | (env or {})
    if api_url:
        full_env["PREFECT_API_URL"] = api_url
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def deploy_tiny(runs_dir: Path, pool: str, extra: list[str] = ()):
    """`draftsmith deploy --no-serve` of the tiny config into `runs_dir`, on work pool `pool`, run in this process
    against its Prefect API; the click result (exit code, what it printed)."""
    from typer.testing import CliRunner

    from flows.cli import app

    args = ["--config", str(TINY), "--set", f"runs_dir={runs_dir}", "--set", f"orchestration.work_pool={pool}", *extra]
    return CliRunner().invoke(app, ["deploy", "--no-serve", *args])


def settle_logs(api_url: str, flow_run_id: str, quiet_s: float = 4, timeout: float = 60) -> None:
    """Wait until the run's log count stops growing: the flow's process sends its last lines in batches after its
    state is final, and stopping the worker at once can cut them off."""
    query = {"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200}
    seen, quiet_since, deadline = -1, time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < deadline and time.monotonic() - quiet_since < quiet_s:
        reply = httpx.post(f"{api_url}/logs/filter", json=query, timeout=30)
        count = len(reply.json()) if reply.status_code == 200 else seen
        if count != seen:
            seen, quiet_since = count, time.monotonic()
        time.sleep(1)


def run_on_worker(api_url: str, deployment_id: str, pool: str, env: dict[str, str] | None = None, timeout: float = 900) -> dict:
    """Trigger a deployment by API with a `draftsmith worker` serving `pool`; returns the flow run once it settled."""
    worker = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "worker", "--config", str(TINY), "--set", f"orchestration.work_pool={pool}"],
        cwd=ROOT,
        # The worker asks for scheduled runs every second (Prefect polls every 10 s by default).
        env=os.environ | (env or {}) | {"PREFECT_API_URL": api_url, "PREFECT_WORKER_QUERY_SECONDS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(10):  # a busy SQLite server may answer 503 now and then: ask again
            created = httpx.post(f"{api_url}/deployments/{deployment_id}/create_flow_run", json={}, timeout=30)
            if created.status_code < 500:
                break
            time.sleep(3)
        assert created.status_code == 201, created.text
        run, deadline = created.json(), time.monotonic() + timeout
        while run["state_type"] not in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") and time.monotonic() < deadline:
            time.sleep(2)
            polled = httpx.get(f"{api_url}/flow_runs/{run['id']}", timeout=30)
            if polled.status_code == 200:  # a busy SQLite server may answer 5xx now and then: ask again
                run = polled.json()
        settle_logs(api_url, run["id"])
    finally:
        worker.terminate()
        worker.wait(60)
    return run


def tree_stats(root: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime_ns) of every output under `root` (not the run's lock): unchanged means nothing was rewritten."""
    files = [p for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".lock"]
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in files}
