"""eagle3_pipeline against a real Prefect server: runs, subflows, task history, artifacts, reruns, deployments."""

import os
import re
import shutil
import subprocess
import sys
import time

import httpx
import pytest

from tasks.run_report import STAGE_ARTIFACTS
from tasks.stages import STAGE_NAMES
from tests.pipeline_runs import ROOT, TINY, run_cli, run_tiny, tree_hashes, tree_stats

pytestmark = pytest.mark.slow

STAGE_FLOWS = set(STAGE_NAMES)


def api(url: str, path: str, body: dict | None = None) -> list | dict:
    response = httpx.post(f"{url}{path}", json=body or {"limit": 200}, timeout=30)
    response.raise_for_status()
    return response.json()


def flow_names(url: str) -> dict[str, str]:
    return {f["id"]: f["name"] for f in api(url, "/flows/filter")}


def test_parent_subflows_tasks_and_artifacts_are_recorded(tiny_run, prefect_server):
    names = flow_names(prefect_server)
    runs = api(prefect_server, "/flow_runs/filter")
    parents = [r for r in runs if names[r["flow_id"]] == "eagle3_pipeline"]
    assert len(parents) == 1 and parents[0]["state_type"] == "COMPLETED"
    parent = parents[0]
    assert parent["name"].startswith("tiny-pipeline-") and {"tiny", "pipeline"} <= set(parent["tags"])

    tasks = api(prefect_server, "/task_runs/filter")
    by_id = {t["id"]: t for t in tasks}
    subflows = {names[r["flow_id"]]: r for r in runs if r["parent_task_run_id"]}
    assert set(subflows) == STAGE_FLOWS
    for stage, run in subflows.items():
        assert run["state_type"] == "COMPLETED", stage
        assert run["name"].startswith(f"tiny-{stage}-") and {"tiny", stage} <= set(run["tags"]), run
        assert by_id[run["parent_task_run_id"]]["flow_run_id"] == parent["id"], stage

    stage_tasks = [t for t in tasks if t["flow_run_id"] in {r["id"] for r in subflows.values()}]
    task_names = [t["name"] for t in stage_tasks]
    # Shard tasks are named by what they cover; the others get Prefect's short suffix.
    for prefix in (
        "generate-",
        "reconstruct-part-00000-0000",
        "validate-part-00000",
        "extract-shard-00000",
        "train-draft-",
        "export-draft-",
        "evaluate-draft-",
    ):
        assert any(name.startswith(prefix) for name in task_names), (prefix, task_names)
    for stage, run in subflows.items():  # one gate task per stage, named as in the README
        gates = [t["name"] for t in stage_tasks if t["flow_run_id"] == run["id"] and t["name"].startswith("gate-")]
        assert [g.rsplit("-", 1)[0] for g in gates] == [f"gate-{stage}"], (stage, gates)
    preflights = [t for t in tasks if t["name"].startswith("preflight-")]
    assert [t["flow_run_id"] for t in preflights] == [parent["id"]]  # once per pipeline run, in the parent
    logs = api(prefect_server, "/logs/filter", {"logs": {"flow_run_id": {"any_": [subflows["generate"]["id"]]}}, "limit": 200})
    assert any(re.match(r"generate: (\d+)/\1 rows \(\d+ failed\), .* tokens/s", log["message"]) for log in logs)
    retried = [t for t in stage_tasks if t["run_count"] > 1]
    assert [t["name"].rsplit("-", 1)[0] for t in retried] == ["generate"]
    assert retried[0]["state_type"] == "COMPLETED"

    artifacts = api(prefect_server, "/artifacts/filter")
    keys = {a["key"] for a in artifacts if a["key"]}
    expected = {key for stage_keys in STAGE_ARTIFACTS.values() for key in stage_keys}
    assert expected | {"run-report"} <= keys, expected - keys

    # The run report: a row per stage that ran, each linking to the artifact pages of this run.
    run_dir, _, _ = tiny_run
    [report] = [a["data"] for a in artifacts if a["key"] == "run-report" and a["flow_run_id"] == parent["id"]]
    rows = [line for line in report.splitlines() if line.startswith("| ") and not line.startswith("| stage")]
    assert [row.split(" | ")[:2] for row in rows] == [["| preflight", "ran"]] + [[f"| {s}", "ran"] for s in STAGE_NAMES]
    tree = {parent["id"]} | {r["id"] for r in subflows.values()}
    linked = [
        httpx.get(f"{prefect_server}/artifacts/{i}", timeout=30).json()
        for i in re.findall(r"/artifacts/artifact/([0-9a-f-]+)", report)
    ]
    assert sorted(a["key"] for a in linked) == sorted(expected) and {a["flow_run_id"] for a in linked} <= tree
    shown = [re.sub(r"\]\([^)]*\)", "]", row) for row in rows]  # as rendered: link targets are not shown
    assert max(len(row) for row in shown) <= 180 and str(run_dir.parent) not in report.split("\n", 3)[3]


def test_rerun_skips_every_stage_and_rewrites_nothing(tiny_run, prefect_server):
    run_dir, _, _ = tiny_run
    before = tree_stats(run_dir)
    done = run_tiny(run_dir.parent, api_url=prefect_server)
    assert done.returncode == 0, done.stderr[-3000:]
    assert tree_stats(run_dir) == before  # no file rewritten (size and mtime of every file unchanged)
    assert done.stdout.count("up to date") + done.stderr.count("up to date") == len(STAGE_FLOWS)
    reports = [a for a in api(prefect_server, "/artifacts/filter") if a["key"] == "run-report"]
    latest = max(reports, key=lambda a: a["created"])["data"]
    assert latest.count("| up to date | - |") == len(STAGE_FLOWS)  # no seconds of an earlier run


def test_changed_config_reruns_that_stage_and_downstream_only(tiny_run, prefect_server, tmp_path):
    run_dir, _, _ = tiny_run
    copy = tmp_path / "tiny"
    shutil.copytree(run_dir, copy)  # copy2 keeps mtimes, so the copy's stages stay current
    before = tree_hashes(copy)
    done = run_tiny(tmp_path, api_url=prefect_server, extra=["--set", "evaluate.max_new_tokens=6"])
    assert done.returncode == 0, done.stderr[-3000:]
    log = done.stdout + done.stderr
    for stage in ("generate", "reconstruct", "validate", "merge", "extract", "train"):
        assert f"stage {stage} is up to date" in log, stage
    assert "stage evaluate is up to date" not in log
    after = tree_hashes(copy)
    assert {k for k in after if after[k] != before.get(k)} <= {k for k in after if k.startswith("eval/")}


def test_a_deployment_triggered_by_api_runs_on_a_worker_named_and_tagged(tiny_run, prefect_server, tmp_path):
    """`deploy --no-serve` registers on a process pool it creates; a worker runs the pipeline triggered by API.

    The deployment's config is the finished tiny run (a copy) with evaluate changed, so evaluate reruns and
    every other stage is skipped as up to date."""
    run_dir, _, _ = tiny_run
    shutil.copytree(run_dir, tmp_path / "tiny")
    config = ["--config", str(TINY), "--set", f"runs_dir={tmp_path}", "--set", "orchestration.work_pool=tiny-pool"]
    schedule = ["--set", "orchestration.schedule_cron=0 3 * * *", "--set", "orchestration.schedule_timezone=Europe/Paris"]
    done = run_cli(["deploy", "--no-serve", *config, *schedule, "--set", "evaluate.max_new_tokens=6"], api_url=prefect_server)
    assert done.returncode == 0, done.stderr[-3000:]
    ui = prefect_server.removesuffix("/api")
    assert f"registered eagle3_pipeline/tiny on work pool 'tiny-pool'  {ui}/deployments/deployment/" in done.stdout
    pools = {p["name"]: p for p in api(prefect_server, "/work_pools/filter")}
    assert pools["tiny-pool"]["type"] == "process"

    names = flow_names(prefect_server)
    deployments = {d["name"]: d for d in api(prefect_server, "/deployments/filter")}
    pipeline = deployments["tiny"]
    assert names[pipeline["flow_id"]] == "eagle3_pipeline" and pipeline["work_pool_name"] == "tiny-pool"
    assert [(s["schedule"]["cron"], s["schedule"]["timezone"]) for s in pipeline["schedules"]] == [("0 3 * * *", "Europe/Paris")]
    assert pipeline["global_concurrency_limit"]["limit"] == 1 and pipeline["enforce_parameter_schema"] is True
    assert "RunConfig" in pipeline["parameter_openapi_schema"]["definitions"]
    assert {f"tiny-{stage}" for stage in STAGE_FLOWS} <= set(deployments)

    worker = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "worker", *config],
        cwd=ROOT,
        env=os.environ | {"PREFECT_API_URL": prefect_server},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        run = httpx.post(f"{prefect_server}/deployments/{pipeline['id']}/create_flow_run", json={}, timeout=30).json()
        deadline = time.monotonic() + 600
        while run["state_type"] not in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") and time.monotonic() < deadline:
            time.sleep(2)
            run = httpx.get(f"{prefect_server}/flow_runs/{run['id']}", timeout=30).json()
    finally:
        worker.terminate()
        worker.wait(60)
    assert run["state_type"] == "COMPLETED", run["state"]
    assert run["name"].startswith("tiny-pipeline-") and {"tiny", "pipeline"} <= set(run["tags"])
    children = api(prefect_server, "/flow_runs/filter", {"flow_runs": {"parent_flow_run_id": {"any_": [run["id"]]}}})
    tree = [run["id"]] + [c["id"] for c in children]
    child_tasks = api(prefect_server, "/task_runs/filter", {"flow_runs": {"id": {"any_": tree}}})
    assert [c["name"].rsplit("-", 2)[0] for c in children] == ["tiny-evaluate"]  # the rest was up to date
    assert {"tiny", "evaluate"} <= set(children[0]["tags"])
    assert [t["name"].rsplit("-", 1)[0] for t in child_tasks].count("preflight") == 1
