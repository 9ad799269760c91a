"""Validate: classification, simulate mode on real sampled generations, the stage's tables and report."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tasks.config import ReconstructConfig, RunConfig, TargetConfig, ValidationConfig
from tasks.gates import GateError, enforce
from tasks.reconstruct.stage import RECONSTRUCT
from tasks.storage import read_table, write_table
from tasks.target_model.chat import resolve_end_of_turn
from tasks.target_model.formats import CHATML
from tasks.validate.classify import classify_ids, first_divergence, through_turn_end
from tasks.validate.report import rates_frame
from tasks.validate.simulate import simulate_rows
from tasks.validate.stage import VALIDATE, gate_frame, gate_parameters


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_same_text_other_ids_is_bpe_only_and_shows_token_strings(demo_tokenizer):
    canonical = encode(demo_tokenizer, "Steps:\n\n1. go")  # canonical BPE: "\n" + "\n" before a digit
    double = encode(demo_tokenizer, "\n\n")
    assert len(double) == 1
    # The same text with the one-token "\n\n", as a sampling model emits it.
    sampled = encode(demo_tokenizer, "Steps:") + double + encode(demo_tokenizer, "1. go")
    assert canonical != sampled
    verdict = classify_ids(demo_tokenizer, sampled, canonical, context=2)
    assert verdict.klass == "bpe_only"
    assert verdict.first_divergence == first_divergence(sampled, canonical)
    assert "▶ '\\n\\n' '1'" in verdict.truth_context
    assert "▶ '\\n' '\\n'" in verdict.rebuilt_context


def test_different_text_is_semantic_and_equal_ids_exact(demo_tokenizer):
    a, b = encode(demo_tokenizer, "The answer is 4."), encode(demo_tokenizer, "The answer is 5.")
    assert classify_ids(demo_tokenizer, a, b).klass == "semantic"
    assert classify_ids(demo_tokenizer, a, a).klass == "exact"
    assert classify_ids(demo_tokenizer, a, a + a).klass == "semantic"  # a prefix is not a match


def test_alignment_on_turn_end_keeps_bpe_only_rows_bpe_only(demo_tokenizer):
    """Cutting the rebuilt ids to the true length would run into <|im_end|> and misread the row as semantic."""
    eot = resolve_end_of_turn(demo_tokenizer, TargetConfig())
    head = encode(demo_tokenizer, "<|im_start|>assistant\n")
    truth = head + encode(demo_tokenizer, "A:") + encode(demo_tokenizer, "\n\n") + encode(demo_tokenizer, "1") + [eot.id]
    rebuilt = head + encode(demo_tokenizer, "A:\n\n1") + [eot.id] + encode(demo_tokenizer, "\n")
    mask = np.array([0] * len(head) + [1] * (len(rebuilt) - len(head) - 1) + [0])
    assert classify_ids(demo_tokenizer, truth, rebuilt[: len(truth)]).klass == "semantic"
    aligned = through_turn_end(np.array(rebuilt), mask)
    assert classify_ids(demo_tokenizer, truth, aligned.tolist()).klass == "bpe_only"


def test_hermes_tool_calls_split_keeps_argument_bytes():
    text = 'Sure.\n<tool_call>\n{"name": "f", "arguments": {"a":  1 , "b": "ü"}}\n</tool_call>'
    reply = CHATML.parse(text, "<|im_start|>assistant\n")
    assert reply.content == "Sure."
    assert reply.tool_calls[0].as_openai()["function"] == {"name": "f", "arguments": '{"a":  1 , "b": "ü"}'}


def test_simulate_on_sampled_generations_finds_no_semantic_rows(demo_tokenizer, sampled_generations):
    eot = resolve_end_of_turn(demo_tokenizer, TargetConfig())
    verdicts = simulate_rows(demo_tokenizer, sampled_generations, TargetConfig(), eot, context=3)
    assert len(verdicts) == len(sampled_generations)
    assert {v.klass for _, v in verdicts} <= {"exact", "bpe_only"}
    for _, v in verdicts:
        assert (v.first_divergence is None) == (v.klass == "exact")


def test_simulate_flags_a_chat_format_the_model_does_not_write(demo_tokenizer, sampled_generations):
    """Qwen3's layout (a <think> block on every turn) is not what SmolLM2 writes: every row comes out semantic."""
    wrong = TargetConfig(chat_format="qwen3")
    eot = resolve_end_of_turn(demo_tokenizer, wrong)
    verdicts = simulate_rows(demo_tokenizer, sampled_generations[:2], wrong, eot, context=3)
    assert [v.klass for _, v in verdicts] == ["semantic", "semantic"]
    assert "'<' 'think' '>'" in verdicts[0][1].rebuilt_context


def test_rates_are_over_verified_rows():
    rows = pd.DataFrame(
        {
            "source": ["a"] * 4 + ["b"],
            "mode": ["check"] * 5,
            "klass": ["exact", "bpe_only", "semantic", "unverified", "unverified"],
        }
    )
    rates = rates_frame(rows).set_index("source")
    assert rates.loc["a", "verified"] == 3 and rates.loc["a", "semantic_rate"] == pytest.approx(1 / 3)
    assert rates.loc["b", "bpe_only_rate"] == 0.0 and rates.loc["b", "unverified"] == 1


@pytest.fixture(scope="module")
def validated(tmp_path_factory, sampled_generations):
    """Reconstruct + validate a run on disk: server-id rows, plus hand rows without ground truth."""
    config = RunConfig(runs_dir=tmp_path_factory.mktemp("runs"), name="v", validation=ValidationConfig(examples=2))
    plain = {
        "id": "plain-0",
        "source": "api",
        "messages": json.dumps([{"role": "user", "content": "Hi"}]),
        "content": "Hello!",
        "finish_reason": "stop",
    }
    write_table("generations", [*sampled_generations, plain], config.run_dir / "generations" / "part-00000.parquet")
    RECONSTRUCT.run(config)
    return config, VALIDATE.run(config)


def test_stage_writes_one_check_row_per_rebuilt_row(validated, sampled_generations):
    config, summary = validated
    rows = read_table("validation", config.run_dir / "validation").to_pandas()
    check = rows[rows["mode"] == "check"]
    rebuilt = read_table("reconstructed", config.run_dir / "reconstructed", columns=["id"]).column("id").to_pylist()
    assert sorted(check["id"]) == sorted(rebuilt)
    by_id = check.set_index("id")
    assert by_id.loc["plain-0", "klass"] == "unverified" and bool(by_id.loc["plain-0", "round_trip"])
    assert set(check[check["source"] == "sampled"]["klass"]) == {"exact"}  # server ids validate exactly
    simulate = rows[rows["mode"] == "simulate"]
    assert len(simulate) == len(sampled_generations) and "semantic" not in set(simulate["klass"])
    assert summary["classes"]["exact"] == len(sampled_generations) and summary["classes"]["unverified"] == 1


def test_stage_report_and_gate(validated):
    config, summary = validated
    text = (config.run_dir / "validation" / "report.md").read_text()
    assert "| sampled | check |" in text and "| sampled | simulate |" in text
    frame = gate_frame(config).set_index("source")
    assert frame.loc["sampled", "verified_share"] == 1.0 and frame.loc["api", "verified_share"] == 0.0
    with pytest.raises(GateError, match="verified_share") as err:  # a text-only source with nothing verified
        enforce("validation", frame.reset_index(), id_column="source", parameters=gate_parameters(config))
    assert "api" in str(err.value)
    sampled = frame.loc[["sampled"]].reset_index()
    enforce("validation", sampled, id_column="source", parameters=gate_parameters(config))
    for column in ("semantic_rate", "simulate_semantic_rate", "simulate_bpe_only_rate"):
        with pytest.raises(GateError, match=column):
            enforce("validation", sampled.assign(**{column: 0.9}), id_column="source", parameters=gate_parameters(config))


def test_reconstructed_gate_catches_a_wrong_last_token(validated):
    from tasks.reconstruct.stage import gate_frame as reconstructed_frame
    from tasks.reconstruct.stage import gate_parameters as reconstructed_parameters

    config, _ = validated
    frame = reconstructed_frame(config)
    params = reconstructed_parameters(config)
    enforce("reconstructed", frame, parameters=params)
    broken = frame.copy()
    broken.loc[broken["finish_reason"] == "stop", "last_trained_id"] = 13
    with pytest.raises(GateError) as err:
        enforce("reconstructed", broken, parameters=params)
    assert "last_trained_id" in str(err.value)
    assert ReconstructConfig().methods == ["server_ids", "logprobs", "guided"]


def test_guided_rows_are_rebuilt_checked_and_reported_beside_canonical(tmp_path, sampled_generations):
    """methods: [guided] alone: every row is rebuilt from its text and re-split, then checked against its true ids."""
    config = RunConfig(runs_dir=tmp_path, name="g", reconstruct={"methods": ["guided"]})
    write_table("generations", sampled_generations, config.run_dir / "generations" / "part-00000.parquet")
    rebuilt = RECONSTRUCT.run(config)
    assert rebuilt["methods"] == {"guided": len(sampled_generations)}
    assert rebuilt["guided"]["rows"] == len(sampled_generations)
    VALIDATE.run(config)
    rows = read_table("validation", config.run_dir / "validation").to_pandas()
    assert set(rows["mode"]) == {"check", "simulate", "simulate-guided"}
    check = rows[rows["mode"] == "check"]
    assert len(check) == len(sampled_generations) and "semantic" not in set(check["klass"])
    guided = rows[rows["mode"] == "simulate-guided"].set_index("id")["klass"]
    assert (check.set_index("id")["klass"] == guided.reindex(check["id"]).to_numpy()).all()  # the same rows, the same ids
    report = (config.run_dir / "validation" / "report.md").read_text()
    assert "simulate-guided" in report and "Guided vs canonical" in report
    assert list(gate_frame(config)["simulate_bpe_only_rate"]) == list(
        rates_of(config).query("mode == 'simulate-guided'")["bpe_only_rate"]
    )  # text-only rows are gated on the method they get


def rates_of(config):
    import pandas as pd

    return pd.read_parquet(config.run_dir / "validation" / "rates.parquet")
