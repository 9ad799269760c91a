"""Whitespace a provider stripped at a parser join comes back where the count settles it, and never wrongly."""

from __future__ import annotations

import pandas as pd

from tasks.validate.report import restored_whitespace
from tests.support.stripped import outcomes, stripped_rows


def test_the_validation_report_counts_the_rows_restored_and_left():
    rebuilt = pd.DataFrame({"source": ["api", "api", "api", "other"], "whitespace": ["restored", "unsettled", None, None]})
    assert restored_whitespace(rebuilt) == {
        "api": "whitespace dropped at parser joins restored on 1 rows, 1 left off their count"
    }


def test_stripped_joins_are_restored_to_the_models_habit_where_the_count_settles_them(family_tokenizers):
    tokenizer, target = family_tokenizers["kimi-k2.5"]
    found = outcomes(tokenizer, target, stripped_rows(tokenizer, 24, with_ids_every=4))
    assert found["wrong"] == 0 and found["left"] == 0 and found["restored"] >= 16, found


def test_without_rows_that_carry_ids_the_count_alone_restores_nothing_wrongly(family_tokenizers):
    """A newline, two and a space are one token each here: without a habit, rows stay off their count."""
    tokenizer, target = family_tokenizers["kimi-k2.5"]
    found = outcomes(tokenizer, target, stripped_rows(tokenizer, 24, with_ids_every=0))
    assert found["wrong"] == 0 and found["left"] >= 16, found


def test_where_guided_runs_a_restoration_stands_only_if_the_likelihood_agrees(family_tokenizers):
    """The habit's whitespace is scored against the others that reach the same count: kept where it is the likeliest,
    left off its count where another is likelier by the margin."""
    tokenizer, target = family_tokenizers["kimi-k2.5"]
    pairs = stripped_rows(tokenizer, 12, with_ids_every=4)
    weighed = []

    def agreeing(prompt, replies):
        weighed.append(len(replies))
        return [0.0] + [-5.0] * (len(replies) - 1)

    agreed = outcomes(tokenizer, target, pairs, score=agreeing)
    assert agreed == outcomes(tokenizer, target, pairs) and weighed and min(weighed) >= 2
    disputed = outcomes(tokenizer, target, pairs, score=lambda prompt, replies: [0.0] + [5.0] * (len(replies) - 1))
    assert disputed["restored"] == 0 and disputed["left"] == agreed["restored"] + agreed["left"], disputed


def test_the_likelihood_prefers_the_targets_own_continuation(demo_tokenizer, demo_model):
    import torch

    from tasks.reconstruct.whitespace import likelihood
    from tasks.target_model.tokens import codec

    tokens = codec(demo_tokenizer)
    prompt = tokens.encode(
        demo_tokenizer.apply_chat_template(
            [{"role": "user", "content": "Say hello."}], tokenize=False, add_generation_prompt=True
        )
    )
    with torch.no_grad():
        own = demo_model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0, len(prompt) :].tolist()
    mine, shuffled = likelihood(demo_model)(prompt, [own, own[::-1]])
    assert mine > shuffled and mine < 0
