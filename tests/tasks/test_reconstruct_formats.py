"""Reconstruct on every chat family (real templates): what each rebuilds, what each refuses and why, golden ids.

Golden token ids live in tests/fixtures/golden/; set DRAFTSMITH_REGEN_GOLDEN=1 to rewrite them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from tasks.config import ReconstructConfig
from tasks.reconstruct.rebuild import rebuild_rows
from tasks.target_model.chat import resolve_end_of_turn
from tasks.target_model.tokens import codec
from tests.support.families import FAMILIES
from tests.support.tools import CLOCK, WEATHER

GOLDEN = Path(__file__).resolve().parent.parent / "fixtures" / "golden"
REGEN = os.environ.get("DRAFTSMITH_REGEN_GOLDEN") == "1"

# Non-canonical spacing, a newline and non-ASCII: the argument string must survive byte for byte.
ODD_ARGUMENTS = '{"city":  "Zürich",\n "unit":"celsius" ,"days":[1,2]}'
ONE_CALL = ("llama-3", "gpt-oss")  # one tool call per turn, nothing beside it
# No reasoning channel, or (DeepSeek) thinking off: their templates' default when the request sets none.
NO_REASONING = ("chatml", "qwen3-coder", "kimi-k2", "llama-3", "deepseek-v3.1", "deepseek-v3.2")
XML_ARGUMENTS = ("qwen3-coder", "qwen3.5", "glm-4.6", "deepseek-v3.2")  # arguments rewritten as parameters
KIMI_SANDBOX = ("kimi-k2", "kimi-k2.5")  # their real templates append to a list: transformers' sandbox refuses


def call(index: int, name: str, arguments: str) -> dict:
    return {"id": f"call_{index}", "type": "function", "function": {"name": name, "arguments": arguments}}


GOLDEN_DAY = 1796040000  # 2026-11-30 12:00 UTC


def case_rows() -> list[dict]:
    question = [{"role": "user", "content": "What is the capital of France?"}]
    weather_q = [{"role": "user", "content": "Weather in Zürich, and the time in Paris?"}]
    history = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And is it big?"},
    ]
    tool_history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call(0, "get_weather", '{"city": "Paris"}')]},
        {"role": "tool", "tool_call_id": "call_0", "content": '{"temp_c": 21}'},
        {"role": "user", "content": "And is that warm?"},
    ]
    cases = {
        "plain": (question, None, None, "The capital of France is Paris.", None, "stop"),
        "reasoning": (question, None, "Recall the capital.", "Paris.", None, "stop"),
        "tool_call_bytes": (weather_q, [WEATHER], None, "", [call(0, "get_weather", ODD_ARGUMENTS)], "tool_calls"),
        "several_tool_calls": (
            weather_q,
            [WEATHER, CLOCK],
            None,
            "Checking both.",
            [call(0, "get_weather", '{"city": "Zürich"}'), call(1, "get_time", '{"zone": "Europe/Paris"}')],
            "tool_calls",
        ),
        "multi_turn": (history, None, None, "Yes, about two million people.", None, "stop"),
        "tool_history": (tool_history, [WEATHER], None, "Yes, 21 °C is mild.", None, "stop"),
        "cut": (question, None, None, "The capital of Fra", None, "length"),
    }
    return [
        {
            "id": name,
            "source": "golden",
            "messages": json.dumps(messages, ensure_ascii=False),
            "tools": json.dumps(tools) if tools else None,
            "reasoning": reasoning,
            "content": content,
            "tool_calls": json.dumps(calls, ensure_ascii=False) if calls else None,
            "finish_reason": finish,
            "created": GOLDEN_DAY,  # templates that write the date (gpt-oss) render the day the golden ids were made
        }
        for name, (messages, tools, reasoning, content, calls, finish) in cases.items()
    ]


def expected_refusals(family: str) -> dict[str, str]:
    """The cases each family must refuse, with the reason: what its format or real template cannot express."""
    out = {}
    if family in NO_REASONING:
        out["reasoning"] = "format_cannot_express"
    if family in ONE_CALL:
        out["several_tool_calls"] = "format_cannot_express"
    if family in KIMI_SANDBOX:
        out["tool_history"] = "template_error"
    return out


@pytest.fixture(scope="module")
def rebuilt(family_tokenizers):
    return {
        name: rebuild_rows(tokenizer, case_rows(), target, ReconstructConfig(methods=["reencode"]))
        for name, (tokenizer, target) in family_tokenizers.items()
    }


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_rebuilds_what_it_can_and_names_what_it_cannot(family_tokenizers, rebuilt, family):
    tokenizer, target = family_tokenizers[family]
    result = rebuilt[family]
    assert {q["id"]: q["reason"] for q in result.quarantine} == expected_refusals(family)
    tokens = codec(tokenizer)
    eot = resolve_end_of_turn(tokenizer, target)
    cases = {c["id"]: c for c in case_rows()}
    for row in result.table.to_pylist():
        ids, mask = np.asarray(row["input_ids"]), np.asarray(row["loss_mask"])
        trained = np.flatnonzero(mask)
        assert trained.size and np.all(np.diff(trained) == 1), row["id"]  # one contiguous run
        reply = tokens.decode(ids[trained])
        case = cases[row["id"]]
        if case["finish_reason"] == "length":
            assert row["last_trained_id"] not in eot.ids and reply.endswith(case["content"])
        else:
            assert row["last_trained_id"] in eot.ids, row["id"]
        assert case["content"].strip() in reply
        if case["reasoning"]:
            assert case["reasoning"] in reply
        for c in json.loads(case["tool_calls"] or "[]"):
            if family not in XML_ARGUMENTS:
                assert c["function"]["arguments"] in reply, (row["id"], reply)  # byte for byte
        assert row["round_trip"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_golden_token_ids(rebuilt, family):
    path = GOLDEN / f"render-{family}.json"
    got = {
        r["id"]: {"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]}
        for r in rebuilt[family].table.select(["id", "input_ids", "loss_mask"]).to_pylist()
    }
    if REGEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=None, sort_keys=True) + "\n", encoding="utf-8")
    want = json.loads(path.read_text(encoding="utf-8"))
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name]["input_ids"] == want[name]["input_ids"], f"{family}/{name}: ids changed"
        assert got[name]["loss_mask"] == want[name]["loss_mask"], f"{family}/{name}: mask changed"


def test_reasoning_echoed_into_the_content_is_refused_or_stripped(family_tokenizers):
    tokenizer, target = family_tokenizers["kimi-k2.5"]
    row = {**case_rows()[1], "id": "echo", "content": "Recall the capital.\n\nParis."}
    refused = rebuild_rows(tokenizer, [row], target, ReconstructConfig(methods=["reencode"]))
    assert [(q["reason"], q["field"]) for q in refused.quarantine] == [("reasoning_echoed", "content")]
    stripped = rebuild_rows(tokenizer, [row], target, ReconstructConfig(methods=["reencode"], echoed_reasoning="strip"))
    plain = rebuild_rows(tokenizer, [case_rows()[1]], target, ReconstructConfig(methods=["reencode"]))
    assert stripped.table.column("input_ids").to_pylist() == plain.table.column("input_ids").to_pylist()


@pytest.mark.parametrize("kind", ["summary", "encrypted"])
def test_reasoning_that_is_not_the_models_text_is_refused(family_tokenizers, kind):
    tokenizer, target = family_tokenizers["kimi-k2.5"]
    row = {**case_rows()[1], "reasoning": None, "reasoning_kind": kind}
    result = rebuild_rows(tokenizer, [row], target, ReconstructConfig(methods=["reencode"]))
    assert [(q["reason"], q["field"]) for q in result.quarantine] == [("reasoning_not_verbatim", "reasoning")]


def test_thinking_off_in_the_request_renders_the_closed_block(family_tokenizers):
    tokenizer, target = family_tokenizers["kimi-k2.5"]
    row = {**case_rows()[0], "template_kwargs": json.dumps({"thinking": False})}
    result = rebuild_rows(tokenizer, [row], target, ReconstructConfig(methods=["reencode"]))
    ids, mask = result.table.column("input_ids")[0].as_py(), result.table.column("loss_mask")[0].as_py()
    text = codec(tokenizer).decode(ids)
    assert text.endswith("<think></think>The capital of France is Paris.<|im_end|>")
    trained = [i for i, m in zip(ids, mask, strict=True) if m]
    assert codec(tokenizer).decode(trained) == "The capital of France is Paris.<|im_end|>"
    with_reasoning = {**row, "reasoning": "Recall."}
    refused = rebuild_rows(tokenizer, [with_reasoning], target, ReconstructConfig(methods=["reencode"]))
    assert [q["reason"] for q in refused.quarantine] == ["format_cannot_express"]


def test_a_prompt_is_rendered_on_the_day_of_its_reply(family_tokenizers):
    """gpt-oss's template writes today's date into the system turn: a reply bought yesterday and rebuilt
    today must get yesterday's date, the prompt the target saw."""
    from tasks.reconstruct.render import parse_turn, render_prompts

    tokenizer, _ = family_tokenizers["gpt-oss"]
    row = case_rows()[0]
    days = {1796040000: "2026-11-30", 1800000000: "2027-01-15"}
    prompts = render_prompts(tokenizer, [parse_turn({**row, "created": created}) for created in days])
    assert [day in prompt for prompt, day in zip(prompts, days.values(), strict=True)] == [True, True]
