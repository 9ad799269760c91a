import pytest

from tasks.config import TargetConfig
from tasks.target_model.chat import resolve_end_of_turn
from tasks.target_model.preflight import run_preflight


def test_smollm2_gguf_passes(demo_target, demo_tokenizer):
    cfg = demo_target.model_copy(update={"special_tokens": {"<|im_end|>": 2, "<|im_start|>": 1}})
    report = run_preflight(cfg, demo_tokenizer)
    assert report.ok, report.problems
    assert (report.end_of_turn, report.end_of_turn_id) == ("<|im_end|>", 2)
    texts = {c.text for c in report.checks}
    assert {"<|im_end|>", "<|im_start|>"} <= texts


def test_deepseek_v4_tokenizer_passes(deepseek_target, deepseek_tokenizer):
    pins = {"<｜end▁of▁sentence｜>": 1, "<｜begin▁of▁sentence｜>": 0, "<｜User｜>": 128803, "<｜Assistant｜>": 128804}
    markers = ["<think>", "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>"]
    cfg = deepseek_target.model_copy(update={"special_tokens": pins, "extra_markers": markers})
    report = run_preflight(cfg, deepseek_tokenizer)
    assert report.ok, report.problems
    assert report.end_of_turn_id == 1
    assert {c.text: c.token_id for c in report.checks}["</think>"] == 128822


def test_wrong_pin_names_token_pinned_id_its_decode_and_right_id(demo_target, demo_tokenizer):
    cfg = demo_target.model_copy(update={"special_tokens": {"<|im_end|>": 3}})
    report = run_preflight(cfg, demo_tokenizer)
    assert not report.ok
    assert report.problems == ["token '<|im_end|>': the config pins id 3, which decodes to '<repo_name>'; the right id is 2"]


def test_pin_outside_vocab(demo_target, demo_tokenizer):
    cfg = demo_target.model_copy(update={"special_tokens": {"<|im_end|>": 163533}})
    (problem,) = run_preflight(cfg, demo_tokenizer).problems
    assert "163533, which is outside the vocabulary (size 49152); the right id is 2" in problem


def test_marker_that_is_not_a_single_token(demo_target, demo_tokenizer):
    cfg = demo_target.model_copy(update={"special_tokens": {"<|im_assistant|>": 7}})
    (problem,) = run_preflight(cfg, demo_tokenizer).problems
    assert "'<|im_assistant|>': not a single token" in problem


def test_end_of_turn_from_the_format_and_config(demo_tokenizer):
    assert resolve_end_of_turn(demo_tokenizer, TargetConfig()).text == "<|im_end|>"
    assert resolve_end_of_turn(demo_tokenizer, TargetConfig(end_of_turn="<|endoftext|>")).text == "<|endoftext|>"


def test_chat_format_is_detected_and_named_in_the_report(demo_target, demo_tokenizer):
    report = run_preflight(demo_target, demo_tokenizer)
    assert report.chat_format == "chatml" and report.tokenizer_class


def test_an_unknown_chat_format_is_a_named_error(demo_target):
    with pytest.raises(ValueError, match="chat_format"):
        demo_target.model_copy(update={}).model_validate({"chat_format": "kimi-k9"})


def test_a_template_no_family_matches_writes_turns_itself_and_preflight_names_what_it_lacks(demo_target, demo_tokenizer):
    tokenizer = demo_tokenizer.__class__(tokenizer_object=demo_tokenizer.backend_tokenizer, eos_token="<|im_end|>")
    turns = "{% for m in messages %}{{ m.role }}: {{ m.content }}END\n{% endfor %}"
    prompt = "{% if add_generation_prompt %}assistant: {% endif %}"
    tokenizer.chat_template = turns.replace("END", "") + prompt
    report = run_preflight(demo_target, tokenizer)
    assert report.chat_format == "template" and not report.ok
    assert report.problems == ["chat template: end of turn: no single token ends a turn ('')"]
    tokenizer.chat_template = turns.replace("END", "<|im_end|>") + prompt
    report = run_preflight(demo_target, tokenizer)
    assert report.chat_format == "template" and report.ok, report.problems
    assert {f.feature: f.ok for f in report.features} == {
        "content": True,
        "end of turn": True,
        "reasoning": False,
        "tool calls": False,
        "history": True,
        "round trip": True,
    }


def test_trust_remote_code_is_reported(demo_target, demo_tokenizer):
    report = run_preflight(demo_target.model_copy(update={"trust_remote_code": True}), demo_tokenizer)
    assert report.trust_remote_code
    assert not run_preflight(demo_target, demo_tokenizer).trust_remote_code


@pytest.mark.parametrize("field", ["model", "special_tokens"])
def test_target_config_is_strict(field):
    with pytest.raises(ValueError):
        TargetConfig(**{field: object()})
