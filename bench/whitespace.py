"""Whitespace a provider stripped at the parser joins of Kimi-K2.5 replies: how much comes back, and never wrongly.

    .venv/bin/python bench/whitespace.py              # 240 real prompts
    .venv/bin/python bench/whitespace.py --rows 60

Rows are Kimi-K2.5 replies to ShareGPT and BFCL prompts on the tokenizer stand-in (tests/support/stripped.py): the
model writes its own whitespace at each join, the provider returns every channel stripped and counts
`completion_tokens` on what the model wrote. Rebuilt with `reencode`, each row is kept (on its count as returned:
whole, or stripped to as many tokens, unseen), restored (to what the model wrote), wrongly restored, or left off its
count: with every fourth row carrying its ids (the source's habit is read from them), the model keeping its habit
on every row or straying from it at one join on a share of rows; and with no ids.
Writes bench/results/whitespace.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tasks  # noqa: E402,F401  (offline defaults)
from bench.publish import Table, save  # noqa: E402
from tasks.config import TargetConfig  # noqa: E402
from tasks.target_model.loader import load_tokenizer  # noqa: E402
from tests.support.kimi_target import kimi_model_dir  # noqa: E402
from tests.support.stripped import HABIT, outcomes, stripped_rows  # noqa: E402

OUTCOMES = ("kept", "unseen", "restored", "wrong", "left", "too_long")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=240)
    parser.add_argument("--strays", type=float, default=0.2, help="share of rows off the model's habit at one join")
    args = parser.parse_args()
    directory = kimi_model_dir(Path(tempfile.mkdtemp(prefix="draftsmith-whitespace-")) / "kimi-k2.5")
    target = TargetConfig(model="kimi-k2.5", source="hf_dir", path=directory, trust_remote_code=True)
    tokenizer = load_tokenizer(target)
    runs = []
    for with_ids_every, strays in ((4, 0.0), (4, args.strays), (0, 0.0)):
        pairs = stripped_rows(tokenizer, args.rows, with_ids_every, strays)
        started = time.perf_counter()
        found = outcomes(tokenizer, target, pairs)
        run = {"with_ids_every": with_ids_every, "strays": strays, "rebuild_s": time.perf_counter() - started}
        runs.append(run | {k: found[k] for k in OUTCOMES})
    raw = {"rows": args.rows, "habit": list(HABIT), "runs": runs}
    table = Table(
        f"Kimi-K2.5 replies stripped at their parser joins, {args.rows} rows",
        ["rows with ids", "rows off the habit", *OUTCOMES, "rebuild s"],
        note="kept: on its count as returned; unseen: stripped to as many tokens (the count cannot see it); left: off "
        "its count, unsettled; too_long: over target.max_length (a long tool list), not rebuilt. The model's habit: "
        "none after `<think>`, a newline before `</think>`, two before the content, one before the tool calls; a row "
        "off it has other whitespace (or none) at one join.",
    )
    for run in runs:
        share = f"every {run['with_ids_every']}th" if run["with_ids_every"] else "none"
        table.add(share, run["strays"], *(run[k] for k in OUTCOMES), run["rebuild_s"])
    save("whitespace", [table], raw=raw)


if __name__ == "__main__":
    main()
