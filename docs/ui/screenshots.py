"""Retake the docs' Prefect UI screenshots (headless Chromium, 1600x1000) against a running Prefect server, or
shoot any pages given by URL (the docs site's, say).

The server must hold a finished `eagle3_pipeline` run and its deployments (`draftsmith ui`, then `draftsmith run`
and `draftsmith deploy --no-serve` with PREFECT_API_URL set). Reads PREFECT_API_URL (default
http://127.0.0.1:4200/api); writes docs/ui/<page>.png.

    python docs/ui/screenshots.py                            # the Prefect UI pages, into docs/ui/
    python docs/ui/screenshots.py --site build/site --out shots   # the docs site's pages (a static build or a URL)
    python docs/ui/screenshots.py --url runs=http://127.0.0.1:4200/runs --out shots

Chromium: `apt-get install chromium` (Debian).
"""

from __future__ import annotations

import argparse
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
# The docs site's pages worth a picture, by the path `mkdocs` gives each.
SITE_PAGES = {"home": "", "your-own-target": "your-own-target/", "config-reference": "reference/config/"}


def post(path: str, body: dict) -> list:
    response = httpx.post(f"{API}{path}", json=body, timeout=30)
    response.raise_for_status()
    return response.json()


def first(items: list, what: str) -> dict:
    if not items:
        sys.exit(f"no {what} on {API}: run the pipeline (and `draftsmith deploy --no-serve`) against it first")
    return items[0]


def pages() -> dict[str, str]:
    """Page name -> UI path: the runs list, the latest finished pipeline run, its run report (with τ against the
    untrained draft's and the gain on the evaluate row), its τ table, its validation report, and the pipeline
    deployment's run form."""
    pipeline = {"flows": {"name": {"any_": ["eagle3_pipeline"]}}}
    finished = {"state": {"type": {"any_": ["COMPLETED"]}}, "parent_task_run_id": {"is_null_": True}}
    run = first(post("/flow_runs/filter", {**pipeline, "flow_runs": finished, "sort": "START_TIME_DESC", "limit": 1}), "run")
    children = post("/flow_runs/filter", {"flow_runs": {"parent_flow_run_id": {"any_": [run["id"]]}}, "limit": 50})
    tree = [run["id"]] + [c["id"] for c in children]

    def artifact(key: str) -> dict:
        found = post("/artifacts/filter", {"artifacts": {"key": {"any_": [key]}, "flow_run_id": {"any_": tree}}, "limit": 1})
        return first(found, f"{key} artifact of run {run['name']}")

    report = artifact("run-report")
    if "vs untrained" not in report["data"] or "gain" not in report["data"]:
        sys.exit(f"run {run['name']}'s report has no τ against the untrained draft: rerun with evaluate.min_tau_gain set")

    deployment = first(post("/deployments/filter", {**pipeline, "limit": 1}), "pipeline deployment")
    return {
        "runs": "/runs",
        "pipeline-run": f"/runs/flow-run/{run['id']}",
        "run-report": f"/artifacts/artifact/{report['id']}",
        "eval-acceptance": f"/artifacts/artifact/{artifact('eval-acceptance')['id']}",
        "validation-report": f"/artifacts/artifact/{artifact('validation-report')['id']}",
        "deployment-form": f"/deployments/deployment/{deployment['id']}/run",
    }


def site_pages(site: str) -> dict[str, str]:
    """Page name -> URL of the docs site's pages, from a served site (http://...) or a static build folder."""
    if site.startswith(("http://", "https://")):
        return {name: f"{site.rstrip('/')}/{path}" for name, path in SITE_PAGES.items()}
    root = Path(site).resolve()
    if not (root / "index.html").is_file():
        sys.exit(f"{root}: no index.html (build the site first: make docs)")
    return {name: (root / path / "index.html").as_uri() for name, path in SITE_PAGES.items()}


def shoot(chromium: str, url: str, target: Path) -> None:
    command = [
        chromium,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--window-size={SIZE}",
        "--virtual-time-budget=20000",
        f"--screenshot={target}",
        url,
    ]
    subprocess.run(command, check=True, timeout=180, capture_output=True)
    if not target.is_file():
        sys.exit(f"chromium wrote no {target} for {url}")
    print(f"{target}  <-  {url}")


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", action="append", default=[], metavar="NAME=URL", help="Shoot URL into NAME.png (repeatable).")
    parser.add_argument(
        "--site",
        help="Shoot the docs site's pages (home, your-own-target, config reference) from a URL or a static build folder.",
    )
    parser.add_argument("--out", type=Path, default=OUT, help="Folder for the pictures (default: docs/ui/).")
    return parser.parse_args()


def main() -> None:
    args = arguments()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("chromium not found: apt-get install chromium")
    if any("=" not in item for item in args.url):
        sys.exit("--url takes NAME=URL, e.g. --url runs=http://127.0.0.1:4200/runs")
    wanted = dict(item.split("=", 1) for item in args.url) | (site_pages(args.site) if args.site else {})
    if not wanted:  # the Prefect UI's pages
        wanted = {name: f"{UI}{path}" for name, path in pages().items()}
    args.out.mkdir(parents=True, exist_ok=True)
    for name, url in wanted.items():
        shoot(chromium, url, args.out / f"{name}.png")


if __name__ == "__main__":
    main()
