"""A provider failing about a fifth of requests in every way real ones do: nothing lost, nothing asked twice."""

import json

import pytest

from tasks.config import ApiConfig, GenerateConfig, RequestConfig, RunConfig, SourceConfig
from tasks.generate.journal import read_journal
from tasks.generate.stage import run_generate
from tasks.storage import read_table
from tests.support.faults import CannedServer

MAX_RETRIES = 3
# Each fault kind fails a row's first attempt; the retry gets the canned reply.
RECOVERABLE = ["429", "429ra", "408", "500", "502", "503", "timeout", "reset", "malformed", "truncated", "empty", "error200"]
EXHAUSTED = ["500", "503", "502", "500"]  # one more failure than the retries allow
PERMANENT = ["400"]
ROWS = 60


def prompts_file(path, plans: dict[int, list[str]], rows: int):
    lines = []
    for i in range(rows):
        text = f"question {i}" + (f" fault={','.join(plans[i])}" if i in plans else "")
        lines.append(json.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": text}]}))
    path.write_text("\n".join(lines) + "\n")
    return path


def hostile_config(tmp_path, server: CannedServer, prompts, concurrency: int = 8) -> RunConfig:
    return RunConfig(
        name="hostile",
        runs_dir=tmp_path / "runs",
        generate=GenerateConfig(
            sources=[SourceConfig(name="h", format="openai", path=str(prompts))],
            api=ApiConfig(
                base_url=server.base_url,
                provider="openrouter",
                api_key_env="DRAFTSMITH_HOSTILE_KEY",
                concurrency=concurrency,
                timeout_s=1.0,
                max_retries=MAX_RETRIES,
                backoff_base_s=0.01,
                backoff_max_s=0.05,
            ),
            request=RequestConfig(max_tokens=16),
            journal_batch=4,
        ),
    )


@pytest.fixture
def server():
    canned = CannedServer(latency_s=0.005, hang_s=5.0).start()
    yield canned
    canned.stop()


def test_every_row_done_once_or_quarantined_with_its_reason(tmp_path, server, monkeypatch, reliability_report):
    monkeypatch.setenv("DRAFTSMITH_HOSTILE_KEY", "sk-or-v1-hostile-sentinel")
    plans = {3 * k: [kind] for k, kind in enumerate(RECOVERABLE)}
    plans[50], plans[55] = EXHAUSTED, PERMANENT
    prompts = prompts_file(tmp_path / "prompts.jsonl", plans, ROWS)
    config = hostile_config(tmp_path, server, prompts)

    summary = run_generate(config)

    gen_dir = config.run_dir / "generations"
    done = {r["id"]: r for r in read_table("generations", gen_dir).to_pylist()}
    quarantine = {r["id"]: r for r in read_table("quarantine", gen_dir / "quarantine.parquet").to_pylist()}
    journal = read_journal(gen_dir / "journal.jsonl")
    requests = sum(server.requests.values())
    failed_requests = sum(min(server.requests[f"question {i} fault={','.join(p)}"], len(p)) for i, p in plans.items())
    for i, plan in plans.items():
        row_id = f"h:q{i}"
        reply = done.get(row_id)
        if plan in (EXHAUSTED, PERMANENT):
            survived = reply is None and row_id in quarantine and quarantine[row_id]["reason"] == f"http_{plan[-1]}"
        else:  # a fault must never end as a partial or empty reply taken for a real one
            survived = reply is not None and reply["content"] == "A canned reply." and reply["finish_reason"] == "stop"
        injected = min(server.requests[f"question {i} fault={','.join(plan)}"], len(plan))
        lost = int(reply is None and row_id not in quarantine)
        reliability_report.record("hostile API", "+".join(plan), injected, injected * survived, rows_lost=lost)

    lost = [f"h:q{i}" for i in range(ROWS) if f"h:q{i}" not in done and f"h:q{i}" not in quarantine]
    assert lost == []
    assert not set(done) & set(quarantine)
    assert journal.duplicate_lines == 0 and len(done) == ROWS - 2
    assert requests <= ROWS * (1 + MAX_RETRIES)
    assert 0.15 <= failed_requests / requests <= 0.3, (failed_requests, requests)
    for i, plan in plans.items():
        row_id = f"h:q{i}"
        if plan in (EXHAUSTED, PERMANENT):
            record = quarantine[row_id]
            assert record["reason"] == f"http_{plan[-1]}" and record["field"] == "reply", record
            assert ("retried on rerun" if plan == EXHAUSTED else "permanent") in record["detail"]
        else:
            assert done[row_id]["content"] == "A canned reply.", (plan, done[row_id])
            assert done[row_id]["finish_reason"] == "stop", (plan, done[row_id])
    assert summary["rows"] == ROWS - 2 and summary["failed"] == 2
    assert b"hostile-sentinel" not in (gen_dir / "journal.jsonl").read_bytes()


def test_out_of_credits_stops_cleanly_and_the_rerun_asks_only_for_the_rest(tmp_path, server, monkeypatch, reliability_report):
    monkeypatch.setenv("DRAFTSMITH_HOSTILE_KEY", "sk-or-v1-hostile-sentinel")
    rows, broke_at = 20, 7
    prompts = prompts_file(tmp_path / "prompts.jsonl", {broke_at: ["402"]}, rows)
    config = hostile_config(tmp_path, server, prompts, concurrency=1)  # one at a time: the stop point is exact

    first = run_generate(config)

    gen_dir = config.run_dir / "generations"
    assert first["stopped"] == "out_of_credits"
    assert first["rows"] == broke_at
    not_sent = read_table("quarantine", gen_dir / "quarantine.parquet").to_pylist()
    assert {r["id"] for r in not_sent} == {f"h:q{i}" for i in range(broke_at, rows)}
    assert all(r["reason"] == "not_sent" and "out_of_credits" in r["detail"] for r in not_sent)

    # Credits topped up: the server answers the row it refused, and the rerun sends only what is missing.
    second = run_generate(config)

    assert second["requested_this_run"] == rows - broke_at and second["stopped"] is None
    ids = read_table("generations", gen_dir).column("id").to_pylist()
    assert sorted(ids) == sorted(f"h:q{i}" for i in range(rows))
    asked_twice = [i for i in range(rows) if i != broke_at and server.requests[f"question {i}"] != 1]
    assert asked_twice == []
    reliability_report.record(
        "hostile API", "402 (stop, top up, rerun)", 1, int(len(ids) == rows and not asked_twice), rows_lost=rows - len(set(ids))
    )


def test_a_generation_broken_off_mid_stream_is_retried_not_kept(tmp_path, server, monkeypatch, reliability_report):
    monkeypatch.setenv("DRAFTSMITH_HOSTILE_KEY", "sk-or-v1-hostile-sentinel")
    prompts = prompts_file(tmp_path / "prompts.jsonl", {1: ["midstream"]}, 4)
    config = hostile_config(tmp_path, server, prompts)

    run_generate(config)

    rows = {r["id"]: r for r in read_table("generations", config.run_dir / "generations").to_pylist()}
    quarantine = read_table("quarantine", config.run_dir / "generations" / "quarantine.parquet").column("id").to_pylist()
    reply = rows.get("h:q1")
    survived = reply is not None and reply["content"] == "A canned reply." and reply["finish_reason"] == "stop"
    lost = int(reply is None and "h:q1" not in quarantine)
    reliability_report.record("hostile API", "midstream", 1, int(survived), rows_lost=lost)
    assert survived, reply
