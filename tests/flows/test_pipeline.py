"""eagle3_pipeline against a real Prefect server: runs, subflows, task history, artifacts, reruns, deployments."""

import shutil

import httpx
import pytest

from tasks.run_report import STAGE_ARTIFACTS
from tasks.stages import STAGE_NAMES
from tests.pipeline_runs import TINY, run_cli, run_tiny, tree_hashes, tree_stats

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

    tasks = api(prefect_server, "/task_runs/filter")
    by_id = {t["id"]: t for t in tasks}
    subflows = {names[r["flow_id"]]: r for r in runs if r["parent_task_run_id"]}
    assert set(subflows) == STAGE_FLOWS
    for stage, run in subflows.items():
        assert run["state_type"] == "COMPLETED", stage
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
    retried = [t for t in stage_tasks if t["run_count"] > 1]
    assert [t["name"].rsplit("-", 1)[0] for t in retried] == ["generate"]
    assert retried[0]["state_type"] == "COMPLETED"

    keys = {a["key"] for a in api(prefect_server, "/artifacts/filter") if a["key"]}
    expected = {key for stage_keys in STAGE_ARTIFACTS.values() for key in stage_keys} | {"run-report"}
    assert expected <= keys, expected - keys


def test_rerun_skips_every_stage_and_rewrites_nothing(tiny_run, prefect_server):
    run_dir, _, _ = tiny_run
    before = tree_stats(run_dir)
    done = run_tiny(run_dir.parent, api_url=prefect_server)
    assert done.returncode == 0, done.stderr[-3000:]
    assert tree_stats(run_dir) == before  # no file rewritten (size and mtime of every file unchanged)
    assert done.stdout.count("up to date") + done.stderr.count("up to date") == len(STAGE_FLOWS)


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


def test_deploy_registers_pipeline_with_schedule_and_every_stage(prefect_server):
    done = run_cli(
        ["deploy", "--no-serve", "--config", str(TINY), "--set", "orchestration.schedule_cron=0 3 * * *"],
        api_url=prefect_server,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    names = flow_names(prefect_server)
    deployments = {d["name"]: d for d in api(prefect_server, "/deployments/filter")}
    pipeline = deployments["tiny"]
    assert names[pipeline["flow_id"]] == "eagle3_pipeline"
    assert [s["schedule"]["cron"] for s in pipeline["schedules"]] == ["0 3 * * *"]
    assert pipeline["enforce_parameter_schema"] is True
    assert "RunConfig" in pipeline["parameter_openapi_schema"]["definitions"]
    assert {f"tiny-{stage}" for stage in STAGE_FLOWS} <= set(deployments)
