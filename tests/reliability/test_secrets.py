"""Secrets: a sentinel key used for a real run appears nowhere (files, logs, Prefect database, artifacts)."""

import json

import pytest
import yaml

from tasks.config import ApiConfig, GenerateConfig, RequestConfig, RunConfig, SourceConfig
from tasks.storage import read_table
from tests.pipeline_runs import run_cli
from tests.reliability.secret_scan import scan_files, scan_prefect_api
from tests.support.faults import CannedServer

pytestmark = pytest.mark.slow
KEY_ENV = "DRAFTSMITH_SECRET_TEST_KEY"
SENTINEL = "sk-or-v1-SENTINEL-d41d8cd98f00b204e980"


def test_sentinel_key_is_sent_but_never_written(tmp_path, prefect_server, prefect_server_home, reliability_report):
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
        config_file = tmp_path / "secrets.yaml"
        config_file.write_text(yaml.safe_dump(config.model_dump(mode="json")))
        result = run_cli(
            ["run", "--config", str(config_file), "--stage", "generate"],
            api_url=prefect_server,
            env={KEY_ENV: SENTINEL},
            timeout=300,
        )
    finally:
        server.stop()
    (tmp_path / "cli.log").write_text(result.stdout + result.stderr)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
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
