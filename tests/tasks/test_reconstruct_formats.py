"""Golden renders for five chat families: ChatML, Qwen3, Kimi-K2, DeepSeek-V3/V4, Llama-3.

Token ids are checked in under tests/fixtures/golden/; set DRAFTSMITH_REGEN_GOLDEN=1 to rewrite them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from tasks.config import ReconstructConfig, TargetConfig
from tasks.reconstruct.rebuild import rebuild_rows
from tasks.reconstruct.tokens import resolve_end_of_turn
from tasks.validate.simulate import simulate_rows

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
GOLDEN = FIXTURES / "golden"
TEMPLATES = FIXTURES / "templates"
DEEPSEEK_TEMPLATE = Path(__file__).resolve().parents[2] / "tasks" / "reconstruct" / "templates" / "deepseek-v3.jinja"
REGEN = os.environ.get("DRAFTSMITH_REGEN_GOLDEN") == "1"

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "Local time in a zone",
         "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}
# Non-canonical spacing, a newline and non-ASCII: the argument string must survive byte for byte.
ODD_ARGUMENTS = '{"city":  "Zürich",\n "unit":"celsius" ,"days":[1,2]}'


def call(index: int, name: str, arguments: str) -> dict:
    return {"id": f"call_{index}", "type": "function", "function": {"name": name, "arguments": arguments}}


def case_rows() -> list[dict]:
    """The five cases every family must rebuild."""
    question = [{"role": "user", "content": "What is the capital of France?"}]
    weather_q = [{"role": "user", "content": "Weather in Zürich, and the time in Paris?"}]
    history = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call(0, "get_weather", '{"city": "Paris"}')]},
        {"role": "tool", "tool_call_id": "call_0", "content": '{"temp_c": 21}'},
        {"role": "user", "content": "And is that warm?"},
    ]
    cases = {
        "empty_reasoning": (question, None, None, "The capital of France is Paris.", None),
        "reasoning_in_content": (question, None, "The capital of France is Paris.", "The capital of France is Paris.", None),
        "tool_call_bytes": (weather_q, [WEATHER], "Need the weather tool.", "", [call(0, "get_weather", ODD_ARGUMENTS)]),
        "several_tool_calls": (weather_q, [WEATHER, CLOCK], None, "Checking both.",
                               [call(0, "get_weather", '{"city": "Zürich"}'), call(1, "get_time", '{"zone":"Europe/Paris"}')]),
        "multi_turn": (history, [WEATHER], "21 °C is mild.", "Yes, 21 °C is pleasant.", None),
    }
    return [
        {
            "id": name, "source": "golden", "messages": json.dumps(messages, ensure_ascii=False),
            "tools": json.dumps(tools) if tools else None, "reasoning": reasoning, "content": content,
            "tool_calls": json.dumps(calls, ensure_ascii=False) if calls else None, "finish_reason": "stop",
        }
        for name, (messages, tools, reasoning, content, calls) in cases.items()
    ]


def family_tokenizer(base, template: Path, added: list[str], eos: str):
    """A test tokenizer: a real byte-level BPE with the family's marker tokens added and its layout as template."""
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_str(base.backend_tokenizer.to_str())
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in added])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=eos)
    tokenizer.chat_template = template.read_text(encoding="utf-8")
    return tokenizer


@pytest.fixture(scope="module")
def families(demo_tokenizer, deepseek_target):
    from tasks.target.loader import load_tokenizer

    qwen3 = family_tokenizer(demo_tokenizer, TEMPLATES / "qwen3.jinja",
                             ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"],
                             "<|im_end|>")
    kimi = family_tokenizer(demo_tokenizer, TEMPLATES / "kimi-k2.jinja",
                            ["<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>", "<think>", "</think>",
                             "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                             "<|tool_call_argument_begin|>", "<|tool_call_end|>"], "<|im_end|>")
    llama3 = family_tokenizer(demo_tokenizer, TEMPLATES / "llama3.jinja",
                              ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
                              "<|end_of_text|>")
    deepseek = load_tokenizer(deepseek_target.model_copy(update={"chat_template": DEEPSEEK_TEMPLATE}))
    return {
        # name: (tokenizer, target config, expected end-of-turn text)
        "chatml": (demo_tokenizer, TargetConfig(chat_format="inline-hermes"), "<|im_end|>"),
        "qwen3": (qwen3, TargetConfig(), "<|im_end|>"),
        "kimi_k2": (kimi, TargetConfig(), "<|im_end|>"),
        "deepseek_v3": (deepseek, TargetConfig(), "<｜end▁of▁sentence｜>"),
        "llama3": (llama3, TargetConfig(chat_format="inline-reasoning"), "<|eot_id|>"),
    }


FAMILIES = ["chatml", "qwen3", "kimi_k2", "deepseek_v3", "llama3"]


@pytest.fixture(scope="module")
def rebuilt(families):
    out = {}
    for name, (tokenizer, target, _) in families.items():
        out[name] = rebuild_rows(tokenizer, case_rows(), target, ReconstructConfig(methods=["reencode"]))
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_end_of_turn_resolves_from_template(families, family):
    tokenizer, target, expected = families[family]
    eot = resolve_end_of_turn(tokenizer, target.end_of_turn, target.chat_format)
    assert eot.text == expected
    assert tokenizer.convert_ids_to_tokens(eot.id) == expected


@pytest.mark.parametrize("family", FAMILIES)
def test_every_case_rebuilds_with_mask_on_the_reply_only(families, rebuilt, family):
    tokenizer, target, eot_text = families[family]
    result = rebuilt[family]
    assert result.quarantine == []
    rows = {r["id"]: r for r in result.table.to_pylist()}
    cases = {c["id"]: c for c in case_rows()}
    assert set(rows) == set(cases)
    for name, row in rows.items():
        ids, mask = np.asarray(row["input_ids"]), np.asarray(row["loss_mask"])
        trained = np.flatnonzero(mask)
        assert trained.size and np.all(np.diff(trained) == 1), name  # one contiguous run
        assert row["last_trained_id"] == result.end_of_turn.id
        reply = tokenizer.decode(ids[trained].tolist(), skip_special_tokens=False)
        prompt = tokenizer.decode(ids[: trained[0]].tolist(), skip_special_tokens=False)
        tail = tokenizer.decode(ids[trained[-1] + 1 :].tolist(), skip_special_tokens=False)
        assert reply.endswith(eot_text) and eot_text not in tail, name
        case = cases[name]
        assert case["content"] in reply
        if case["reasoning"]:
            assert case["reasoning"] in reply
        for c in json.loads(case["tool_calls"] or "[]"):
            assert c["function"]["arguments"] in reply, (name, reply)  # byte for byte
            assert c["function"]["arguments"] not in prompt
        assert row["round_trip"] and row["num_trained"] == trained.size


def test_reasoning_also_in_content_is_rendered_twice(families, rebuilt):
    """A template that kept only one copy would pass a substring check; count the copies instead."""
    text = "The capital of France is Paris."
    for family in FAMILIES:
        tokenizer = families[family][0]
        row = next(r for r in rebuilt[family].table.to_pylist() if r["id"] == "reasoning_in_content")
        ids = np.asarray(row["input_ids"])[np.asarray(row["loss_mask"]) == 1]
        assert tokenizer.decode(ids.tolist(), skip_special_tokens=False).count(text) == 2, family


@pytest.mark.parametrize("family", FAMILIES)
def test_golden_token_ids(rebuilt, family):
    path = GOLDEN / f"render-{family}.json"
    got = {
        r["id"]: {"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]}
        for r in rebuilt[family].table.select(["id", "input_ids", "loss_mask"]).to_pylist()
    }
    if REGEN:
        path.write_text(json.dumps(got, indent=None, sort_keys=True) + "\n", encoding="utf-8")
    want = json.loads(path.read_text(encoding="utf-8"))
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name]["input_ids"] == want[name]["input_ids"], f"{family}/{name}: ids changed"
        assert got[name]["loss_mask"] == want[name]["loss_mask"], f"{family}/{name}: mask changed"


@pytest.mark.parametrize("family", FAMILIES)
def test_simulated_text_api_round_trips_exactly(families, rebuilt, family):
    """Treat the golden ids as a server's, play the text API on them, rebuild: every case is exact."""
    tokenizer, target, _ = families[family]
    result = rebuilt[family]
    cases = {c["id"]: c for c in case_rows()}
    rows = []
    for r in result.table.to_pylist():
        trained = np.flatnonzero(r["loss_mask"])
        rows.append({**cases[r["id"]], "prompt_token_ids": r["input_ids"][: trained[0]],
                     "token_ids": r["input_ids"][trained[0] : trained[-1] + 1]})
    verdicts = simulate_rows(tokenizer, rows, target, result.end_of_turn, context=3)
    assert {row["id"]: v.klass for row, v in verdicts} == {name: "exact" for name in cases}
