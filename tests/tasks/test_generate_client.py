"""The client and stage against a fault-injecting local server: retries, quarantine, stops, secrets."""

import json
import logging
import time

import pyarrow.parquet as pq
import pytest

from tasks.config import ApiConfig, GenerateConfig, RequestConfig, RunConfig, SourceConfig
from tasks.generate.client import parse_retry_after, redact
from tasks.generate.journal import JournalWriter, read_journal
from tasks.generate.stage import run_generate
from tasks.storage import read_table
from tests.support.faults import CannedServer

FAULTS = ["429", "429ra,429ra", "500", "502", "503", "timeout", "reset", "malformed", "truncated", "empty", "500,timeout,reset"]


@pytest.fixture
def server():
    canned = CannedServer(hang_s=5).start()
    yield canned
    canned.stop()


def prompts_file(tmp_path, contents):
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        "".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": c}]}) + "\n" for i, c in enumerate(contents))
    )
    return path


def config_for(tmp_path, server, contents, **api):
    api = {
        "base_url": server.base_url,
        "provider": "openai",
        "api_key_env": None,
        "concurrency": 8,
        "timeout_s": 1.0,
        "max_retries": 3,
        "backoff_base_s": 0.01,
        "backoff_max_s": 2.0,
        **api,
    }
    return RunConfig(
        name="gen",
        runs_dir=tmp_path / "runs",
        generate=GenerateConfig(
            sources=[SourceConfig(name="t", format="openai", path=str(prompts_file(tmp_path, contents)))],
            api=ApiConfig(**api),
            request=RequestConfig(max_tokens=16),
            journal_batch=2,
        ),
    )


def outcome(config):
    gen = config.run_dir / "generations"
    done = read_table("generations", gen).column("id").to_pylist()
    quarantined = pq.read_table(gen / "quarantine.parquet").to_pylist()
    return done, {q["id"]: q for q in quarantined}


def test_every_fault_is_retried_until_done_or_quarantined_with_a_reason(tmp_path, server):
    contents = [f"fault={f} row {i}" for i, f in enumerate(FAULTS)] + ["fault=400 bad", "fault=500,500,500,500 gone", "plain"]
    config = config_for(tmp_path, server, contents)
    summary = run_generate(config)
    done, quarantined = outcome(config)
    ids = [f"t:p{i}" for i in range(len(contents))]
    assert sorted(done + list(quarantined)) == sorted(ids)  # each id exactly once, one way or the other
    assert len(done) == len(set(done)) == len(FAULTS) + 1
    assert quarantined["t:p11"]["reason"] == "http_400" and "injected 400" in quarantined["t:p11"]["detail"]
    assert quarantined["t:p12"]["reason"] == "http_500" and "4 attempt(s)" in quarantined["t:p12"]["detail"]
    for i, fault in enumerate(FAULTS):  # n injected faults -> n + 1 requests, then a reply
        assert server.requests[contents[i]] == len(fault.split(",")) + 1, fault
    assert server.requests["fault=400 bad"] == 1  # permanent: never retried
    assert server.requests["fault=500,500,500,500 gone"] == 4
    assert summary["rows"] == len(FAULTS) + 1 and summary["failed"] == 2
    report = json.loads((config.run_dir / "generations" / "summary.json").read_text())
    assert report["errors_by_kind"] == {"http_400": 1, "http_500": 1}
    assert report["by_finish_reason"] == {"stop": len(FAULTS) + 1}
    assert report["latency_p50_s"] is not None and report["cost_usd"] == pytest.approx(0.0001 * (len(FAULTS) + 1))


def test_rerun_retries_exhausted_failures_but_never_permanent_ones_or_finished_rows(tmp_path, server):
    config = config_for(tmp_path, server, ["fault=500,500 flaky", "fault=400 bad", "fine"], max_retries=1)
    run_generate(config)
    assert outcome(config)[0] == ["t:p2"]
    second = run_generate(config)
    done, quarantined = outcome(config)
    assert sorted(done) == ["t:p0", "t:p2"] and list(quarantined) == ["t:p1"]
    assert second["requested_this_run"] == 1
    assert server.requests["fine"] == 1 and server.requests["fault=400 bad"] == 1
    assert server.requests["fault=500,500 flaky"] == 3


def test_retry_after_is_honoured(tmp_path, server):
    config = config_for(tmp_path, server, ["fault=429ra wait"], backoff_max_s=5.0)
    started = time.monotonic()
    run_generate(config)
    assert time.monotonic() - started >= 1.0  # the server said Retry-After: 1; backoff alone is ~10 ms
    assert parse_retry_after("2.5") == 2.5 and parse_retry_after(None) is None
    assert 0 <= parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") < 1


def test_402_stops_cleanly_and_a_rerun_finishes_without_repeating(tmp_path, server):
    contents = ["one", "two", "fault=402 broke", "four", "five"]
    config = config_for(tmp_path, server, contents, concurrency=1)
    summary = run_generate(config)
    done, quarantined = outcome(config)
    assert summary["stopped"] == "out_of_credits"
    assert done == ["t:p0", "t:p1"]
    assert {quarantined[f"t:p{i}"]["reason"] for i in (2, 3, 4)} == {"not_sent"}
    assert len(read_journal(config.run_dir / "generations" / "journal.jsonl").done) == 2
    run_generate(config)
    done, quarantined = outcome(config)
    assert done == [f"t:p{i}" for i in range(5)] and not quarantined
    assert [server.requests[c] for c in contents] == [1, 1, 2, 1, 1]


def test_budget_stops_the_run_with_everything_finished_journaled(tmp_path, server):
    config = config_for(tmp_path, server, [f"row {i}" for i in range(10)], concurrency=1)
    config.generate.budget_usd = 0.00025  # canned replies cost $0.0001 each
    summary = run_generate(config)
    assert summary["stopped"] == "budget" and summary["rows"] == 3
    assert sum(server.requests.values()) == 3
    again = run_generate(config)  # the budget counts what earlier runs spent
    assert again["stopped"] == "budget" and sum(server.requests.values()) == 3


def test_sentinel_api_key_reaches_no_file_and_no_log(tmp_path, server, monkeypatch, caplog, capfd):
    sentinel = "sk-or-v1-SENTINEL0123456789abcdef"
    monkeypatch.setenv("DRAFTSMITH_TEST_KEY", sentinel)
    config = config_for(tmp_path, server, ["fault=echo401 leak", "fault=500 retry", "fine"], api_key_env="DRAFTSMITH_TEST_KEY")
    with caplog.at_level(logging.DEBUG):
        run_generate(config)
    assert server.headers_seen and all(h == f"Bearer {sentinel}" for h in server.headers_seen)
    _, quarantined = outcome(config)
    assert "***" in quarantined["t:p0"]["detail"]  # the echoed header was redacted, not dropped
    files = [p for p in config.run_dir.rglob("*") if p.is_file()]
    assert len(files) >= 4
    for path in files:
        assert sentinel.encode() not in path.read_bytes(), path
    captured = capfd.readouterr()
    assert sentinel not in caplog.text + captured.out + captured.err


def test_missing_key_names_the_variable_not_a_value(tmp_path, server, monkeypatch):
    from tasks.generate.stage import MissingApiKeyError

    monkeypatch.delenv("DRAFTSMITH_ABSENT_KEY", raising=False)
    config = config_for(tmp_path, server, ["x"], api_key_env="DRAFTSMITH_ABSENT_KEY", provider="openrouter")
    with pytest.raises(MissingApiKeyError, match="DRAFTSMITH_ABSENT_KEY"):
        run_generate(config)


def test_the_key_check_before_a_run_asks_only_when_generate_would_request(tmp_path, server, monkeypatch):
    from tasks.generate.stage import MissingApiKeyError, check_api_key
    from tasks.stage_record import save_record

    monkeypatch.delenv("DRAFTSMITH_ABSENT_KEY", raising=False)
    config = config_for(tmp_path, server, ["x"], api_key_env="DRAFTSMITH_ABSENT_KEY", provider="openrouter")
    with pytest.raises(MissingApiKeyError, match="export DRAFTSMITH_ABSENT_KEY="):
        check_api_key(config)
    save_record(config, "generate", {"rows": 1}, time.time())  # an up-to-date generate stage requests nothing
    check_api_key(config)
    with pytest.raises(MissingApiKeyError, match="api_key_secret_block"):
        check_api_key(config, force=True)
    config.generate.api = ApiConfig(provider="embedded", api_key_env="DRAFTSMITH_ABSENT_KEY")  # the local server needs none
    check_api_key(config, force=True)
    monkeypatch.setenv("DRAFTSMITH_ABSENT_KEY", "k")
    config.generate.api = ApiConfig(provider="openrouter", api_key_env="DRAFTSMITH_ABSENT_KEY")
    check_api_key(config, force=True)


def test_redact_removes_bearer_values_and_the_key():
    text = redact('{"Authorization": "Bearer abc.def"} key=s3cret', "s3cret")
    assert "abc.def" not in text and "s3cret" not in text


def test_journal_drops_a_torn_last_line_and_appends_cleanly(tmp_path):
    path = tmp_path / "journal.jsonl"
    with JournalWriter(path, batch=1) as journal:
        journal.append({"status": "done", "id": "a"})
        journal.append({"status": "done", "id": "b"})
    with open(path, "ab") as f:
        f.write(b'{"status": "done", "id": "c", "cont')  # killed mid-write
    state = read_journal(path, repair=True)
    assert set(state.done) == {"a", "b"} and state.torn_lines == 1
    with JournalWriter(path, batch=1) as journal:
        journal.append({"status": "done", "id": "c"})
    state = read_journal(path)
    assert set(state.done) == {"a", "b", "c"} and state.torn_lines == 0


def test_provider_options_are_passed_where_the_server_reads_them():
    from tasks.generate.client import ChatClient, static_body

    request = RequestConfig(
        reasoning={"effort": "high"},
        provider_routing={"order": ["a"], "quantizations": ["fp8"], "require_parameters": True},
        return_token_ids=True,
        logprobs=True,
        top_logprobs=2,
        chat_template_kwargs={"enable_thinking": True},
        extra_body={"min_p": 0.05},
    )
    routed = static_body(ApiConfig(provider="openrouter"), request, "m")
    assert routed["reasoning"] == {"effort": "high"} and routed["provider"]["quantizations"] == ["fp8"]
    assert routed["usage"] == {"include": True} and "return_token_ids" not in routed and routed["min_p"] == 0.05
    served = static_body(ApiConfig(provider="vllm"), request, "m")
    assert served["return_token_ids"] and served["chat_template_kwargs"] == {"enable_thinking": True}
    assert served["logprobs"] and served["top_logprobs"] == 2 and "provider" not in served
    # Engines that would space the text around added tokens are asked not to; OpenRouter is not sent the field.
    assert served["spaces_between_special_tokens"] is False and "spaces_between_special_tokens" not in routed
    client = ChatClient(ApiConfig(provider="vllm"), request, "m", None, "http://127.0.0.1:1/v1")
    prompt = {"id": "s:1", "messages": '[{"role": "user", "content": "hi"}]', "tools": "[]"}
    body = json.loads(client.body(prompt))
    assert body["messages"][0]["content"] == "hi" and body["tools"] == []
    assert json.loads(client.body(prompt))["seed"] == body["seed"]  # a fixed seed per request id


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"content": "A", "reasoning": "R"}, ("R", "text")),
        ({"content": "A", "reasoning_content": "R"}, ("R", "text")),
        (
            {
                "content": "A",
                "reasoning": "R",
                "reasoning_details": [{"type": "reasoning.text", "text": "R1"}, {"type": "reasoning.text", "text": "R2"}],
            },
            ("R1R2", "text"),
        ),
        # a summary is the provider's paraphrase, not the model's text: kept as its kind, no text
        (
            {"content": "A", "reasoning": "S", "reasoning_details": [{"type": "reasoning.summary", "summary": "S"}]},
            (None, "summary"),
        ),
        ({"content": "A", "reasoning_details": [{"type": "reasoning.encrypted", "data": "x9"}]}, (None, "encrypted")),
        ({"content": "A"}, (None, None)),
    ],
)
def test_only_verbatim_reasoning_is_taken_as_generated_text(message, expected):
    from tasks.generate.client import reply_reasoning, reply_record

    assert reply_reasoning(message) == expected
    data = {"choices": [{"message": message, "finish_reason": "stop"}], "usage": {}}
    prompt = {"id": "p", "source": "s", "messages": "[]", "tools": None}
    record = reply_record(prompt, data, 0.1, "openrouter", {"thinking": True})
    assert (record["reasoning"], record["reasoning_kind"]) == expected
    assert json.loads(record["template_kwargs"]) == {"thinking": True}


def test_progress_lines_come_at_a_steady_cadence_with_rates_eta_and_cost(caplog):
    """Between replies too: a line says how far generation is and what it is waiting on."""
    import asyncio
    import logging

    from tasks.generate.progress import GenerationProgress

    progress = GenerationProgress(10, key="progress-test", concurrency=4)

    async def replies() -> None:
        ticker = asyncio.create_task(progress.log_every(0.05))
        for n in range(3):
            done = {"status": "done", "cost": 0.001, "completion_tokens": 20, "server_queue_s": 2.0 * n}
            progress.update(done if n else {"status": "failed"})
        await asyncio.sleep(0.18)  # no reply for a while: the lines keep coming
        ticker.cancel()

    with caplog.at_level(logging.INFO, logger="tasks.generate.progress"), progress:
        asyncio.run(replies())
    lines = [r.getMessage() for r in caplog.records if r.name == "tasks.generate.progress"]
    assert len(lines) >= 3
    assert all(line.startswith("generate: 3/10 rows (1 failed), ") for line in lines)
    assert "rows/s, ETA " in lines[-1] and "tokens/s, $0.0020 so far; awaiting 4 replies" in lines[-1]
    assert lines[-1].endswith("the last 2 waited 3.0 s (median) in the server's queue")


def test_every_reply_field_reaches_the_generations_table():
    """A reply as vLLM shapes it (`--enable-per-request-metrics`, token ids, logprobs): every contract column is
    filled from it and kept from journal record to table row, the server's timing split included."""
    from tasks.contracts import schema
    from tasks.generate.client import reply_record
    from tasks.generate.stage import output_row

    message = {"role": "assistant", "content": "A", "reasoning": "R"}
    logprobs = {"content": [{"token": "A", "bytes": [65], "logprob": -0.1}]}
    data = {
        "created": 1796040000,
        "model": "m",
        "choices": [{"message": message, "finish_reason": "stop", "token_ids": [5, 2], "logprobs": logprobs}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
        "prompt_token_ids": [1, 2, 3],
        "metrics": {"queue_time_ms": 1500.0, "time_to_first_token_ms": 20.0, "generation_time_ms": 480.0, "mean_itl_ms": 9.0},
    }
    prompt = {"id": "p", "source": "s", "messages": "[]", "tools": None}
    record = reply_record(prompt, data, 2.25, "vllm", {"enable_thinking": False})
    row = output_row(record)
    assert set(row) == set(schema("generations").names) <= set(record)
    assert {k: v for k, v in row.items() if k != "logprob_tokens"} == {k: record[k] for k in row if k != "logprob_tokens"}
    assert (row["latency_s"], row["server_queue_s"], row["server_s"]) == (2.25, 1.5, 0.5)
    assert (row["created"], row["reasoning_kind"], row["template_kwargs"]) == (1796040000, "text", '{"enable_thinking": false}')
    assert reply_record(prompt, {**data, "metrics": None}, 2.25, "openrouter")["server_s"] is None


def test_a_thinking_reply_cut_inside_its_reasoning_is_a_reply():
    """Reasoning text the model generated is a reply even with no content (max_tokens reached before </think>); a
    summary of the reasoning, or nothing at all, is not."""
    from tasks.generate.client import has_reply

    cut = {"content": None, "tool_calls": None, "reasoning": "Let me think", "reasoning_kind": "text", "finish_reason": "length"}
    assert has_reply(cut)
    assert not has_reply(cut | {"reasoning_kind": "summary"})
    assert not has_reply(cut | {"reasoning": "  "})
    assert has_reply({"content": "Hi", "reasoning": None}) and has_reply({"content": "", "tool_calls": "[{}]"})


def test_a_vllm_server_started_for_the_run_is_spoken_to_as_vllm():
    from pydantic import ValidationError

    assert ApiConfig(base_url="vllm", provider="vllm", api_key_env=None).base_url == "vllm"
    with pytest.raises(ValidationError, match="base_url vllm starts a vLLM server: provider must be vllm, not openrouter"):
        ApiConfig(base_url="vllm")


def test_a_reply_without_usage_cost_is_priced_at_the_configured_rate():
    from tasks.config import TokenPrice
    from tasks.generate.client import priced

    price = TokenPrice(input=0.6, output=2.5)
    usage = {"prompt_tokens": 1000, "completion_tokens": 200}
    assert priced(usage, price) == pytest.approx((1000 * 0.6 + 200 * 2.5) / 1e6)
    assert priced(usage | {"cost": 0.01}, price) == 0.01  # the provider's own figure wins
    assert priced(usage, None) is None


def test_the_budget_stops_a_server_that_reports_no_cost_at_its_price(tmp_path):
    """vLLM-like replies with token counts and no usage.cost: priced, they spend the budget and stop the run."""

    def counted(request: dict) -> dict:
        message = {"role": "assistant", "content": "A counted reply."}
        choice = {"index": 0, "finish_reason": "stop", "message": message}
        return {"choices": [choice], "usage": {"prompt_tokens": 100_000, "completion_tokens": 100_000}}

    canned = CannedServer(reply=counted).start()
    try:
        config = config_for(tmp_path, canned, [f"q{i}" for i in range(20)], concurrency=1)
        generate = config.generate.model_dump() | {"price_per_million": {"input": 1.0, "output": 1.0}, "budget_usd": 0.5}
        summary = run_generate(RunConfig.model_validate(config.model_dump() | {"generate": generate}))
    finally:
        canned.stop()
    assert summary["stopped"] == "budget" and summary["rows"] == 3  # 0.2 USD a reply: the third passes 0.5


def test_retry_failed_asks_again_only_the_named_kinds(tmp_path, server):
    """Failures for good stay settled; `retry_failed` sends those of its kinds again, never a finished reply."""
    contents = ["fault=400 misconfigured", "fault=404 gone", "plain"]
    config = config_for(tmp_path, server, contents)
    run_generate(config)
    run_generate(config)  # nothing to ask: one reply, two failures for good
    assert [server.requests[c] for c in contents] == [1, 1, 1]
    generate = config.generate.model_dump() | {"retry_failed": ["http_400"]}
    summary = run_generate(RunConfig.model_validate(config.model_dump() | {"generate": generate}))
    done, quarantined = outcome(config)
    assert [server.requests[c] for c in contents] == [2, 1, 1] and summary["requested_this_run"] == 1
    assert sorted(done) == ["t:p0", "t:p2"] and quarantined["t:p1"]["reason"] == "http_404"


def test_a_403_about_the_balance_stops_like_a_402(tmp_path, server):
    """Moonshot's empty balance: the run stops cleanly, nothing journaled for it, and a rerun asks again; a 403 about
    anything else is a failure for good."""
    config = config_for(tmp_path, server, ["plain", "fault=403balance broke", "fault=403 forbidden"], concurrency=1)
    summary = run_generate(config)
    done, quarantined = outcome(config)
    assert summary["stopped"] == "out_of_credits" and done == ["t:p0"] and quarantined["t:p1"]["reason"] == "not_sent"
    assert "t:p1" not in read_journal(config.run_dir / "generations" / "journal.jsonl").failed
    run_generate(config)
    done, quarantined = outcome(config)
    assert sorted(done) == ["t:p0", "t:p1"] and quarantined["t:p2"]["reason"] == "http_403"
