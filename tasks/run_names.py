"""Which flow run names Prefect made up, so that a name a person typed is kept and only a random one is replaced.

Prefect names a run itself in two ways: the server, for a run created without a name (a schedule, a quick run,
`prefect deployment run`, a flow called in code), picks a coolname `adjective-animal` slug; the UI's custom run
form fills its Run Name box with `<greek letter><digits>-<star or place>[-<word>]` (e.g. `tau42-vega-nebula`),
which the person may keep or overwrite.
"""

from __future__ import annotations

import re
from functools import cache

GREEK = (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau upsilon phi chi psi omega"
).split()
# The run form's suggestion: a Greek letter with an optional number, then one to three words (star names such as
# `canis-majoris` hold a dash themselves).
UI_SUGGESTION = re.compile(rf"(?:{'|'.join(GREEK)})\d*(?:-[a-z]+){{1,3}}")


# Any two lowercase words: what a server slug looks like when coolname's word lists cannot be read.
SLUG_SHAPE = re.compile(r"[a-z]+-[a-z]+")


@cache
def slug_words() -> tuple[frozenset[str], frozenset[str]] | None:
    """The adjectives and nouns of Prefect's two-word slugs (`prefect.utilities.names.generate_slug(2)`); None when
    the installed coolname keeps them elsewhere (its tables are not public API)."""
    try:
        import coolname

        [pairs] = coolname._default._lists[2]._lists  # the generator's one adjective x noun table for two words
        adjectives, nouns = pairs._lists
        return frozenset(adjectives), frozenset(nouns)
    except (ImportError, AttributeError, KeyError, TypeError, ValueError):
        return None


def is_generated_name(name: str | None) -> bool:
    """True for a name Prefect chose (a server slug or the run form's suggestion), False for one a person typed."""
    if not name:
        return True
    words, known = name.split("-"), slug_words()
    if known is None and SLUG_SHAPE.fullmatch(name):
        return True
    if known is not None and len(words) == 2 and words[0] in known[0] and words[1] in known[1]:
        return True
    return UI_SUGGESTION.fullmatch(name) is not None
