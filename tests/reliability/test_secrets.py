"""Secrets: a sentinel key used for a real run appears nowhere (files, logs, Prefect database, artifacts).

The generate flow runs here in the test's process against the session's Prefect server; the same scan over a whole
pipeline run by the `draftsmith` command is in test_crash_resume.py."""

import json
import logging

import httpx
import pytest
from prefect.logging.handlers import APILogHandler

from flows.generate import generate_flow
from tasks.config import ApiConfig, GenerateConfig, RequestConfig, RunConfig, SourceConfig
from tasks.storage import read_table
from tests.reliability.secret_scan import scan_files, scan_prefect_api
from tests.support.faults import CannedServer

pytestmark = pytest.mark.slow
KEY_ENV = "DRAFTSMITH_SECRET_TEST_KEY"
SENTINEL = "sk-or-v1-SENTINEL-d41d8cd98f00b204e980"


def test_sentinel_key_is_sent_but_never_written(
    tmp_path, prefect_server, prefect_server_home, reliability_report, monkeypatch, caplog, capfd
):
    monkeypatch.setenv(KEY_ENV, SENTINEL)
    server = CannedServer().start()
    try:
        prompts = tmp_path / "prompts.jsonl"
        texts = ["hello", "what is 2 + 2?", "fault=echo401 a server that echoes the request", "name a colour"]
        prompts.write_text(
            "".join(json.dumps({"id": f"s{i}", "messages": [{"role": "user", "content": t}]}) + "\n" for i, t in enumerate(texts))
        )
        config = RunConfig(
            name="secrets",
            runs_dir=tmp_path / "runs",
            generate=GenerateConfig(
                sources=[SourceConfig(name="s", format="openai", path=str(prompts))],
                api=ApiConfig(base_url=server.base_url, provider="openrouter", api_key_env=KEY_ENV, concurrency=2),
                request=RequestConfig(max_tokens=16),
                max_error_rate=0.5,
            ),
        )
        with caplog.at_level(logging.DEBUG):
            state = generate_flow(config, return_state=True)
    finally:
        server.stop()
    assert state.is_completed(), state
    APILogHandler().flush()  # the run's logs are in the server's database before it is scanned
    run = {"flow_run_id": {"any_": [str(state.state_details.flow_run_id)]}}
    logs = httpx.post(f"{prefect_server}/logs/filter", json={"logs": run})
    assert logs.json(), "the scan would miss the run's logs"
    captured = capfd.readouterr()
    (tmp_path / "run.log").write_text(caplog.text + captured.out + captured.err)
    assert server.headers_seen and all(h == f"Bearer {SENTINEL}" for h in server.headers_seen)  # the key was really used

    found = scan_files([tmp_path, prefect_server_home], SENTINEL) + scan_prefect_api(prefect_server, SENTINEL)
    quarantine = read_table("quarantine", config.run_dir / "generations" / "quarantine.parquet").to_pylist()
    echoed = next(q for q in quarantine if q["id"] == "s:s2")
    redacted = "authorization: bearer ***" in echoed["detail"].lower()
    reliability_report.record(
        "secrets",
        "sentinel key via api_key_env (files, logs, Prefect DB, artifacts)",
        1,
        int(not found),
        secrets_found=len(found),
    )
    reliability_report.record(
        "secrets",
        "server echoes the Authorization header in an error",
        1,
        int(redacted and SENTINEL not in echoed["detail"]),
        secrets_found=int(SENTINEL in echoed["detail"]),
    )
    assert found == []
    assert echoed["reason"] == "http_401" and redacted, echoed["detail"]
