"""Look for a secret everywhere a run leaves traces: files (run dirs, logs, the Prefect database) and the Prefect API."""

from __future__ import annotations

from pathlib import Path

import httpx


def scan_files(roots: list[Path], secret: str) -> list[str]:
    """Every file under `roots` (or the file itself) whose bytes contain the secret."""
    needle = secret.encode()
    hits = []
    for root in roots:
        paths = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        hits += [str(p) for p in paths if needle in p.read_bytes()]
    return hits


def scan_prefect_api(api_url: str, secret: str) -> list[str]:
    """Artifacts, logs and flow-run parameters as the API serves them (paged), where the secret appears."""
    hits = []
    with httpx.Client(base_url=api_url, timeout=30) as client:
        for kind in ("artifacts", "logs", "flow_runs", "task_runs"):
            offset = 0
            while True:
                page = client.post(f"/{kind}/filter", json={"limit": 200, "offset": offset})
                page.raise_for_status()
                items = page.json()
                hits += [f"{kind}:{item.get('id')}" for item in items if secret in str(item)]
                if len(items) < 200:
                    break
                offset += 200
    return hits
