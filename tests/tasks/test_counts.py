"""Count verdicts: the provider's own token counts against the rebuilt ids (tasks/reconstruct/counts.py), the
convention check on rows with true ids, and what reconstruct and merge do with a row whose count disagrees."""

from __future__ import annotations

import json

import pytest

from tasks.config import CountConvention, ReconstructConfig, RunConfig, TargetConfig
from tasks.reconstruct.rebuild import rebuild_rows
from tasks.storage import read_table, write_table
from tasks.target_model.chat import resolve_end_of_turn
from tasks.target_model.tokens import codec


def text_row(tokenizer, row_id: str, messages: list[dict], content: str, **usage) -> dict:
    """A text-only generations row (what a chat API returns), with the usage counts given."""
    return {
        "id": row_id,
        "source": "api",
        "messages": json.dumps(messages),
        "content": content,
        "finish_reason": "stop",
        **usage,
    }


def provider_counts(tokenizer, messages: list[dict], content: str, history_arguments: str = "object", **template) -> dict:
    """What an engine serving the target counts: its own rendering of the prompt, and the reply it generated as the
    one-pass encoding of the text plus its end-of-turn token (vLLM's convention)."""
    from tasks.target_model.chat import template_messages

    prompt = tokenizer.apply_chat_template(
        template_messages(messages, history_arguments), tokenize=False, add_generation_prompt=True, **template
    )
    tokens = codec(tokenizer)
    return {"prompt_tokens": len(tokens.encode(prompt)), "completion_tokens": len(tokens.encode(content)) + 1}


MESSAGES = [{"role": "user", "content": "List three colours."}]
CONTENT = "Red, green and blue."


def verdicts(tokenizer, rows, target=None, convention=None) -> dict[str, str]:
    table = rebuild_rows(
        tokenizer,
        rows,
        target or TargetConfig(),
        ReconstructConfig(methods=["reencode"]),
        lambda s: convention or CountConvention(),
    ).table
    return dict(zip(table.column("id").to_pylist(), table.column("count_verdict").to_pylist(), strict=True))


def test_a_dropped_or_extra_end_of_turn_token_is_flagged(demo_tokenizer):
    counts = provider_counts(demo_tokenizer, MESSAGES, CONTENT)
    rows = [
        text_row(demo_tokenizer, "same", MESSAGES, CONTENT, **counts),
        text_row(demo_tokenizer, "dropped", MESSAGES, CONTENT, **counts | {"completion_tokens": counts["completion_tokens"] - 1}),
        text_row(demo_tokenizer, "extra", MESSAGES, CONTENT, **counts | {"completion_tokens": counts["completion_tokens"] + 1}),
        text_row(demo_tokenizer, "none", MESSAGES, CONTENT),
    ]
    assert verdicts(demo_tokenizer, rows) == {
        "same": "count_verified",
        "dropped": "reply_count_mismatch",
        "extra": "reply_count_mismatch",
        "none": "uncounted",
    }
    # A provider that does not count the end of turn, said so in its convention: its count now fits.
    assert verdicts(demo_tokenizer, rows[1:2], convention=CountConvention(end_of_turn=False)) == {"dropped": "count_verified"}


def test_a_prompt_rendered_otherwise_is_flagged(demo_tokenizer, family_tokenizers):
    """An injected system prompt, or another template (Qwen3's ChatML, its own default system turn), shows as a
    prompt count the rebuilt prompt does not have."""
    pirate = [{"role": "system", "content": "You are a pirate."}, *MESSAGES]
    injected = provider_counts(demo_tokenizer, pirate, CONTENT)
    qwen, _ = family_tokenizers["qwen3"]
    other = provider_counts(qwen, MESSAGES, CONTENT)  # the same words, counted by a Qwen3 engine
    rows = [
        text_row(demo_tokenizer, "as-rendered", MESSAGES, CONTENT, **provider_counts(demo_tokenizer, MESSAGES, CONTENT)),
        text_row(demo_tokenizer, "system-injected", MESSAGES, CONTENT, **injected),
        text_row(
            demo_tokenizer, "other-template", MESSAGES, CONTENT, **other | {"completion_tokens": injected["completion_tokens"]}
        ),
    ]
    assert verdicts(demo_tokenizer, rows) == {
        "as-rendered": "count_verified",
        "system-injected": "prompt_count_mismatch",
        "other-template": "prompt_count_mismatch",
    }


def test_history_arguments_as_the_provider_rendered_them(family_tokenizers):
    """Qwen3's real template prints a string argument as given, as Moonshot's K2.5 template does: a compact history
    argument counted by such a provider fits `as_sent`, not the engines' decoded objects."""
    tokenizer, target = family_tokenizers["qwen3"]
    call = {"id": "c0", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Zürich"}'}}
    history = [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c0", "content": "12 °C"},
    ]
    content = "It is 12 °C in Zürich."
    kwargs = {"enable_thinking": False}
    counted = provider_counts(tokenizer, history, content, "as_sent", **kwargs)
    row = text_row(tokenizer, "h", history, content, **counted) | {"template_kwargs": json.dumps(kwargs)}
    as_objects = verdicts(tokenizer, [row], target)
    as_sent = verdicts(tokenizer, [row], target.model_copy(update={"history_arguments": "as_sent"}))
    assert (as_objects, as_sent) == ({"h": "prompt_count_mismatch"}, {"h": "count_verified"})


def test_a_reasoning_count_is_recorded_but_the_completion_count_decides(family_tokenizers):
    """K2.5's template prefills `<think>`, and vLLM counted 0 reasoning tokens for such templates: a reasoning count
    that does not fit (0 beside reasoning text, or off by one) while completion_tokens does leaves the row verified,
    and the report names the source's reasoning count unreliable; a wrong completion count is still a mismatch."""
    tokenizer, target = family_tokenizers["kimi-k2.5"]
    messages = [{"role": "user", "content": "2 + 2?"}]
    reasoning, content = "Two and two make four.", "4"
    eot = resolve_end_of_turn(tokenizer, target)
    from tasks.reconstruct.rebuild import rebuild_rows as rebuild

    base = text_row(tokenizer, "r", messages, content) | {
        "reasoning": reasoning,
        "template_kwargs": json.dumps({"thinking": True}),
    }
    table = rebuild(tokenizer, [base], target, ReconstructConfig(methods=["reencode"])).table.to_pylist()[0]
    tokens = codec(tokenizer)
    think = len(tokens.encode(reasoning))
    total = table["reply_count"]
    assert table["input_ids"][-1] == eot.id and total > think
    right = base | {"prompt_tokens": table["prompt_count"], "completion_tokens": total, "reasoning_tokens": think}
    rows = [right, right | {"id": "w", "reasoning_tokens": think + 1}, right | {"id": "z", "reasoning_tokens": 0}]
    rows.append(right | {"id": "t", "completion_tokens": total + 1})
    assert verdicts(tokenizer, rows, target) == {
        "r": "count_verified",
        "w": "count_verified",
        "z": "count_verified",
        "t": "reply_count_mismatch",
    }
    from tasks.validate.report import unreliable_reasoning

    rebuilt = rebuild(tokenizer, rows, target, ReconstructConfig(methods=["reencode"])).table.to_pandas()
    note = unreliable_reasoning(rebuilt)
    assert list(note) == [rows[0]["source"]]
    assert "unreliable on 2 of 4 rows that report one (1 report 0 beside reasoning text)" in next(iter(note.values()))


def served_row(tokenizer, row_id: str, content: str) -> dict:
    """A finished reply as vLLM returns it with `return_token_ids`: prompt and completion ids (end of turn included),
    and usage counting exactly those."""
    tokens, eot = codec(tokenizer), resolve_end_of_turn(tokenizer, TargetConfig())
    prompt = tokens.encode(tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True))
    completion = tokens.encode(content) + [eot.id]
    row = text_row(tokenizer, row_id, MESSAGES, content, prompt_tokens=len(prompt), completion_tokens=len(completion))
    return row | {"source": "served", "prompt_token_ids": prompt, "token_ids": completion}


def test_a_wrong_convention_fails_on_the_rows_with_true_ids(tmp_path, demo_tokenizer):
    """Rows with server ids and vLLM's count (end of turn included): a source configured as if its provider left the
    end of turn out disagrees with its own true ids; the gate names it and the report says what fits."""
    from tasks.gates import GateError, enforce
    from tasks.reconstruct.stage import RECONSTRUCT
    from tasks.validate.stage import VALIDATE, gate_frame, gate_parameters

    rows = [served_row(demo_tokenizer, f"s{i}", f"{CONTENT} ({i})") for i in range(3)]
    source = {"name": "served", "format": "openai", "path": "unused.jsonl", "counts": {"end_of_turn": False}}
    config = RunConfig(name="c", runs_dir=tmp_path, generate={"sources": [source]}, reconstruct={"methods": ["server_ids"]})
    write_table("generations", rows, config.run_dir / "generations" / "part-00000.parquet")
    RECONSTRUCT.run(config)
    VALIDATE.run(config)
    frame = gate_frame(config)
    with pytest.raises(GateError, match="count_agreement") as err:
        enforce("validation", frame, id_column="source", parameters=gate_parameters(config))
    assert "served" in str(err.value)
    report = (config.run_dir / "validation" / "report.md").read_text()
    assert "counts.end_of_turn: true" in report
    # Under the right convention (vLLM's, the default) the same rows agree.
    right = config.model_copy(update={"generate": config.generate.model_copy(update={"sources": []})})
    RECONSTRUCT.run(right, force=True)
    VALIDATE.run(right, force=True)
    assert gate_frame(right)["count_agreement"].tolist() == [1.0]


@pytest.mark.parametrize("policy", ["mask", "quarantine", "keep"])
def test_a_row_off_the_count_is_trained_only_when_kept(tmp_path, demo_tokenizer, policy):
    """reconstruct.count_mismatch: mask keeps the row with its loss mask off and merge leaves it out of training;
    quarantine refuses it at reconstruct; keep trains it."""
    from tasks.merge.stage import run_merge
    from tasks.reconstruct.stage import RECONSTRUCT

    asked = [[{"role": "user", "content": f"List {n} colours."}] for n in ("two", "three", "four", "five", "six")]
    rows = [
        text_row(demo_tokenizer, f"ok-{i}", m, CONTENT, **provider_counts(demo_tokenizer, m, CONTENT))
        for i, m in enumerate(asked)
    ]
    rows[-1] |= {"id": "off", "completion_tokens": 1}
    config = RunConfig(
        name="m",
        runs_dir=tmp_path,
        reconstruct={"methods": ["reencode"], "count_mismatch": policy},
        merge={"eval_size": 0},
    )
    write_table("generations", rows, config.run_dir / "generations" / "part-00000.parquet")
    RECONSTRUCT.run(config)
    rebuilt = {r["id"]: r for r in read_table("reconstructed", config.run_dir / "reconstructed").to_pylist()}
    quarantined = read_table("quarantine", config.run_dir / "reconstructed" / "quarantine.parquet").to_pylist()
    run_merge(config)
    manifest = json.loads((config.run_dir / "merged" / "manifest.json").read_text())
    merged = read_table("merged", config.run_dir / "merged" / "train", columns=["id", "loss_mask"]).to_pylist()
    trained = {r["id"] for r in merged if any(r["loss_mask"])}
    if policy == "mask":
        assert rebuilt["off"]["count_verdict"] == "reply_count_mismatch" and not any(rebuilt["off"]["loss_mask"])
        assert "off" not in trained and manifest["drops"]["count_masked"] == {"api": 1}
    elif policy == "quarantine":
        assert "off" not in rebuilt and [q["reason"] for q in quarantined] == ["reply_count_mismatch"]
        assert "off" not in trained
    else:
        assert "off" in trained and manifest["by_count_verdict"]["reply_count_mismatch"] == {"train": 1, "eval": 0}
