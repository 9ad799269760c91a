"""Bad input: each broken row is refused with a reason naming the row and the field; the rest goes on."""

import json

from tasks.config import SourceConfig
from tasks.generate.sources import load_sources

GOOD = {"messages": [{"role": "user", "content": "What is 2 + 2?"}]}
ADD = {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}
TOOL = {"type": "function", "function": ADD}


def with_tool(row_id: str, function: dict) -> bytes:
    return json.dumps(GOOD | {"id": row_id, "tools": [{"type": "function", "function": function}]}).encode()


# kind -> (raw JSONL line, expected quarantine reason, expected field)
BAD_LINES = {
    "malformed JSONL line": (b'{"id": "m1", "messages": [', "malformed_json", None),
    "missing field": (json.dumps({"id": "m2", "prompt": "hi"}).encode(), "bad_row", "messages"),
    "wrong type": (json.dumps({"id": "m3", "messages": "hello"}).encode(), "bad_row", "messages"),
    "wrong content type": (
        json.dumps({"id": "m4", "messages": [{"role": "user", "content": 42}]}).encode(),
        "bad_row",
        "messages[0].content",
    ),
    "empty messages": (json.dumps({"id": "m5", "messages": []}).encode(), "bad_row", "messages"),
    "empty message content": (
        json.dumps({"id": "m6", "messages": [{"role": "user", "content": "  "}]}).encode(),
        "bad_row",
        "messages[0].content",
    ),
    "unknown role": (
        json.dumps({"id": "m7", "messages": [{"role": "robot", "content": "x"}]}).encode(),
        "bad_row",
        "messages[0].role",
    ),
    "non-UTF-8 bytes": (b'{"id": "m8", "messages": [{"role": "user", "content": "caf\xe9"}]}', "not_utf8", None),
    "only an assistant turn": (
        json.dumps({"id": "m9", "messages": [{"role": "assistant", "content": "hi"}]}).encode(),
        "bad_row",
        "messages",
    ),
    "huge row past the length limit": (
        json.dumps({"id": "m10", "messages": [{"role": "user", "content": "x" * 5000}]}).encode(),
        "prompt_too_long",
        "messages",
    ),
    "tool schema type is not a JSON type": (
        with_tool("m11", {"name": "f", "parameters": {"type": "dict"}}),
        "bad_row",
        "tools[0].function.parameters.type",
    ),
    "tool properties not an object": (
        with_tool("m12", {"name": "f", "parameters": {"type": "object", "properties": ["a"]}}),
        "bad_row",
        "tools[0].function.parameters.properties",
    ),
    "tool without a name": (with_tool("m13", {}), "bad_row", "tools[0].function.name"),
    "row is not an object": (b'["user", "hi"]', "bad_row", "<row>"),
    "duplicate id, different content": (
        json.dumps({"id": "g0", "messages": [{"role": "user", "content": "other"}]}).encode(),
        "duplicate_id",
        "id",
    ),
}


def good_row(i: int) -> bytes:
    return json.dumps({"id": f"g{i}", "messages": [{"role": "user", "content": f"question {i}"}], "tools": [TOOL]}).encode()


def test_every_bad_row_is_named_and_the_rest_goes_on(tmp_path, reliability_report):
    lines = [good_row(0)]
    for n, (raw, _, _) in enumerate(BAD_LINES.values(), 1):
        lines += [raw, good_row(n)]
    ends_with_reply = {"id": "a1", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "old"}]}
    lines.append(json.dumps(ends_with_reply).encode())
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    after = tmp_path / "after.jsonl"
    after.write_bytes(good_row(99) + b"\n")

    loaded = load_sources(
        [
            SourceConfig(name="mixed", format="openai", path=str(path), max_prompt_chars=2000),
            SourceConfig(name="empty", format="openai", path=str(empty)),
            SourceConfig(name="after", format="openai", path=str(after)),
        ]
    )

    refused = {q["location"]: q for q in loaded.quarantine}
    for n, (kind, (_, reason, field)) in enumerate(BAD_LINES.items()):
        location = f"mixed.jsonl:{2 * n + 2}"  # the bad line's own line number
        record = refused.get(location)
        ok = record is not None and record["reason"] == reason and record["field"] == field and record["detail"]
        reliability_report.record("bad input", kind, 1, int(bool(ok)))
        assert ok, (kind, location, record)
    empty_ok = (
        [q for q in loaded.quarantine if q["source"] == "empty"]
        == [q for q in loaded.quarantine if q["reason"] == "empty_file" and q["location"] == "empty.jsonl"]
        != []
    )
    reliability_report.record("bad input", "empty file", 1, int(empty_ok))
    assert empty_ok, loaded.quarantine

    # A conversation that ends with an assistant turn is a prompt whose reply is regenerated.
    by_id = {r["id"]: r for r in loaded.rows}
    trimmed = json.loads(by_id["mixed:a1"]["messages"])
    reliability_report.record("bad input", "ends with an assistant turn", 1, int(trimmed == ends_with_reply["messages"][:1]))
    assert trimmed == ends_with_reply["messages"][:1]

    good = [f"mixed:g{i}" for i in range(len(BAD_LINES) + 1)] + ["after:g99"]
    assert [i for i in good if i not in by_id] == []  # every good row goes on, in order
    assert len(loaded.rows) == len(good) + 1
    assert json.loads(by_id["mixed:g0"]["messages"])[0]["content"] == "question 0"  # the first of a duplicated id wins
