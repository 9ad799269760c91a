"""A Kimi-K2.5-style target bought over a text API: preflight -> reconstruct -> validate -> merge.

The target is the stand-in tiktoken tokenizer (remote code) with the K2.5 template; the journal holds
what a provider returns (reasoning, content, tool calls with the model's ids, thinking on and off).
A third of the rows also carry the model's token ids (a provider slice that returns them): those are
checked, and the text API is simulated on them so the gate reads this format's re-encode error.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.merge import merge_flow
from flows.reconstruct import reconstruct_flow
from flows.validate import validate_flow
from tasks.config import RunConfig, ValidationConfig
from tasks.gates import GateError
from tasks.storage import read_table, write_table
from tasks.target_model.chat import chat_format_of, resolve_end_of_turn
from tasks.validate.simulate import played_row
from tests.support.families import FAMILIES
from tests.support.family_rows import family_rows

CONFIG = "configs/kimi-k2-openrouter.yaml"


def provider_journal(tokenizer, target, with_ids_every: int | None) -> list[dict]:
    """Generations rows as the API returned them; every `with_ids_every`-th keeps the model's ids."""
    eot = resolve_end_of_turn(tokenizer, target)
    fmt = chat_format_of(tokenizer, target)
    rows = []
    for i, truth in enumerate(family_rows(tokenizer, "kimi-k2.5", FAMILIES["kimi-k2.5"].kwargs, n=60)):
        row = {**played_row(tokenizer, truth, fmt, eot), "source": "openrouter", "reasoning_kind": "text"}
        if with_ids_every and i % with_ids_every == 0:
            row |= {"prompt_token_ids": truth["prompt_token_ids"], "token_ids": truth["token_ids"]}
        rows.append(row)
    return rows


@pytest.mark.slow
def test_kimi_rows_go_through_reconstruct_validate_and_merge(prefect_harness, tmp_path, family_tokenizers):
    tokenizer, target = family_tokenizers["kimi-k2.5"]
    # The stand-in rows are emitted piece by piece, so ~40% of them are bpe_only: the gate must allow that.
    config = RunConfig(
        runs_dir=tmp_path,
        name="kimi",
        target=target.model_copy(update={"chat_format": "auto"}),
        validation=ValidationConfig(max_simulate_bpe_only_rate=0.6),
    )
    journal = provider_journal(tokenizer, target, with_ids_every=3)
    write_table("generations", journal, config.run_dir / "generations" / "part-00000.parquet")

    rebuilt = reconstruct_flow(config)
    assert rebuilt["quarantined"] == 0 and rebuilt["methods"] == {"server_ids": 20, "reencode": 40}
    rows = read_table("reconstructed", config.run_dir / "reconstructed").to_pylist()
    eot = resolve_end_of_turn(tokenizer, target)
    assert {r["last_trained_id"] for r in rows if r["finish_reason"] != "length"} == {eot.id} == {163586}

    summary = validate_flow(config)
    assert summary["classes"] == {"exact": 20, "bpe_only": 0, "semantic": 0, "unverified": 40}
    simulated = read_table("validation", config.run_dir / "validation").to_pandas().query("mode == 'simulate'")
    assert len(simulated) == 20 and "semantic" not in set(simulated["klass"])

    merged = merge_flow(config)
    assert merged["gated_rows"] > 0
    ids = set(read_table("merged", config.run_dir / "merged", columns=["id"]).column("id").to_pylist())
    assert ids <= {r["id"] for r in rows}


@pytest.mark.slow
def test_a_text_only_source_with_nothing_verified_fails_the_validation_gate(prefect_harness, tmp_path, family_tokenizers):
    tokenizer, target = family_tokenizers["kimi-k2.5"]
    config = RunConfig(runs_dir=tmp_path, name="blind", target=target)
    write_table("generations", provider_journal(tokenizer, target, None), config.run_dir / "generations" / "part-00000.parquet")
    reconstruct_flow(config)
    with pytest.raises(GateError, match="verified_share"):
        validate_flow(config)


def test_the_kimi_config_passes_preflight_on_the_standin_directory(family_tokenizers):
    _, target = family_tokenizers["kimi-k2.5"]
    result = CliRunner().invoke(app, ["preflight", "--config", CONFIG, "--set", f"target.path={target.path}"])
    assert result.exit_code == 0, result.output
    assert "TikTokenTokenizer" in result.output and "kimi-k2.5" in result.output and "163586" in result.output


def test_a_pinned_id_that_decodes_to_something_else_names_the_right_id(family_tokenizers):
    _, target = family_tokenizers["kimi-k2.5"]
    result = CliRunner().invoke(
        app,
        [
            "preflight",
            "--config",
            CONFIG,
            "--set",
            f"target.path={target.path}",
            "--set",
            'target.special_tokens={"<|im_end|>": 1000}',
        ],
    )
    assert result.exit_code == 1
    assert "pins id 1000, which decodes to" in result.output and "the right id is 163586" in result.output
