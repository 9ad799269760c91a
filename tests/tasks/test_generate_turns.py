"""Whole conversations regenerated turn by turn: each request carries the target's own earlier replies, each turn is
journaled and resumed on its own, tool results follow only the calls that were recorded, and a conversation's turns
stay in one split."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from tasks.config import ApiConfig, GenerateConfig, ReconstructConfig, RequestConfig, RunConfig, SourceConfig
from tasks.generate.journal import JournalState, read_journal
from tasks.generate.stage import run_generate
from tasks.generate.turns import walk
from tasks.merge.hashing import shuffle_key
from tasks.merge.scan import priorities
from tasks.reconstruct.rebuild import rebuild_rows
from tasks.target_model.tokens import codec
from tests.support.faults import CannedServer
from tests.tasks.test_generate_client import outcome

WEATHER = {"id": "call_rec", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def conversation(cid: str, *turns: str) -> dict:
    """User turns, each answered in the dataset by "D<k>" (replies the regeneration must never send)."""
    messages = []
    for k, text in enumerate(turns, 1):
        messages += [{"role": "user", "content": text}, {"role": "assistant", "content": f"D{k}"}]
    return {"id": cid, "messages": messages}


class Recorder:
    """Answers `T:<last user or tool content>` (or the tool calls `calls` names for it) and keeps every request."""

    def __init__(self, calls: dict[str, list[dict]] | None = None):
        self.seen: list[list[dict]] = []
        self.calls = calls or {}

    def __call__(self, request: dict) -> dict:
        self.seen.append(request["messages"])
        last = request["messages"][-1].get("content") or ""
        message = {"role": "assistant", "content": f"T:{last}"}
        if last in self.calls:
            message = {"role": "assistant", "content": "", "tool_calls": self.calls[last]}
        finish = "tool_calls" if "tool_calls" in message else "stop"
        return {"choices": [{"index": 0, "finish_reason": finish, "message": message}], "usage": {"cost": 0.0001}}


@pytest.fixture
def recorder():
    reply = Recorder()
    server = CannedServer(hang_s=5, reply=reply).start()
    reply.server = server
    yield reply
    server.stop()


def config_for(tmp_path, recorder, rows: list[dict], **source) -> RunConfig:
    path = tmp_path / "conversations.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    api = {"base_url": recorder.server.base_url, "provider": "openai", "api_key_env": None, "concurrency": 4}
    api |= {"timeout_s": 2.0, "max_retries": 3, "backoff_base_s": 0.01, "backoff_max_s": 0.05}
    return RunConfig(
        name="turns",
        runs_dir=tmp_path / "runs",
        generate=GenerateConfig(
            sources=[SourceConfig(name="c", format="openai", path=str(path), regenerate="each_turn", **source)],
            api=ApiConfig(**api),
            request=RequestConfig(max_tokens=16),
            journal_batch=1,
        ),
    )


def test_each_request_carries_the_targets_own_earlier_replies(tmp_path, recorder):
    config = config_for(tmp_path, recorder, [conversation("a", "u1", "u2", "u3"), conversation("b", "v1")])
    summary = run_generate(config)
    done, quarantined = outcome(config)
    assert sorted(done) == ["c:a#t1", "c:a#t2", "c:a#t3", "c:b#t1"] and not quarantined
    assert summary["requested_this_run"] == 4
    third = next(m for m in recorder.seen if m[-1]["content"] == "u3")
    assert third == [
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "T:u1"},
        {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "T:u2"},
        {"role": "user", "content": "u3"},
    ]
    assert not [m for sent in recorder.seen for m in sent if m["content"].startswith("D")]
    rows = {r["id"]: r for r in read_journal(config.run_dir / "generations" / "journal.jsonl").done.values()}
    assert json.loads(rows["c:a#t3"]["messages"]) == third and rows["c:a#t3"]["content"] == "T:u3"
    gen = json.loads((config.run_dir / "generations" / "summary.json").read_text())
    assert (gen["conversations"], gen["conversations_complete"]) == (2, 2)


def test_a_failed_turn_resumes_there_and_nothing_is_bought_twice(tmp_path, recorder):
    """Turn 2 fails past its retries: turn 1 is kept, turn 3 is not asked; the rerun asks turns 2 and 3 only."""
    config = config_for(tmp_path, recorder, [conversation("a", "u1", "fault=500,500,500,500 u2", "u3")])
    run_generate(config)
    done, quarantined = outcome(config)
    assert done == ["c:a#t1"] and quarantined["c:a#t2"]["reason"] == "http_500"
    assert "turn 2 of 3" in quarantined["c:a#t2"]["detail"] and recorder.server.requests["u3"] == 0
    summary = run_generate(config)
    done, quarantined = outcome(config)
    assert sorted(done) == ["c:a#t1", "c:a#t2", "c:a#t3"] and not quarantined
    assert recorder.server.requests["u1"] == 1 and recorder.server.requests["u3"] == 1
    assert summary["requested_this_run"] == 2


def tool_conversation(cid: str) -> dict:
    return {
        "id": cid,
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "", "tool_calls": [WEATHER]},
            {"role": "tool", "tool_call_id": "call_rec", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny."},
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    }


@pytest.mark.parametrize(("city", "matches"), [('{"city":"Paris"}', True), ('{"city": "Rome"}', False)])
def test_a_recorded_tool_result_follows_only_the_same_call(tmp_path, recorder, city, matches):
    """The same name and arguments (key order and spacing aside): the recorded result is spliced in, addressed to the
    target's call id. Other arguments: the conversation stops after that turn, with its reason."""
    ours = {"id": "call_ours", "type": "function", "function": {"name": "get_weather", "arguments": city}}
    recorder.calls = {"weather?": [ours]}
    config = config_for(tmp_path, recorder, [tool_conversation("w")])
    run_generate(config)
    done, quarantined = outcome(config)
    if matches:
        assert sorted(done) == ["c:w#t1", "c:w#t2"] and not quarantined
        second = recorder.seen[-1]
        assert second[1]["tool_calls"] == [ours]
        assert second[2] == {"role": "tool", "tool_call_id": "call_ours", "content": "sunny"}
    else:
        assert done == ["c:w#t1"] and quarantined["c:w#t2"]["reason"] == "tool_call_mismatch"
        assert "names or arguments differ" in quarantined["c:w#t2"]["detail"] and len(recorder.seen) == 1


def test_each_turn_buys_replies():
    with pytest.raises(ValueError, match="each_turn buys every turn"):
        SourceConfig(name="c", format="openai", path="x", regenerate="each_turn", replies="dataset")


def test_a_conversations_turns_draw_one_shuffle_digest():
    ids = pa.array(["c:a#t1", "c:a#t2", "c:a#t13", "c:b#t1", "c:b"])
    digests = priorities(ids, np.zeros(5, dtype=np.int64), [shuffle_key(0, "c")])
    assert digests[0] == digests[1] == digests[2] != digests[3] and digests[3] == digests[4]


def test_a_later_turns_row_trains_exactly_that_turns_reply_on_kimi_k25(family_tokenizers):
    """Turn 2's row, rebuilt with K2.5's real template on its tokenizer stand-in: the loss mask covers turn 2's reply
    (reasoning, content, end of turn) and nothing of the history, which holds turn 1's content without its reasoning."""
    tokenizer, target = family_tokenizers["kimi-k2.5"]
    conversation = [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "DATASET ONE"},
        {"role": "user", "content": "Is it big?"},
        {"role": "assistant", "content": "DATASET TWO"},
    ]
    first = {"id": "c:k#t1", "source": "c", "content": "Paris, of course.", "reasoning": "Recall it.", "tool_calls": None}
    walked = walk(
        {"id": "c:k", "source": "c", "tools": None, "conversation": conversation}, JournalState(done={first["id"]: first})
    )
    second = {
        "id": walked.next_prompt["id"],
        "source": "c",
        "messages": walked.next_prompt["messages"],
        "tools": None,
        "reasoning": "Think of the population.",
        "reasoning_kind": "text",
        "content": "Yes, about two million people.",
        "tool_calls": None,
        "finish_reason": "stop",
    }
    rebuilt = rebuild_rows(tokenizer, [second], target, ReconstructConfig(methods=["reencode"])).table.to_pylist()
    ids, mask = np.asarray(rebuilt[0]["input_ids"]), np.asarray(rebuilt[0]["loss_mask"])
    tokens = codec(tokenizer)
    trained, history = tokens.decode(ids[mask == 1]), tokens.decode(ids[mask == 0])
    assert second["id"] == "c:k#t2" and np.all(np.diff(np.flatnonzero(mask)) == 1)  # one run, at the end
    assert int(np.flatnonzero(mask)[-1]) == len(ids) - 1
    assert "Think of the population." in trained and trained.rstrip().endswith(("<|im_end|>", "people."))
    assert "Paris, of course." in history and "Is it big?" in history and "Paris" not in trained
    assert "Recall it." not in history and "DATASET" not in history
