"""Families without a module, through their real templates (llama.cpp corpus) and the most real tokenizer to hand.

`chat_format: auto` resolves each to its module or to `template` (the turn as the template renders it); preflight
names what the template renders; rows rebuild exactly where the model emitted canonical tokens and never land
semantic where it sampled; a reply with a channel the template drops is refused with that reason.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tasks.config import ReconstructConfig
from tasks.reconstruct.rebuild import rebuild_rows
from tasks.target_model.chat import chat_format_of, resolve_end_of_turn
from tasks.target_model.formats import TemplateFormat
from tasks.target_model.preflight import run_preflight
from tasks.validate.simulate import simulate_rows
from tests.support.families import TEMPLATE_FAMILIES, template_family_tokenizer
from tests.support.family_rows import SHAPES, family_rows
from tests.support.tools import WEATHER


@pytest.fixture(scope="module")
def template_tokenizers(demo_tokenizer, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("template-families")
    return {name: template_family_tokenizer(f, demo_tokenizer, workdir) for name, f in TEMPLATE_FAMILIES.items()}


@pytest.mark.parametrize("name", list(TEMPLATE_FAMILIES))
def test_auto_resolves_and_preflight_names_what_the_template_renders(template_tokenizers, name):
    tokenizer, target = template_tokenizers[name]
    family = TEMPLATE_FAMILIES[name]
    report = run_preflight(target, tokenizer)
    assert report.chat_format == family.resolves_to
    assert {f.feature for f in report.features if f.ok} == family.features, report.features
    assert report.ok, report.problems


@pytest.mark.parametrize("name", list(TEMPLATE_FAMILIES))
def test_rows_rebuild_exactly_from_canonical_ids_and_never_semantic_from_sampled_ones(template_tokenizers, name):
    tokenizer, target = template_tokenizers[name]
    fmt = chat_format_of(tokenizer, target)
    eot = resolve_end_of_turn(tokenizer, target)
    # The template's own format reads text back by the shapes it rendered: tool calls stay text (a module parses them).
    shapes = tuple(s for s in SHAPES if s != "calls") if isinstance(fmt, TemplateFormat) else SHAPES
    kwargs = TEMPLATE_FAMILIES[name].kwargs
    for piecewise in (False, True):
        rows = family_rows(tokenizer, name, kwargs, n=30, piecewise=piecewise, fmt=fmt, shapes=shapes)
        verdicts = simulate_rows(tokenizer, rows, target, eot, context=3)
        classes = Counter(v.klass for _, v in verdicts)
        assert len(verdicts) == len(rows), (name, piecewise)
        if piecewise:
            assert not classes["semantic"], [(r["id"], v.rebuilt_context) for r, v in verdicts if v.klass == "semantic"][:3]
        else:
            off = [(r["id"], v.klass, v.rebuilt_context) for r, v in verdicts if v.klass != "exact"]
            assert classes == {"exact": len(rows)}, off[:3]


def api_row(row_id: str, content: str, reasoning: str | None = None, calls: tuple = ()) -> dict:
    tool_calls = [
        {"id": f"call{k:05d}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        for k, (name, arguments) in enumerate(calls)
    ]
    return {
        "id": row_id,
        "source": "api",
        "messages": json.dumps([{"role": "user", "content": "Weather in Zürich?"}]),
        "tools": json.dumps([WEATHER]) if calls else None,
        "reasoning": reasoning,
        "content": content,
        "tool_calls": json.dumps(tool_calls) if tool_calls else None,
        "finish_reason": "tool_calls" if calls else "stop",
    }


@pytest.mark.parametrize("name", [n for n, f in TEMPLATE_FAMILIES.items() if f.resolves_to == "template"])
def test_a_channel_the_template_drops_is_refused_with_its_reason(template_tokenizers, name):
    tokenizer, target = template_tokenizers[name]
    features = TEMPLATE_FAMILIES[name].features
    rows = [
        api_row("reasoning", "It is sunny.", reasoning="The user asks about the weather."),
        api_row("call", "", calls=[("get_weather", {"city": "Zürich"})]),
        api_row("call-thought", "", reasoning="The weather tool answers this.", calls=[("get_weather", {"city": "Zürich"})]),
    ]
    result = rebuild_rows(tokenizer, rows, target, ReconstructConfig(methods=["reencode"]))
    refused = {q["id"]: (q["reason"], q["field"]) for q in result.quarantine}
    rebuilt = set(result.table.column("id").to_pylist())
    assert bool({"call", "call-thought"} & rebuilt) == ("tool calls" in features), refused
    if "reasoning" not in features:
        assert refused["reasoning"] == ("template_cannot_render", "reasoning")
    ends = resolve_end_of_turn(tokenizer, target).ids
    for row in result.table.to_pylist():  # the trained tokens end at the turn's end, nothing of the next turn
        trained = [i for i, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
        assert trained[-1] in ends and ends[0] not in trained[:-1], row["id"]
