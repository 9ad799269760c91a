"""Every chat family against its real template (llama.cpp corpus) and the most real tokenizer to hand.

1. Where the real template renders the last assistant turn in full, that text is exactly the prompt
   (template with the generation prompt) plus the format's serialization of the turn.
2. Round trip on 60 rows from real prompts per family: ids -> text -> split into reasoning / content /
   tool calls as engines split it -> rebuilt from that text alone -> the same ids, or a counted
   bpe_only row; never semantic.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from jinja2.exceptions import SecurityError
from jinja2.ext import loopcontrols
from jinja2.sandbox import SandboxedEnvironment
from transformers.utils.chat_template_utils import render_jinja_template

from tasks.target_model.chat import chat_format_of, resolve_end_of_turn
from tasks.target_model.formats import FORMATS, Reply, ToolCall, detect
from tasks.validate.simulate import simulate_rows
from tests.support.families import FAMILIES, template_text
from tests.support.family_rows import family_rows
from tests.support.tools import CLOCK, WEATHER

ZURICH = ToolCall("get_weather", json.dumps({"city": "Zürich"}, ensure_ascii=False))
PARIS = ToolCall("get_time", json.dumps({"zone": "Europe/Paris"}))
REPLY_SHAPES = {
    "text": Reply(None, "The capital of France is Paris."),
    "reasoning": Reply("The user asks for a capital.", "Paris."),
    "calls": Reply(None, "Checking both.", (ZURICH, PARIS)),
    "reasoning_calls": Reply("Two tools are needed.", "Checking both.", (ZURICH, PARIS)),
    "one_call": Reply(None, "", (ZURICH,)),
    "reasoning_one_call": Reply("The weather tool answers this.", "", (ZURICH,)),
}
COMPARE_KWARGS = {"deepseek-v3.1": {"thinking": False}, "deepseek-v3.2": {"thinking": True}, "kimi-k2.5": {"thinking": True}}


def template_message(reply: Reply, reasoning_field: str) -> dict:
    """The reply as the real template expects a past assistant turn (arguments as objects)."""
    message = {"role": "assistant", "content": reply.content}
    if reply.reasoning is not None:
        message[reasoning_field] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": f"call_{i}", "type": "function", "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
            for i, c in enumerate(reply.tool_calls)
        ]
    return message


def render(template: str, messages: list[dict], generation_prompt: bool, **kwargs) -> str:
    """transformers' own rendering; Kimi's templates append to a list, which its immutable sandbox refuses
    (so transformers cannot render their tool-call turns): those are rendered in a mutable sandbox."""
    options = {"tools": [WEATHER, CLOCK], "add_generation_prompt": generation_prompt, "bos_token": "<｜begin▁of▁sentence｜>"}
    try:
        out, _ = render_jinja_template(conversations=[messages], chat_template=template, **options, **kwargs)
        return out[0]
    except SecurityError:
        env = SandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )
        return env.from_string(template).render(messages=messages, **options, **kwargs)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_format_is_detected_from_its_real_template(name):
    assert detect(template_text(FAMILIES[name])).name == name


@pytest.mark.parametrize("name", list(FAMILIES))
def test_serialized_turn_equals_the_real_templates_rendering(name):
    family, fmt = FAMILIES[name], FORMATS[name]
    template = template_text(family)
    kwargs = COMPARE_KWARGS.get(name, family.kwargs[0])
    prompt_turns = [{"role": "user", "content": "Weather in Zürich, and the time in Paris?"}]
    for shape in family.full_turns:
        reply = REPLY_SHAPES[shape]
        prompt = render(template, prompt_turns, True, **kwargs)
        full = render(template, [*prompt_turns, template_message(reply, family.reasoning_field)], False, **kwargs)
        completion = fmt.completion(reply, prompt, prompt_turns, shape)
        if name == "glm-4.6":  # GLM's template writes no end-of-turn token: the next header closes the turn
            completion = completion.removesuffix(fmt.end_text(reply))
            assert full == prompt + completion, shape
        else:
            assert full.startswith(prompt + completion), (shape, full[len(prompt) :], completion)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_round_trip_on_real_prompts(family_tokenizers, name):
    tokenizer, target = family_tokenizers[name]
    assert chat_format_of(tokenizer, target).name == name
    eot = resolve_end_of_turn(tokenizer, target)
    rows = family_rows(tokenizer, name, FAMILIES[name].kwargs, n=60)
    assert {r["source"] for r in rows} >= {"text", "history", "calls", "cut"}
    verdicts = simulate_rows(tokenizer, rows, target, eot, context=3)
    classes = Counter(v.klass for _, v in verdicts)
    semantic = [(row["id"], v.rebuilt_context) for row, v in verdicts if v.klass == "semantic"]
    assert not semantic, semantic[:3]
    assert len(verdicts) == 60 and classes["exact"] + classes["bpe_only"] == 60 and classes["exact"] > 0, classes
    # the prompt part is the real template's own rendering, token for token
    for row in rows[:6]:
        kwargs = json.loads(row["template_kwargs"] or "{}")
        want = tokenizer.apply_chat_template(
            json.loads(row["messages"]),
            tools=json.loads(row["tools"] or "null"),
            tokenize=False,
            add_generation_prompt=True,
            **kwargs,
        )
        assert tokenizer.decode(row["prompt_token_ids"], skip_special_tokens=False) == want


def test_kimi_tool_call_ids_are_counted_over_the_conversation():
    fmt = FORMATS["kimi-k2.5"]
    history = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "functions.get_weather:0", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "21 C"},
        {"role": "user", "content": "And the time?"},
    ]
    api_ids = Reply("r", "", (ToolCall("get_time", "{}", "call_9f2a"), ToolCall("get_weather", "{}", "functions.get_weather:7")))
    text = fmt.completion(api_ids, "<think>", history)
    assert "functions.get_time:1<|tool_call_argument_begin|>" in text  # an API's own id: counted after the one before
    assert "functions.get_weather:7<|tool_call_argument_begin|>" in text  # already the model's form: kept
    parsed = fmt.parse(text.removesuffix("<|im_end|>"), "<think>")
    assert [c.id for c in parsed.tool_calls] == ["functions.get_time:1", "functions.get_weather:7"]
    assert parsed.reasoning == "r"


def test_arguments_that_are_not_json_are_a_named_error():
    from tasks.target_model.formats import RowError

    with pytest.raises(RowError) as err:
        FORMATS["kimi-k2"].completion(Reply(None, "", (ToolCall("f", "{city: Paris"),)), "", [], "row-7")
    assert err.value.reason == "bad_tool_arguments" and "row-7" in err.value.detail and "'f'" in err.value.detail


def test_a_reply_cut_inside_its_reasoning_gets_no_closing_marker():
    fmt = FORMATS["kimi-k2.5"]
    assert fmt.completion(Reply("half a thou", "", (), truncated=True), "<think>", []) == "half a thou"
    assert fmt.parse("half a thou", "<think>") == Reply("half a thou", "")
