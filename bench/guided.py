"""Guided driven by the provider's counts vs guided as it was (every row searched, no counts) vs one-pass re-encoding,
in simulate mode: exact rows recovered, at what cost, and what the counts tell.

    .venv/bin/python bench/guided.py                  # 200 replies at T=0.7 and 200 at T=0, 128 new tokens
    .venv/bin/python bench/guided.py --rows 40 --quick

Samples SmolLM2 replies with their true ids and the counts a vLLM-shaped server reports (completion_tokens: the
reply's ids, end of turn included), plays them through the text API (decode, split, drop the ids, keep the counts),
rebuilds each by one-pass re-encoding (canonical), by `guided` searching every row without counts (the method before
counts, each row's whole context run; then with the leading tokens rows share run once), by `guided` with the counts
leaving rows already at their count as they are (`counted_rows: skip`), searching them at their ambiguous sites only,
where they hold enough (`ambiguous`, the default), and searching every row (`counted_rows: search`: rows at their
count searched at it), and classifies all against the true ids. Cost is set beside the extract stage's forward pass
over the same rows (same model, same threads, batched by length the way extract batches) and beside the every-row
search. Last, whether one forward over the count-matched rows could point at the few a search changes: how many hold
a candidate edit at all. The tables land in bench/results/guided.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tasks  # noqa: E402,F401  (offline defaults)
from bench.publish import Table, save  # noqa: E402
from bench.simulate_reencode import sharegpt_prompts  # noqa: E402
from tasks.config import GuidedConfig, TargetConfig  # noqa: E402
from tasks.extract.batching import pack_batches  # noqa: E402
from tasks.extract.transformers_backend import TransformersBackend  # noqa: E402
from tasks.reconstruct.guided import candidate_edits, first_needed, guide  # noqa: E402
from tasks.reconstruct.spans import Resplitter, to_search  # noqa: E402
from tasks.reconstruct.tree_scoring import Pass  # noqa: E402
from tasks.target_model.chat import resolve_end_of_turn  # noqa: E402
from tasks.target_model.loader import load_model, load_tokenizer  # noqa: E402
from tasks.validate.simulate import replay_rows  # noqa: E402
from tests.support.sample import sample_generations  # noqa: E402


def extract_seconds(model, rows: list[list[int]], batch_tokens: int) -> float:
    """The extract stage's forward work on these rows: hooks on, length-packed batches."""
    backend = TransformersBackend(model, name="bench")
    rows = sorted(rows, key=len, reverse=True)
    started = time.perf_counter()
    for batch in pack_batches([len(r) for r in rows], batch_tokens):
        backend.extract([rows[i] for i in batch])
    return time.perf_counter() - started


def guided_by_count(model, tokenizer, spans, cfg: GuidedConfig) -> tuple[list[list[int]], int]:
    """Each row's ids after the count-driven search, and how many rows it searched."""
    splitter = Resplitter(tokenizer)
    plans = [to_search(s.span, s.counts.expected_reply, cfg, splitter) for s in spans]
    searched = guide(model, tokenizer, [p for p in plans if p is not None], cfg)
    found = iter(searched)
    return [next(found).ids if p is not None else s.span.ids for s, p in zip(spans, plans, strict=True)], len(searched)


def timed(search):
    started = time.perf_counter()
    ids, searched = search()
    return ids, time.perf_counter() - started, searched


def count_figures(spans, classes: list[str]) -> dict:
    """Precision (count matched -> exact) and recall (not exact -> count mismatched) of the one-pass rebuilds."""
    matched = [s.counts.reply_ok for s in spans]
    pairs = list(zip(matched, classes, strict=True))
    return {
        "count_matched": sum(matched),
        "count_matched_exact": sum(m and k == "exact" for m, k in pairs),
        "not_exact": sum(k != "exact" for _, k in pairs),
        "not_exact_count_mismatched": sum(not m and k != "exact" for m, k in pairs),
    }


def one_forward_screen(model, tokenizer, spans, classes: list[str]) -> dict:
    """Whether one forward over the count-matched rows narrows what `search` must score: how many of them (and of
    their non-exact ones) hold a candidate edit whose first token alone could clear its bar."""
    cfg, splitter = GuidedConfig(counted_rows="search"), Resplitter(tokenizer)
    matched = [(s, k) for s, k in zip(spans, classes, strict=True) if s.counts.reply_ok]
    plans = [to_search(s.span, s.counts.expected_reply, cfg, splitter) for s, _ in matched]
    base = Pass(model, [p.ids for p in plans], [first_needed(p, cfg) for p in plans], cfg.batch_rows)
    held = [bool(candidate_edits(splitter, p, row, base, cfg)) for row, p in enumerate(plans)]
    wrong = [h for h, (_, k) in zip(held, matched, strict=True) if k != "exact"]
    return {"edit_held": sum(held), "edit_held_not_exact": sum(wrong), "count_matched_not_exact": len(wrong)}


def guided_tables(raw: dict) -> list[Table]:
    """One table of methods per temperature, and one of what the provider's counts tell."""
    columns = ["method", "exact", "exact share", "bpe_only", "semantic", "exact -> not", "rows searched"]
    columns += ["s per 1k tokens", "x extract", "x every-row guided"]
    tables = []
    for run in raw["runs"]:
        title = f"T = {run['temperature']}: {run['rows']} replies, rebuilt and classified against their true ids"
        table = Table(title, columns)
        for m in run["methods"]:
            c = m["classes"]
            sec = m["seconds"]  # 0 for one pass: nothing searched, nothing timed
            costs = (sec / run["kilotokens"], sec / run["extract_s"], sec / run["every_row_s"]) if sec else (None,) * 3
            table.add(
                m["method"], c["exact"], c["exact"] / run["rows"], c["bpe_only"], c["semantic"], m["exact_lost"],
                m["rows_searched"], *costs,
            )  # fmt: skip
        tables.append(table)
    counts = Table(
        "What the provider's counts tell (one-pass rebuilds)",
        ["T", "count matched", "of them exact", "not exact", "of them count mismatched"]
        + ["count matched, holding a candidate edit after one forward", "of the non-exact ones", "at the count after search"],
    )
    for run in raw["runs"]:
        f, screen = run["counts"], run["screen"]
        counts.add(
            f"{run['temperature']:g}", f["count_matched"], f["count_matched_exact"], f["not_exact"],
            f["not_exact_count_mismatched"], screen["edit_held"],
            f"{screen['edit_held_not_exact']} of {screen['count_matched_not_exact']}", run["at_count_after_search"],
        )  # fmt: skip
    return [*tables, counts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200, help="replies per temperature")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="40 rows per temperature, 64 new tokens")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.max_new_tokens = 40, 64

    import torch

    torch.set_num_threads(args.threads)
    target = TargetConfig()
    tokenizer, model = load_tokenizer(target), load_model(target)
    end_of_turn = resolve_end_of_turn(tokenizer, target)
    prompts = sharegpt_prompts(args.rows, 400)
    cfg = GuidedConfig()
    runs = []
    for temperature in (0.7, 0.0):
        rows = sample_generations(
            model, tokenizer, prompts, end_of_turn, max_new_tokens=args.max_new_tokens, temperature=temperature
        )
        spans = [r for r in replay_rows(tokenizer, rows, target, end_of_turn) if r.span is not None]
        tokens = sum(len(s.span.ids) for s in spans) / 1000
        extract_s = extract_seconds(model, [s.span.ids for s in spans], 4096)

        def every_row(shared: bool, spans=spans):
            return [g.ids for g in guide(model, tokenizer, [s.span for s in spans], cfg, shared=shared)], len(spans)

        methods = {
            "guided, every row, no counts (before counts)": timed(lambda: every_row(False)),
            "guided, every row, no counts, shared prefix run once": timed(lambda: every_row(True)),
            "guided by count, rows at their count left (skip)": timed(
                lambda spans=spans: guided_by_count(model, tokenizer, spans, cfg.model_copy(update={"counted_rows": "skip"}))
            ),
            "guided by count, rows at their count searched at ambiguous sites (ambiguous, default)": timed(
                lambda spans=spans: guided_by_count(model, tokenizer, spans, cfg)
            ),
            "guided by count, every row (search)": timed(
                lambda spans=spans: guided_by_count(model, tokenizer, spans, cfg.model_copy(update={"counted_rows": "search"}))
            ),
        }
        before = [s.verdict(tokenizer, s.span.ids).klass for s in spans]
        scored = []
        for name, (ids, seconds, n) in {"one pass": ([s.span.ids for s in spans], 0.0, 0), **methods}.items():
            after = [s.verdict(tokenizer, i).klass for s, i in zip(spans, ids, strict=True)]
            lost = sum(b == "exact" and a != "exact" for b, a in zip(before, after, strict=True))
            classes = {k: Counter(after)[k] for k in ("exact", "bpe_only", "semantic")}
            scored.append({"method": name, "classes": classes, "exact_lost": lost, "rows_searched": n, "seconds": seconds})
        with torch.inference_mode():
            screen = one_forward_screen(model, tokenizer, spans, before)
        counted = methods["guided by count, every row (search)"][0]
        reached = sum(s.counts.expected_reply == len(i) - s.span.start for s, i in zip(spans, counted, strict=True))
        runs.append(
            {
                "temperature": temperature,
                "rows": len(spans),
                "kilotokens": tokens,
                "extract_s": extract_s,
                "every_row_s": methods["guided, every row, no counts (before counts)"][1],
                "methods": scored,
                "counts": count_figures(spans, before),
                "screen": screen,
                "at_count_after_search": reached,
            }
        )
    raw = {"replies_per_temperature": args.rows, "max_new_tokens": args.max_new_tokens, "threads": args.threads}
    raw |= {"guided": cfg.model_dump(mode="json"), "runs": runs}
    notes = (
        f"SmolLM2-135M-Instruct, {args.rows} ShareGPT replies per temperature, at most {args.max_new_tokens} new tokens, "
        f"{args.threads} thread(s); the guided settings are in the file's raw figures."
    )
    save("guided", guided_tables(raw), raw=raw, notes=notes)


if __name__ == "__main__":
    main()
