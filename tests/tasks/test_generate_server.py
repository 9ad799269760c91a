"""The embedded target server with SmolLM2: template, ground-truth ids and bytes, batching, the stage over it."""

import asyncio
import json
import os

import httpx
import pytest

from tasks.config import ApiConfig, EmbeddedServerConfig, GenerateConfig, RequestConfig, RunConfig, SourceConfig
from tasks.generate.stage import run_generate
from tasks.storage import read_table
from tasks.target_model.formats import QWEN3
from tasks.target_model.serve.embedded import embedded_server
from tasks.target_model.tokens import codec

MAX_TOKENS = 16


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One embedded server for the module; it must be gone once the context exits."""
    config = RunConfig(
        generate=GenerateConfig(api=ApiConfig(provider="embedded", base_url="embedded"), embedded=EmbeddedServerConfig(threads=1))
    )
    with embedded_server(config, tmp_path_factory.mktemp("server")) as base_url:
        pid = httpx.get(base_url.replace("/v1", "/health")).json()["pid"]
        yield base_url
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def chat(base_url, messages, **options):
    body = {
        "model": "smol",
        "messages": messages,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "return_token_ids": True,
        "logprobs": True,
        **options,
    }
    return httpx.post(f"{base_url}/chat/completions", json=body, timeout=300)


def test_reply_carries_exact_prompt_ids_generated_ids_and_true_bytes(served, demo_tokenizer):
    messages = [{"role": "user", "content": "Say hello in French."}]
    reply = chat(served, messages).json()
    choice = reply["choices"][0]
    prompt_ids = demo_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert reply["prompt_token_ids"] == demo_tokenizer.encode(prompt_ids, add_special_tokens=False)
    ids = choice["token_ids"]
    assert len(ids) == reply["usage"]["completion_tokens"] and reply["usage"]["cost"] == 0.0
    ended = choice["finish_reason"] == "stop"
    assert ended == (ids[-1] == demo_tokenizer.convert_tokens_to_ids("<|im_end|>"))
    content_ids = ids[:-1] if ended else ids
    assert choice["message"]["content"] == demo_tokenizer.decode(content_ids, skip_special_tokens=True)
    assert demo_tokenizer.decode(reply["prompt_token_ids"] + ids).startswith(prompt_ids)
    entries = choice["logprobs"]["content"]
    assert len(entries) == len(ids) and all(e["logprob"] <= 0 for e in entries)
    assert b"".join(bytes(e["bytes"]) for e in entries).decode("utf-8") == demo_tokenizer.decode(ids)


def test_token_bytes_are_partial_for_pieces_of_a_multibyte_character(demo_tokenizer):
    tokens = codec(demo_tokenizer)
    ids = demo_tokenizer.encode("🦜", add_special_tokens=False)
    pieces = [tokens.bytes_of(i) for i in ids]
    assert len(ids) > 1 and b"".join(pieces) == "🦜".encode()
    assert any(_invalid_utf8(p) for p in pieces)
    assert tokens.bytes_of(demo_tokenizer.convert_tokens_to_ids("<|im_end|>")) == b"<|im_end|>"


def _invalid_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def test_seed_and_sampling_options_are_honoured(served):
    async def ask(messages, **options):
        body = {"model": "smol", "messages": messages, "max_tokens": 8, "temperature": 0, "return_token_ids": True, **options}
        async with httpx.AsyncClient(timeout=300) as client:
            return (await client.post(f"{served}/chat/completions", json=body)).json()["choices"][0]

    async def together():
        colour = [{"role": "user", "content": "Name a colour."}]
        return await asyncio.gather(
            ask(colour, temperature=0.9, top_p=0.9, seed=7),
            ask(colour, temperature=0.9, top_p=0.9, seed=7),
            ask([{"role": "user", "content": "Count from one to fifty in words."}], max_tokens=3),
            ask([{"role": "user", "content": "Count from one to ten in words, comma separated."}], stop=[","], max_tokens=12),
        )

    first, again, short, stopped = asyncio.run(together())
    assert first["token_ids"] == again["token_ids"]
    assert short["finish_reason"] == "length" and len(short["token_ids"]) == 3
    assert "," not in stopped["message"]["content"]


def test_concurrent_requests_share_forward_passes(served):
    before = httpx.get(served.replace("/v1", "/health")).json()

    async def burst():
        async with httpx.AsyncClient(timeout=300) as client:
            body = {"model": "smol", "max_tokens": 8, "temperature": 0.7}
            return await asyncio.gather(
                *(
                    client.post(
                        f"{served}/chat/completions",
                        json={**body, "seed": i, "messages": [{"role": "user", "content": f"Tell me fact {i}."}]},
                    )
                    for i in range(6)
                )
            )

    replies = asyncio.run(burst())
    assert all(r.status_code == 200 for r in replies)
    after = httpx.get(served.replace("/v1", "/health")).json()
    rows, batches = after["rows"] - before["rows"], after["batches"] - before["batches"]
    assert rows == 6 and batches < rows


def test_bad_requests_get_400_with_the_reason(served):
    reply = httpx.post(f"{served}/chat/completions", json={"messages": "nope"}, timeout=30)
    assert reply.status_code == 400 and "messages" in reply.json()["error"]["message"]


def test_a_reply_is_split_into_reasoning_and_tool_calls_by_its_format():
    text = '<think>\nweigh it\n</think>\n\nCalling.\n<tool_call>\n{"name": "f", "arguments": {"x":  1}}\n</tool_call>'
    reply = QWEN3.parse(text, "<|im_start|>assistant\n")
    assert reply.reasoning == "weigh it" and reply.content == "Calling."
    assert reply.tool_calls[0].as_openai()["function"] == {"name": "f", "arguments": '{"x":  1}'}  # bytes kept


def test_stage_over_the_embedded_server_stores_ground_truth(served, tmp_path, demo_tokenizer):
    prompts = tmp_path / "p.jsonl"
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    prompts.write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in [
                {"id": "a", "messages": [{"role": "user", "content": "What is 2+2?"}]},
                {
                    "id": "b",
                    "messages": [
                        {"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "hello"},
                        {"role": "user", "content": "Write a short poem about rain."},
                    ],
                },
                {"id": "c", "messages": [{"role": "user", "content": "What time is it?"}], "tools": tools},
            ]
        )
    )
    config = RunConfig(
        name="emb",
        runs_dir=tmp_path,
        generate=GenerateConfig(
            sources=[SourceConfig(name="t", format="openai", path=str(prompts))],
            api=ApiConfig(base_url=served, provider="vllm", api_key_env=None, concurrency=4),
            request=RequestConfig(max_tokens=MAX_TOKENS, temperature=0.7, return_token_ids=True, logprobs=True),
        ),
    )
    summary = run_generate(config)
    assert summary["rows"] == 3 and summary["failed"] == 0
    rows = read_table("generations", tmp_path / "emb" / "generations").to_pylist()
    tokens = codec(demo_tokenizer)
    for row in rows:
        ids = row["token_ids"]
        ended = ids[-1] == demo_tokenizer.eos_token_id
        assert row["content"] == demo_tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=True)
        assert row["truncated"] == (row["finish_reason"] == "length") and row["provider"] == "embedded"
        rendered = demo_tokenizer.decode(row["prompt_token_ids"] + ids)
        assert json.loads(row["messages"])[-1]["content"] in rendered
        assert [e["bytes"] for e in row["logprob_tokens"]] == [tokens.bytes_of(i) for i in ids]
    assert json.loads(next(r for r in rows if r["id"] == "t:c")["tools"]) == tools
    for row in rows:  # the server's own split of the round trip, and the reply's date, reach the table
        assert row["server_s"] > 0 and row["server_queue_s"] >= 0 and row["created"] > 1.7e9
        assert row["server_queue_s"] + row["server_s"] <= row["latency_s"] + 0.01
    report = json.loads((tmp_path / "emb" / "generations" / "summary.json").read_text())
    assert report["server_timed_rows"] == 3 and report["server_p50_s"] <= report["latency_p50_s"]


def test_a_conversation_regenerated_turn_by_turn_sends_the_targets_own_replies(served, tmp_path, demo_tokenizer):
    """Checked where the target reads it: turn 2's prompt ids, as the server tokenized them, hold turn 1's generated
    ids (its end-of-turn token included) and not the dataset's reply."""
    prompts = tmp_path / "c.jsonl"
    turns = [
        {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": "DATASET-REPLY-ONE"},
        {"role": "user", "content": "And a vegetable?"},
        {"role": "assistant", "content": "DATASET-REPLY-TWO"},
    ]
    prompts.write_text(json.dumps({"id": "conv", "messages": turns}) + "\n")
    config = RunConfig(
        name="turns",
        runs_dir=tmp_path,
        generate=GenerateConfig(
            sources=[SourceConfig(name="t", format="openai", path=str(prompts), regenerate="each_turn")],
            api=ApiConfig(base_url=served, provider="vllm", api_key_env=None, concurrency=2),
            request=RequestConfig(max_tokens=MAX_TOKENS, temperature=0, return_token_ids=True),
        ),
    )
    summary = run_generate(config)
    rows = {r["id"]: r for r in read_table("generations", tmp_path / "turns" / "generations").to_pylist()}
    first, second = rows["t:conv#t1"], rows["t:conv#t2"]
    assert summary["rows"] == 2 and json.loads(second["messages"])[1]["content"] == first["content"]
    replied = first["token_ids"] if first["finish_reason"] == "stop" else first["token_ids"] + [demo_tokenizer.eos_token_id]
    sent = second["prompt_token_ids"]
    assert any(sent[i : i + len(replied)] == replied for i in range(len(sent))), "turn 1's ids are not in turn 2's prompt"
    assert "DATASET-REPLY" not in demo_tokenizer.decode(sent)


def test_a_request_joining_a_running_batch_decodes_as_it_would_alone(demo_model, demo_tokenizer):
    import threading

    import torch

    from tasks.target_model.serve.engine import BatchEngine, GenRequest

    torch.set_num_threads(1)
    engine = BatchEngine(demo_model, demo_tokenizer, {demo_tokenizer.eos_token_id}, max_batch=4)

    def ids_of(text):
        rendered = demo_tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        return demo_tokenizer.encode(rendered, add_special_tokens=False)

    def submit(text, max_tokens):
        done, box = threading.Event(), {}
        engine.submit(GenRequest(ids_of(text), max_tokens, temperature=0, on_done=lambda r: (box.setdefault("r", r), done.set())))
        return done, box

    alone_done, alone = submit("Name three rivers in Europe.", 8)
    alone_done.wait(300)
    long_done, _ = submit("Write a long story about a lighthouse keeper and the sea.", 24)
    while engine.batches < 2:  # wait until the long request is decoding
        threading.Event().wait(0.01)
    threading.Event().wait(0.5)
    joined_done, joined = submit("Name three rivers in Europe.", 8)
    joined_done.wait(300)
    assert not long_done.is_set()  # the newcomer finished while the long request was still decoding
    long_done.wait(300)
    assert engine.batches == 3  # the newcomer was prefilled on its own, then merged into the running batch
    assert joined["r"].token_ids == alone["r"].token_ids


def test_the_engine_reports_time_queued_for_a_slot_apart_from_time_generating(demo_model, demo_tokenizer):
    """One slot, three requests at once: the third waits in the queue for both others, and each request's
    queue + prefill + decode is its whole time from submit to answer."""
    import threading
    import time

    import torch

    from tasks.target_model.serve.engine import BatchEngine, GenRequest

    torch.set_num_threads(1)
    engine = BatchEngine(demo_model, demo_tokenizer, {demo_tokenizer.eos_token_id}, max_batch=1)
    prompt = demo_tokenizer.encode("Tell me about the sea.")
    answered, results = threading.Event(), {}

    def on_done(i, result):
        results[i] = (result, time.monotonic())
        if len(results) == 3:
            answered.set()

    submitted = time.monotonic()
    for i in range(3):
        engine.submit(GenRequest(prompt, 6, temperature=0, on_done=lambda r, i=i: on_done(i, r)))
    assert answered.wait(300)
    timings = [results[i][0].timing for i in range(3)]
    busy = [t.first_token_s + t.generation_s for t in timings]
    assert timings[0].queue_s < 0.5 and timings[2].queue_s >= busy[0] + busy[1] - 0.01
    for i, t in enumerate(timings):
        assert abs(t.queue_s + busy[i] - (results[i][1] - submitted)) < 0.05, (i, t)
    assert set(timings[2].metrics(6)) == {"queue_time_ms", "time_to_first_token_ms", "generation_time_ms", "tokens_per_second"}


def test_server_replies_in_kimi_shape_with_a_tiktoken_tokenizer(family_tokenizers):
    """The server's rendering and reply shaping on Kimi's slow tokenizer (no Rust backend, no offsets)."""
    from types import SimpleNamespace

    from tasks.target_model.formats import Reply, ToolCall
    from tasks.target_model.serve.engine import GenResult
    from tasks.target_model.serve.server import TargetServer

    tokenizer, target = family_tokenizers["kimi-k2.5"]
    server = TargetServer(RunConfig(target=target), SimpleNamespace(stop_ids={163586}), tokenizer)
    body = {
        "messages": [{"role": "user", "content": "Weather in Zürich?"}],
        "chat_template_kwargs": {"thinking": True},
        "return_token_ids": True,
    }
    prompt, prompt_ids = server.render(body)
    assert prompt.endswith("<|im_assistant|>assistant<|im_middle|><think>") and prompt_ids[-1] == 163606
    turn = Reply("Use the tool.", "", (ToolCall("get_weather", '{"city": "Zürich"}'),))
    ids = codec(tokenizer).encode(server.chat_format.completion(turn, prompt, body["messages"]))
    logprobs = [(-0.1, [(i, -0.1)]) for i in ids]
    data = server.shape({**body, "logprobs": True}, prompt, prompt_ids, GenResult(ids, "stop", logprobs))
    choice = data["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["token_ids"] == ids and ids[-1] == 163586
    message = choice["message"]
    assert message["reasoning"] == "Use the tool." and message["content"] == ""
    assert message["tool_calls"][0]["id"] == "functions.get_weather:0"
    assert message["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Zürich"}'}
    raw = b"".join(bytes(e["bytes"]) for e in choice["logprobs"]["content"])
    assert raw == server.chat_format.completion(turn, prompt, body["messages"]).encode()
