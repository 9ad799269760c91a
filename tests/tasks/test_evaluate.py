"""Speculative decoding is lossless, counts acceptance right, and the stage writes and gates its results."""

import json

import pytest
import torch

import tasks.evaluate.speculative as speculative
from tasks.config import RunConfig
from tasks.draft.stage import run_train
from tasks.draft.train import pieces_from_model
from tasks.evaluate.speculative import acceptance_by_position, greedy_decode, speculative_decode
from tasks.evaluate.stage import gate_eval, run_evaluate
from tasks.gates import GateError
from tests.tasks.draft_fixture import AUX_LAYER_IDS, render, write_run

torch.set_num_threads(1)

EOS = {2}


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, demo_tokenizer, demo_model):
    """The fixture rows, a few training steps of a small draft, and its export."""
    root = tmp_path_factory.mktemp("eval-run")
    write_run(root / "eval", demo_tokenizer, demo_model)
    config = RunConfig.model_validate(
        {
            "name": "eval",
            "runs_dir": str(root),
            "train": {
                "draft_vocab_size": 512,
                "ttt_steps": 2,
                "batch_tokens": 256,
                "lr": 3e-3,
                "warmup_steps": 1,
                "max_steps": 24,
                "checkpoint_every": 24,
                "draft_overrides": {"intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1},
            },
            "evaluate": {"num_prompts": 2, "max_new_tokens": 12, "num_draft_tokens": 3, "min_acceptance_length": 1.0},
        }
    )
    run_train(config, pieces_from_model(demo_model, keep_model=False))
    return config


def test_speculative_equals_greedy_with_a_real_draft(trained_run, demo_model):
    from tasks.draft.export import load_export

    draft = load_export(trained_run.run_dir / "draft" / "export", demo_model.get_input_embeddings().weight)
    prompt, _ = render(demo_model_tokenizer(), "Name three fruits.", "")
    prompt = prompt[:-1]  # up to the assistant header, as a held-out prompt
    plain = greedy_decode(demo_model, prompt, 16, EOS)
    spec = speculative_decode(demo_model, draft, prompt, AUX_LAYER_IDS, 3, 16, EOS)
    assert spec.tokens == plain
    assert sum(spec.accepted) + len(spec.accepted) + 1 == len(spec.tokens)  # +1: the prefill's token


def test_accepted_drafts_keep_the_caches_right(demo_model, monkeypatch):
    """A draft that proposes the true continuation with every third token wrong: partial acceptance."""
    prompt, _ = render(demo_model_tokenizer(), "Count from one to ten in words.", "")
    prompt = prompt[:-1]
    plain = greedy_decode(demo_model, prompt, 20, EOS)
    full = prompt + plain
    calls = []

    def oracle(draft, tokens, aux, start, past, k):
        assert aux.shape[1] == tokens.shape[1] - 1  # aux rows for every token but the newest
        n = tokens.shape[1]
        ids = [full[n + i] if n + i < len(full) else 0 for i in range(k)]
        calls.append(len(calls))
        if len(calls) % 3 == 0:
            ids[1] = (ids[1] + 1) % 49152
        return ids, None

    monkeypatch.setattr(speculative, "propose", oracle)
    spec = speculative_decode(demo_model, None, prompt, AUX_LAYER_IDS, 4, 20, EOS)
    assert spec.tokens == plain
    assert spec.acceptance_length > 2.0
    assert 1 in spec.accepted and 4 in spec.accepted
    per_position = acceptance_by_position([spec])
    assert per_position[0] == 1.0 and per_position[1] < 1.0


@pytest.mark.slow
def test_evaluate_stage_writes_results_and_gates(trained_run, demo_model):
    summary = run_evaluate(trained_run, demo_model)
    assert summary["prompts"] == 2 and summary["identical"] == 2
    assert summary["acceptance_length"] >= 1.0 and len(summary["per_position_acceptance"]) == 3
    data = json.loads((trained_run.run_dir / "eval" / "results.json").read_text())
    assert {p["id"] for p in data["prompts"]} == {"chat-012", "chat-013"}
    assert (trained_run.run_dir / "eval" / "acceptance.png").stat().st_size > 5_000
    strict = trained_run.model_copy(update={"evaluate": trained_run.evaluate.model_copy(update={"min_acceptance_length": 4.5})})
    with pytest.raises(GateError, match="acceptance_length"):
        gate_eval(strict)
    rarely = trained_run.model_copy(update={"evaluate": trained_run.evaluate.model_copy(update={"min_first_acceptance": 1.0})})
    with pytest.raises(GateError, match="first_acceptance"):  # a first drafted token accepted less often than asked
        gate_eval(rarely)


def demo_model_tokenizer():
    from tasks.config import TargetConfig
    from tasks.target_model.loader import load_tokenizer

    return load_tokenizer(TargetConfig())


@pytest.mark.slow
def test_a_draft_no_better_than_the_untrained_one_fails_the_gate_naming_both(trained_run, demo_model, tmp_path):
    """The untrained draft exported as if trained: its τ is the untrained τ, which the gate must refuse."""
    import shutil

    from tasks.draft.export import ExportTarget, export_draft, load_export
    from tasks.draft.train import untrained_draft
    from tasks.evaluate.stage import evaluate_draft

    shutil.copytree(trained_run.run_dir, tmp_path / trained_run.name)
    config = trained_run.model_copy(update={"runs_dir": tmp_path})
    trained = load_export(config.run_dir / "draft" / "export", demo_model.get_input_embeddings().weight)
    embed, head = demo_model.get_input_embeddings().weight, demo_model.get_output_embeddings().weight
    baseline = untrained_draft(config, trained, embed.detach(), head.detach())
    export = export_draft(baseline.state_dict(), baseline.cfg, AUX_LAYER_IDS, ExportTarget(30), tmp_path / "x", dtype="float32")
    summary = evaluate_draft(config, demo_model, export)
    assert summary["acceptance_length"] == summary["untrained_acceptance_length"] and summary["tau_gain"] == 0
    with pytest.raises(GateError) as failed:
        gate_eval(config)
    message = str(failed.value)
    assert "tau_gain" in message and "untrained_tau" in message
    assert message.count(str(round(summary["acceptance_length"], 4))[:5]) >= 2  # trained and untrained τ, side by side


def test_the_tau_table_says_what_its_speed_ratio_measures():
    """The eval-acceptance artifact's speculative/greedy ratio is a wall-clock figure of the loop that measured it."""
    from tasks.evaluate.stage import tau_table

    summary = {
        "engine": "transformers",
        "prompts": 2,
        "num_draft_tokens": 3,
        "acceptance_length": 1.2,
        "untrained_acceptance_length": 1.0,
        "tau_gain": 0.2,
        "mean_prompt_acceptance_length": 1.2,
        "identical": 2,
        "per_position_acceptance": [0.2, 0.0, 0.0],
        "untrained_per_position_acceptance": [0.0, 0.0, 0.0],
        "greedy_tokens_per_s": 20.0,
        "speculative_tokens_per_s": 13.8,
    }
    table = tau_table(summary)
    assert "| transformers | 20.0 | 13.8 | 0.69x |" in table
    note = table.rsplit("\n", 1)[-1]
    assert "wall-clock tokens/s" in note and "draftsmith's own un-optimised loop" in note and "not a serving speed-up" in note
    assert "vLLM's speculative decoding" in tau_table(summary | {"engine": "vllm"}).rsplit("\n", 1)[-1]
