"""eagle3_pipeline against a real Prefect server: runs, subflows, task history, artifacts, reruns, deployments."""

import os
import re
import shutil
import subprocess
import sys
import time

import httpx
import pytest
from prefect import tags

from tasks.run_report import STAGE_ARTIFACTS, UP_TO_DATE
from tasks.stages import STAGE_NAMES
from tests.pipeline_runs import ROOT, TINY, tree_stats

pytestmark = pytest.mark.slow

STAGE_FLOWS = set(STAGE_NAMES)


def api(url: str, path: str, body: dict | None = None) -> list | dict:
    response = httpx.post(f"{url}{path}", json=body or {"limit": 200}, timeout=30)
    response.raise_for_status()
    return response.json()


def flow_names(url: str) -> dict[str, str]:
    return {f["id"]: f["name"] for f in api(url, "/flows/filter")}


def run_tree(url: str, parent: dict) -> tuple[dict[str, dict], list[dict]]:
    """The stage subflows of a pipeline run by flow name, and the task runs of the whole tree."""
    names = flow_names(url)
    children = api(url, "/flow_runs/filter", {"flow_runs": {"parent_flow_run_id": {"any_": [parent["id"]]}}})
    subflows = {names[r["flow_id"]]: r for r in children}
    tree = [parent["id"]] + [r["id"] for r in children]
    return subflows, api(url, "/task_runs/filter", {"flow_runs": {"id": {"any_": tree}}, "limit": 200})


def test_the_pipeline_run_by_a_worker_records_subflows_tasks_and_artifacts(tiny_run, prefect_server):
    """Done on the run a worker made of the deployment triggered by API: named, tagged runs, one preflight, one
    gate task per stage, a retry in the history, progress in the log, and a run report linking this run's artifacts."""
    _, _, parent = tiny_run
    assert parent["name"].startswith("tiny-pipeline-") and {"tiny", "pipeline"} <= set(parent["tags"])

    subflows, tasks = run_tree(prefect_server, parent)
    by_id = {t["id"]: t for t in tasks}
    assert set(subflows) == STAGE_FLOWS
    for stage, run in subflows.items():
        assert run["state_type"] == "COMPLETED", stage
        assert run["name"].startswith(f"tiny-{stage}-") and {"tiny", stage} <= set(run["tags"]), run
        assert by_id[run["parent_task_run_id"]]["flow_run_id"] == parent["id"], stage

    stage_tasks = [t for t in tasks if t["flow_run_id"] != parent["id"]]
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
    for stage, unit in (("reconstruct", "shards"), ("extract", "shards"), ("train", "steps"), ("evaluate", "prompts")):
        logs = api(prefect_server, "/logs/filter", {"logs": {"flow_run_id": {"any_": [subflows[stage]["id"]]}}, "limit": 200})
        assert any(re.match(rf"{stage}: (\d+)/\1 {unit}, .* ETA ", log["message"]) for log in logs), stage
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
    assert re.search(r"rows=12, failed=0, skipped_prompts=\d+", rows[1]), rows[1]  # prompts refused before any request
    assert re.search(r"\| τ \d\.\d{3}, untrained not decoded; gate passed \(needs mean τ ≥ 1\) \|", rows[-1]), rows[-1]
    logs = api(prefect_server, "/logs/filter", {"logs": {"flow_run_id": {"any_": [parent["id"]]}}, "limit": 200})
    done = (
        rf"run {parent['name']} done: τ \d\.\d{{3}} \(the untrained draft was not decoded\); draft export: \S+/tiny/draft/export"
    )
    assert any(re.fullmatch(done, log["message"]) for log in logs), [log["message"] for log in logs][-5:]
    tree = {parent["id"]} | {r["id"] for r in subflows.values()}
    linked = [
        httpx.get(f"{prefect_server}/artifacts/{i}", timeout=30).json()
        for i in re.findall(r"/artifacts/artifact/([0-9a-f-]+)", report)
    ]
    assert sorted(a["key"] for a in linked) == sorted(expected) and {a["flow_run_id"] for a in linked} <= tree
    shown = [re.sub(r"\]\([^)]*\)", "]", row) for row in rows]  # as rendered: link targets are not shown
    assert max(len(row) for row in shown) <= 180 and str(run_dir.parent) not in report.split("\n", 3)[3]


def rerun_tiny(runs_dir, extra: list[str] = ()) -> dict:
    """The tiny pipeline run again in this process, as `draftsmith run` runs it; each stage's summary."""
    from flows.cli import read_config
    from flows.pipeline import eagle3_pipeline

    config = read_config(TINY, [f"runs_dir={runs_dir}", *extra], stages=STAGE_NAMES)
    with tags(config.name, "pipeline"):
        return eagle3_pipeline(config)


def latest_report(url: str) -> str:
    reports = [a for a in api(url, "/artifacts/filter") if a["key"] == "run-report"]
    return max(reports, key=lambda a: a["created"])["data"]


def test_rerun_skips_every_stage_and_rewrites_nothing(tiny_run, prefect_server):
    run_dir, _, _ = tiny_run
    before = tree_stats(run_dir)
    results = rerun_tiny(run_dir.parent)
    assert tree_stats(run_dir) == before  # no file rewritten (size and mtime of every file unchanged)
    assert [stage for stage in STAGE_NAMES if results[stage].get(UP_TO_DATE)] == list(STAGE_NAMES)
    assert latest_report(prefect_server).count("| up to date | - |") == len(STAGE_FLOWS)  # no seconds of an earlier run


def test_a_rerun_skips_what_is_current_rewrites_nothing_there_and_reruns_a_changed_stage(tiny_run, prefect_server, tmp_path):
    """A rerun with only the evaluate settings changed: every upstream stage is skipped without a file rewritten
    (size and mtime of each unchanged), and the run report shows them as up to date with no seconds of an earlier
    run; evaluate alone runs again."""
    run_dir, _, _ = tiny_run
    copy = tmp_path / "tiny"
    shutil.copytree(run_dir, copy)  # copy2 keeps mtimes, so the copy's stages stay current
    before = tree_stats(copy)
    results = rerun_tiny(tmp_path, ["evaluate.max_new_tokens=6"])
    upstream = [stage for stage in STAGE_NAMES if stage != "evaluate"]
    assert [stage for stage in STAGE_NAMES if results[stage].get(UP_TO_DATE)] == upstream
    after = tree_stats(copy)
    assert {k for k in after if after[k] != before.get(k)} <= {k for k in after if k.startswith("eval/")}
    assert {k for k in after if k.startswith("eval/results") and after[k] != before.get(k)}  # evaluate ran
    assert latest_report(prefect_server).count("| up to date | - |") == len(upstream)


def delete_run(server: str, run_id: str) -> int:
    """DELETE a flow run; the test server answers 503 while its database is busy with the worker's run."""
    for _ in range(10):
        status = httpx.delete(f"{server}/flow_runs/{run_id}").status_code
        if status != 503:
            return status
        time.sleep(1)
    return status


def test_deploy_registers_on_a_process_pool_with_schedule_limit_and_a_run_form(tiny_run, prefect_server):
    """`deploy --no-serve` (in the fixture) printed each deployment's name and link, created the pool, and
    registered the pipeline on it scheduled in its time zone, one run at a time, with a run form holding what a run
    reads: the config and the stages to force, no deploy-time settings. The worker's run came from that deployment."""
    _, deployed, run = tiny_run
    ui = prefect_server.removesuffix("/api")
    assert f"registered eagle3_pipeline/tiny on work pool 'tiny-pool'  {ui}/deployments/deployment/" in deployed.stdout
    pools = {p["name"]: p for p in api(prefect_server, "/work_pools/filter")}
    assert pools["tiny-pool"]["type"] == "process"

    names = flow_names(prefect_server)
    deployments = {d["name"]: d for d in api(prefect_server, "/deployments/filter")}
    pipeline = deployments["tiny"]
    assert run["deployment_id"] == pipeline["id"] and run["work_pool_name"] == "tiny-pool"
    assert names[pipeline["flow_id"]] == "eagle3_pipeline" and pipeline["work_pool_name"] == "tiny-pool"
    assert [(s["schedule"]["cron"], s["schedule"]["timezone"]) for s in pipeline["schedules"]] == [("0 3 * * *", "Europe/Paris")]
    assert "in time zone Europe/Paris" in pipeline["description"]  # the list shows "At 03:00 AM every day" alone
    assert pipeline["global_concurrency_limit"]["limit"] == 1 and pipeline["enforce_parameter_schema"] is True
    assert {f"tiny-{stage}" for stage in STAGE_FLOWS} <= set(deployments)
    for deployment in [pipeline] + [deployments[f"tiny-{stage}"] for stage in STAGE_FLOWS]:
        form = deployment["parameter_openapi_schema"]
        positions = {name: prop["position"] for name, prop in form["properties"].items()}
        assert sorted(positions, key=positions.get) == ["force", "config"][2 - len(positions) :], deployment["name"]
        orchestration = form["definitions"]["OrchestrationConfig"]["properties"]
        assert {"task_runner", "max_workers"} <= set(orchestration) and not {"schedule_cron", "work_pool"} & set(orchestration)
        assert "schedule_cron" not in deployment["parameters"]["config"]["orchestration"]
    assert "force" in pipeline["parameter_openapi_schema"]["properties"]  # the stages that can skip work offer it too
    stages = pipeline["parameter_openapi_schema"]["properties"]["force"]["anyOf"][0]["items"]["enum"]
    assert stages == list(STAGE_NAMES)  # the form offers the stages by name
    # The README's command forces a stage from the deployment (the run is deleted before a worker sees it).
    forced = subprocess.run(
        [sys.executable, "-m", "prefect", "deployment", "run", "eagle3_pipeline/tiny", "--param", 'force=["train"]'],
        env=os.environ | {"PREFECT_API_URL": prefect_server},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert forced.returncode == 0, forced.stdout + forced.stderr
    created = api(prefect_server, "/flow_runs/filter", {"deployments": {"id": {"any_": [pipeline["id"]]}}})
    [run_forced] = [r for r in created if r["parameters"].get("force")]
    assert run_forced["parameters"]["force"] == ["train"]
    assert delete_run(prefect_server, run_forced["id"]) == 204


def test_every_name_the_docs_give_is_what_the_server_shows(tiny_run, prefect_server):
    """The operating page's task runs and artifacts of a pipeline run, read against the worker's run: both ways for
    artifacts, every task name it gives for task runs (Prefect adds a short suffix to unnamed ones)."""
    _, _, parent = tiny_run
    page = (ROOT / "docs" / "operating.md").read_text()
    tasks_part = page[page.index("each with its task runs:") : page.index("and one gate task per stage")]
    artifacts_part = page[page.index("**Artifacts** holds") : page.index("## Reading the run report")]
    said_tasks = re.findall(r"`([a-z0-9.-]+)`", tasks_part)
    # The artifact table's first column names them; its other columns may quote other words.
    first_cells = [line.split("|")[1] for line in artifacts_part.splitlines() if line.startswith("| `")]
    said_artifacts = {name for cell in first_cells for name in re.findall(r"`([a-z-]+)`", cell)}
    subflows, tasks = run_tree(prefect_server, parent)
    shown = {t["name"] for t in tasks}
    for name in said_tasks:
        assert name in shown or any(re.fullmatch(rf"{re.escape(name)}-[0-9a-z]{{3}}", s) for s in shown), (name, shown)
    tree = {parent["id"]} | {r["id"] for r in subflows.values()}
    mine = api(prefect_server, "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": list(tree)}}, "limit": 200})
    keys = {a["key"] for a in mine if a["key"]}
    gates = {f"gate-{stage}" for stage in STAGE_NAMES}
    assert gates <= keys and said_artifacts == keys - gates, said_artifacts ^ (keys - gates)
