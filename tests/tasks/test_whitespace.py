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
