"""Reconstruct: methods on real sampled generations, masks from offsets, quarantine reasons, the stage on disk."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tasks.config import ReconstructConfig, RunConfig, TargetConfig
from tasks.reconstruct.rebuild import rebuild_rows
from tasks.reconstruct.stage import RECONSTRUCT, plan_shards
from tasks.storage import read_table, write_table
from tasks.target_model.chat import resolve_end_of_turn
from tasks.target_model.tokens import TokenResolutionError


def truth(row: dict) -> list[int]:
    return list(row["prompt_token_ids"]) + list(row["token_ids"])


def rebuild(tokenizer, rows, methods, target=None):
    return rebuild_rows(tokenizer, rows, target or TargetConfig(), ReconstructConfig(methods=methods))


def test_end_of_turn_is_resolved_and_checked(demo_tokenizer):
    eot = resolve_end_of_turn(demo_tokenizer, TargetConfig())
    assert (eot.text, eot.id) == ("<|im_end|>", demo_tokenizer.convert_tokens_to_ids("<|im_end|>"))
    with pytest.raises(TokenResolutionError, match="not one token"):
        resolve_end_of_turn(demo_tokenizer, TargetConfig(end_of_turn="</end>"))


def test_reencode_puts_a_token_boundary_where_the_prompt_ends(demo_tokenizer):
    """A server encodes the prompt alone and the model generates after it: "A:\n" + "\n" is not "A:" + "\n\n"."""
    from tasks.reconstruct.methods import reencode
    from tasks.reconstruct.render import RenderedTurn

    text = "<|im_start|>user\nA:\n\n<|im_end|>"
    gen_start = text.index("\n<|im_end|>")
    (rebuilt,) = reencode(demo_tokenizer, [RenderedTurn(text, gen_start, len(text), "")])
    prompt = demo_tokenizer.encode(text[:gen_start], add_special_tokens=False)
    assert rebuilt.input_ids.tolist() == prompt + demo_tokenizer.encode(text[gen_start:], add_special_tokens=False)
    assert rebuilt.input_ids.tolist() != demo_tokenizer.encode(text, add_special_tokens=False)
    assert rebuilt.loss_mask.tolist() == [0] * len(prompt) + [1] * (len(rebuilt.input_ids) - len(prompt))
    assert rebuilt.round_trip


def test_server_ids_are_used_as_given(demo_tokenizer, sampled_generations):
    result = rebuild(demo_tokenizer, sampled_generations, ["server_ids"])
    assert result.quarantine == []
    for row, out in zip(sampled_generations, result.table.to_pylist(), strict=True):
        assert out["method"] == "server_ids"
        assert out["input_ids"] == truth(row)
        assert sum(out["loss_mask"]) == len(row["token_ids"])
        assert out["loss_mask"][: len(row["prompt_token_ids"])] == [0] * len(row["prompt_token_ids"])


def test_logprob_bytes_give_the_same_ids_as_the_server(demo_tokenizer, sampled_generations):
    server = rebuild(demo_tokenizer, sampled_generations, ["server_ids"]).table
    logprobs = rebuild(demo_tokenizer, [{**r, "prompt_token_ids": None} for r in sampled_generations], ["logprobs"]).table
    assert logprobs.column("method").to_pylist() == ["logprobs"] * len(sampled_generations)
    assert logprobs.column("input_ids").to_pylist() == server.column("input_ids").to_pylist()
    assert logprobs.column("loss_mask").to_pylist() == server.column("loss_mask").to_pylist()


def test_reencode_mask_matches_the_server_split_when_ids_agree(demo_tokenizer, sampled_generations):
    reencoded = rebuild(demo_tokenizer, sampled_generations, ["reencode"]).table.to_pylist()
    eot = resolve_end_of_turn(demo_tokenizer, TargetConfig())
    for row, out in zip(sampled_generations, reencoded, strict=True):
        assert out["method"] == "reencode" and out["round_trip"]
        mask = np.asarray(out["loss_mask"])
        trained = np.flatnonzero(mask)
        assert trained[0] == len(row["prompt_token_ids"])  # the generation header is never trained
        if row["finish_reason"] == "stop":
            assert out["last_trained_id"] == eot.id
            assert out["input_ids"][-1] != eot.id and mask[-1] == 0  # ChatML's newline after <|im_end|>
        reply = demo_tokenizer.decode(np.asarray(out["input_ids"])[trained].tolist(), skip_special_tokens=False)
        assert reply.startswith(row["content"])


def test_text_that_does_not_match_the_ids_is_quarantined(demo_tokenizer, sampled_generations):
    bad = {**sampled_generations[0], "content": sampled_generations[0]["content"] + " (edited)"}
    result = rebuild(demo_tokenizer, [bad, *sampled_generations[1:]], ["server_ids"])
    assert result.table.num_rows == len(sampled_generations) - 1
    [q] = result.quarantine
    assert (q["id"], q["reason"], q["field"], q["stage"]) == (bad["id"], "ids_text_mismatch", "token_ids", "reconstruct")


def row(row_id: str, content: str = "Fine.", **extra) -> dict:
    base = {
        "id": row_id,
        "source": "hand",
        "messages": json.dumps([{"role": "user", "content": "Hi"}]),
        "content": content,
        "finish_reason": "stop",
    }
    return {**base, **extra}


def test_rows_that_cannot_be_rebuilt_name_their_reason_and_field(demo_tokenizer):
    call = [{"id": "c0", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]
    rows = [
        row("ok"),
        row("bad-json", messages="[{"),
        row("args-not-string", tool_calls=json.dumps([{"function": {"name": "f", "arguments": {"a": 1}}}])),
        row("tool-call", content="", tool_calls=json.dumps(call)),
        row("bad-arguments", content="", tool_calls=json.dumps([{**call[0], "function": {"name": "f", "arguments": "{a"}}])),
        row("reasoning", reasoning="hmm"),
        row("too-long", content="word " * 400),
    ]
    result = rebuild(demo_tokenizer, rows, ["reencode"], TargetConfig(max_length=200))
    got = {q["id"]: (q["reason"], q["field"]) for q in result.quarantine}
    assert got == {
        "bad-json": ("bad_json", "messages"),
        "args-not-string": ("bad_tool_call", "tool_calls"),
        "bad-arguments": ("bad_tool_arguments", "tool_calls"),
        "reasoning": ("format_cannot_express", "reasoning"),  # ChatML has no reasoning channel
        "too-long": ("too_long", "input_ids"),
    }
    assert result.table.column("id").to_pylist() == ["ok", "tool-call"]


def test_truncated_reply_trains_up_to_its_last_generated_token(demo_tokenizer):
    [out] = rebuild(demo_tokenizer, [row("cut", content="One two three", finish_reason="length")], ["reencode"]).table.to_pylist()
    ids = np.asarray(out["input_ids"])
    assert demo_tokenizer.decode(ids[np.asarray(out["loss_mask"]) == 1].tolist()) == "One two three"
    assert out["last_trained_id"] == ids[-1]


def test_stage_writes_shards_and_quarantine_and_resumes(tmp_path, demo_tokenizer, sampled_generations):
    config = RunConfig(runs_dir=tmp_path, name="r", reconstruct=ReconstructConfig(shard_rows=4))
    rows = [*sampled_generations, row("bad", messages="nope")]
    write_table(
        "generations",
        [{**r, "source": r.get("source") or "hand"} for r in rows],
        config.run_dir / "generations" / "part-00000.parquet",
    )
    first = RECONSTRUCT.run(config)
    assert (first["rows"], first["quarantined"], first["shards"]) == (len(sampled_generations), 1, 2)
    assert first["methods"] == {"server_ids": len(sampled_generations)}
    table = read_table("reconstructed", config.run_dir / "reconstructed")
    assert table.num_rows == len(sampled_generations)
    assert [s.start for s in plan_shards(config)] == [0, 4]
    again = RECONSTRUCT.run(config)
    assert again["shards_skipped"] == 2 and again["rows"] == first["rows"]
    quarantine = read_table("quarantine", config.run_dir / "reconstructed" / "quarantine.parquet").to_pylist()
    assert [(q["id"], q["reason"]) for q in quarantine] == [("bad", "bad_json")]


def test_chunked_threaded_rebuild_matches_one_batch(demo_tokenizer, sampled_generations):
    rows = [*sampled_generations, row("bad", messages="[")]
    one = rebuild_rows(demo_tokenizer, rows, TargetConfig(), ReconstructConfig(methods=["reencode"], pipeline_rows=1000))
    many = rebuild_rows(
        demo_tokenizer, rows, TargetConfig(), ReconstructConfig(methods=["reencode"], pipeline_rows=2, encode_threads=3)
    )
    assert many.table.equals(one.table)
    assert many.quarantine == one.quarantine
