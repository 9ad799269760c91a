"""Crash and resume: SIGKILL inside every stage, rerun, and the outputs match an uninterrupted run."""

import json
import signal

import pytest

from tasks.generate.journal import read_journal
from tasks.storage import read_table
from tests.reliability.crash_chain import CHAIN, JOURNAL_BATCH, ROWS, SENTINEL, numeric_mismatches, output_digests
from tests.reliability.secret_scan import scan_files, scan_prefect_api

pytestmark = pytest.mark.slow

# Hand-off tables and the columns that identify a row in each (validation has a check and a simulate row per id).
ID_TABLES = [
    ("generations", "generations", ["id"]),
    ("reconstructed", "reconstructed", ["id"]),
    ("validation", "validation", ["id", "mode"]),
    ("merged", "merged/train", ["id"]),
    ("merged", "merged/eval", ["id"]),
    ("hidden_index", "hidden_states/index.parquet", ["id"]),
]


def test_each_run_dies_by_sigkill_inside_its_stage(crash_runs, reliability_report):
    order = [stage for stage, _ in CHAIN]
    for n, run in enumerate(crash_runs.killed):
        inside = run.returncode == -signal.SIGKILL and run.finished_before == order[:n]
        reliability_report.record("crash and resume", f"SIGKILL in {run.stage}", 1, int(inside))
        assert inside, (run.stage, run.returncode, run.finished_before)
    assert 1 <= crash_runs.killed[0].journal_lines <= JOURNAL_BATCH  # killed right after its first fsync
    assert crash_runs.final_rc == 0 and crash_runs.clean_rc == 0


def test_the_uninterrupted_run_spread_its_shards_over_dask_on_one_cluster(crash_runs):
    """Its three sharded stages ran on one local cluster, started once for the run (not once per stage)."""
    log = crash_runs.logs[0].read_text()  # the log of the uninterrupted run
    assert log.count("distributed.scheduler - State start") == 1 and log.count("Register worker") == 1, log[-3000:]


def test_resumed_outputs_match_the_uninterrupted_run(crash_runs):
    """Killed and resumed on threads, the outputs are those of the run on Dask: data byte for byte, the draft to a
    tolerance (training in two processes agrees to ~1e-8 in fp32, not bit for bit)."""
    clean = output_digests(crash_runs.clean_dir, crash_runs.runs_dir_names[0])
    resumed = output_digests(crash_runs.resumed_dir, crash_runs.runs_dir_names[1])
    assert sorted(resumed) == sorted(clean)
    assert [path for path in clean if clean[path] != resumed[path]] == []
    assert [m for m in numeric_mismatches(crash_runs.clean_dir, crash_runs.resumed_dir) if not token_counter(m)] == []


def token_counter(mismatch: str) -> bool:
    return mismatch.startswith("draft/metrics.jsonl") and ".tokens:" in mismatch


def test_resumed_training_metrics_keep_counting_tokens(crash_runs):
    assert [m for m in numeric_mismatches(crash_runs.clean_dir, crash_runs.resumed_dir) if token_counter(m)] == []


def test_no_row_duplicated_and_no_journaled_reply_requested_again(crash_runs, reliability_report):
    run_dir = crash_runs.resumed_dir
    for contract, relative, key in ID_TABLES:
        table = read_table(contract, run_dir / relative, columns=key)
        keys = list(zip(*(table.column(c).to_pylist() for c in key), strict=True))
        assert keys and len(keys) == len(set(keys)), relative
    lost = ROWS - read_table("generations", run_dir / "generations", columns=["id"]).num_rows
    journal = read_journal(run_dir / "generations" / "journal.jsonl")
    summary = json.loads((run_dir / "generations" / "summary.json").read_text())
    # The server saw each prompt once over all eight runs; the resumed generate asked only for the rest.
    asked_twice = {prompt: n for prompt, n in crash_runs.requests.items() if n != 1}
    journaled_before = crash_runs.killed[0].journal_lines
    reliability_report.record(
        "crash and resume",
        "journaled replies not asked again",
        journaled_before,
        journaled_before - len(asked_twice),
        rows_lost=lost,
    )
    assert asked_twice == {} and sum(crash_runs.requests.values()) == ROWS
    assert summary["from_journal"] == journaled_before and summary["requested_this_run"] == ROWS - journaled_before
    assert len(journal.done) == ROWS and journal.duplicate_lines == 0 and journal.torn_lines == 0
    assert lost == 0


def test_no_secret_in_any_file_log_or_artifact(crash_runs, prefect_server, prefect_server_home, reliability_report):
    files = [crash_runs.clean_dir.parent, crash_runs.resumed_dir.parent, prefect_server_home, *crash_runs.logs]
    found = scan_files(files, SENTINEL) + scan_prefect_api(prefect_server, SENTINEL)
    reliability_report.record(
        "secrets",
        "sentinel key through the whole pipeline (files, logs, Prefect DB, artifacts)",
        1,
        int(not found),
        secrets_found=len(found),
    )
    assert found == []
