"""Retake the README's Prefect UI screenshots (headless Chromium, 1600x1000) against a running Prefect server.

The server must hold a finished `eagle3_pipeline` run and its deployments (`draftsmith run` and `draftsmith
deploy --no-serve` with PREFECT_API_URL set). Reads PREFECT_API_URL (default http://127.0.0.1:4200/api);
writes docs/ui/<page>.png. Chromium: `apt-get install chromium` (Debian).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx

OUT = Path(__file__).resolve().parent
API = os.environ.get("PREFECT_API_URL", "http://127.0.0.1:4200/api").rstrip("/")
UI = API.removesuffix("/api")
SIZE = "1600,1000"


def post(path: str, body: dict) -> list:
    response = httpx.post(f"{API}{path}", json=body, timeout=30)
    response.raise_for_status()
    return response.json()


def first(items: list, what: str) -> dict:
    if not items:
        sys.exit(f"no {what} on {API}: run the pipeline (and `draftsmith deploy --no-serve`) against it first")
    return items[0]


def pages() -> dict[str, str]:
    """Page name -> UI path: the runs list, the latest finished pipeline run, its run report and validation
    report, and the pipeline deployment's run form."""
    pipeline = {"flows": {"name": {"any_": ["eagle3_pipeline"]}}}
    finished = {"state": {"type": {"any_": ["COMPLETED"]}}, "parent_task_run_id": {"is_null_": True}}
    run = first(post("/flow_runs/filter", {**pipeline, "flow_runs": finished, "sort": "START_TIME_DESC", "limit": 1}), "run")
    children = post("/flow_runs/filter", {"flow_runs": {"parent_flow_run_id": {"any_": [run["id"]]}}, "limit": 50})
    tree = [run["id"]] + [c["id"] for c in children]

    def artifact(key: str) -> str:
        found = post("/artifacts/filter", {"artifacts": {"key": {"any_": [key]}, "flow_run_id": {"any_": tree}}, "limit": 1})
        return first(found, f"{key} artifact of run {run['name']}")["id"]

    deployment = first(post("/deployments/filter", {**pipeline, "limit": 1}), "pipeline deployment")
    return {
        "runs": "/runs",
        "pipeline-run": f"/runs/flow-run/{run['id']}",
        "run-report": f"/artifacts/artifact/{artifact('run-report')}",
        "validation-report": f"/artifacts/artifact/{artifact('validation-report')}",
        "deployment-form": f"/deployments/deployment/{deployment['id']}/run",
    }


def main() -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("chromium not found: apt-get install chromium")
    for name, path in pages().items():
        target = OUT / f"{name}.png"
        command = [
            chromium,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--window-size={SIZE}",
            "--virtual-time-budget=20000",
            f"--screenshot={target}",
            f"{UI}{path}",
        ]
        subprocess.run(command, check=True, timeout=180, capture_output=True)
        print(f"{target}  <-  {UI}{path}")


if __name__ == "__main__":
    main()
