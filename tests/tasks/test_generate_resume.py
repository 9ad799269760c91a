"""Kill -9 mid-run, rerun: no journaled id is asked for again and no row is duplicated."""

import json
import os
import signal
import subprocess
import sys
import time

import yaml

from tasks.config import ApiConfig, GenerateConfig, RequestConfig, RunConfig, SourceConfig
from tasks.generate.journal import read_journal
from tasks.generate.stage import run_generate
from tasks.prefect_env import PROJECT_ROOT
from tasks.storage import read_table
from tests.support.faults import CannedServer

ROWS = 60


def test_sigkill_mid_run_then_rerun_never_repeats_a_journaled_request(tmp_path):
    server = CannedServer(latency_s=0.15).start()
    try:
        prompts = tmp_path / "prompts.jsonl"
        prompts.write_text(
            "".join(
                json.dumps({"id": f"r{i}", "messages": [{"role": "user", "content": f"row {i}"}]}) + "\n" for i in range(ROWS)
            )
        )
        config = RunConfig(
            name="kill",
            runs_dir=tmp_path / "runs",
            generate=GenerateConfig(
                sources=[SourceConfig(name="k", format="openai", path=str(prompts))],
                api=ApiConfig(base_url=server.base_url, provider="openai", api_key_env=None, concurrency=4),
                request=RequestConfig(max_tokens=16),
                journal_batch=2,
            ),
        )
        config_file = tmp_path / "config.yaml"
        config_file.write_text(yaml.safe_dump(config.model_dump(mode="json")))
        journal = config.run_dir / "generations" / "journal.jsonl"
        code = (
            "import tasks; from tasks.config import load_config; from tasks.generate.stage import run_generate; "
            f"run_generate(load_config({str(config_file)!r}))"
        )
        child = subprocess.Popen(
            [sys.executable, "-c", code], cwd=PROJECT_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and child.poll() is None:
            if journal.exists() and journal.read_bytes().count(b"\n") >= 12:
                break
            time.sleep(0.02)
        assert child.poll() is None, "the run finished before it could be killed"
        os.kill(child.pid, signal.SIGKILL)
        child.wait()

        first = read_journal(journal)
        assert 12 <= len(first.done) < ROWS
        asked_before = dict(server.requests)

        summary = run_generate(config)
        ids = read_table("generations", config.run_dir / "generations").column("id").to_pylist()
        assert sorted(ids) == sorted(f"k:r{i}" for i in range(ROWS)) and len(ids) == len(set(ids))
        assert summary["requested_this_run"] == ROWS - len(first.done)
        for row_id in first.done:  # journaled before the kill: never asked for again
            assert server.requests[f"row {row_id.split(':r')[1]}"] == 1, row_id
        # Only requests in flight at the kill (at most the concurrency plus one unsynced batch) repeat.
        repeated = [c for c, n in server.requests.items() if n > 1]
        assert len(repeated) <= 4 + 2 and all(asked_before.get(c) == 1 for c in repeated)
        final = read_journal(journal)
        assert final.duplicate_lines == 0 and len(final.done) == ROWS
    finally:
        server.stop()
