"""What to buy: the draft each recipe of target replies trains, and the τ it buys per reply token, at equal trained tokens.

    export DRAFTSMITH_VLLM_PYTHON=.venv-vllm/bin/python         # the venv `make test-vllm` builds
    .venv/bin/python bench/recipes.py buy e --conversations 2000   # one recipe's replies, bought from vLLM on CPU
    .venv/bin/python bench/recipes.py arm e --budget 200000        # train and score one arm (a, b, b0, e, e0)
    .venv/bin/python bench/recipes.py table                        # prints the results file's table

Recipes, each its own generate run and journal under runs/bench-recipes (a rerun asks only for what it lacks, and no
reply is bought twice: a journal's replies keep the `--max-tokens` they were bought with), over the same ShareGPT
conversations before the held-out slice (`--conversations`):
  b   their first user turns, temperature 0.7
  b0  the same at temperature 0
  e   the conversations whole, the target answering each user turn after its own earlier replies
      (`regenerate: each_turn`), temperature 0.7
  e0  the same at temperature 0
Arm (a) trains on ShareGPT's own replies (bench/quality.py's pool); each other arm on its recipe's replies, rebuilt
from the server's ids. Every arm trains on rows whose trained tokens reach `--budget`, with bench/quality.py's
training settings, and decodes the same held-out prompts greedily at k = 3: `--held-out` conversations of the
held-out slice asked with their history and as many asked as first turns. Each row gives τ, its paired σ against
(a), the reply tokens bought and requests made for the rows the arm trained on (and how many were cut at
`--max-tokens`), and τ gained over the untrained draft per million reply tokens bought; with `--price IN OUT` (USD
per million prompt and reply tokens, as `generate.price_per_million` takes them) what those rows cost.
Results: bench/results/recipes.json, filled arm by arm.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tasks  # noqa: E402,F401  (offline defaults)
from bench.publish import Table, load, machine, save  # noqa: E402
from bench.quality import (  # noqa: E402
    HELD_OUT_OFFSET,
    SHAREGPT,
    batches_per_epoch,
    build_pool,
    held_out_sources,
    paired_gap,
    rows_for,
    run_settings,
    score,
    train,
)
from bench.target_replies import buy, engine_generate, first_turns  # noqa: E402
from tasks.config import RunConfig, load_config  # noqa: E402
from tasks.stages import stage_dir  # noqa: E402
from tasks.storage import read_table  # noqa: E402

WORK = Path("runs/bench-recipes").resolve()
BENCH = "recipes"
RESULTS = Path(__file__).resolve().parent / "results" / f"{BENCH}.json"
RECIPES = {
    "b": ("first user turns, T = 0.7", 0.7, "last"),
    "b0": ("first user turns, T = 0", 0.0, "last"),
    "e": ("whole conversations turn by turn, T = 0.7", 0.7, "each_turn"),
    "e0": ("whole conversations turn by turn, T = 0", 0.0, "each_turn"),
}
ARMS = {"a": "ShareGPT's own replies", **{name: recipe[0] for name, recipe in RECIPES.items()}}
K = 3
BOUGHT_MAX_TOKENS = 768  # the limit bench/target_replies.py's journal was bought with


def recipe_config(demo: RunConfig, recipe: str, base_url: str, args) -> RunConfig:
    """The generate run that buys a recipe's replies from the engine at `base_url`."""
    _, temperature, regenerate = RECIPES[recipe]
    if regenerate == "last":
        turns = first_turns(WORK / "first-turns.jsonl", args.conversations)
        source = {"name": "target", "format": "openai", "path": str(turns)}
    else:
        source = {"name": "target", "format": "sharegpt", "path": SHAREGPT, "limit": args.conversations}
        source |= {"max_prompt_chars": 1500, "regenerate": "each_turn"}
    generate = engine_generate([source], base_url, temperature, args)
    return RunConfig.model_validate(
        demo.model_dump(mode="json") | {"name": f"buy-{recipe}", "runs_dir": str(WORK), "generate": generate}
    )


def adopt_bought(config: RunConfig, args) -> int:
    """Recipe (b) asks what bench/target_replies.py bought (ShareGPT first turns, T = 0.7, the same limit): each of
    those replies whose prompt is one of (b)'s joins (b)'s journal under (b)'s id, so none is bought again."""
    from bench.target_replies import journal_path, restore_journal
    from tasks.generate.journal import JournalWriter, read_journal
    from tasks.generate.stage import to_request

    if args.max_tokens != BOUGHT_MAX_TOKENS:
        return 0
    restore_journal()
    theirs = read_journal(journal_path()).done
    prompts, ours, _ = to_request(config)
    adopted = 0
    with JournalWriter(stage_dir(config, "generate") / "journal.jsonl") as journal:
        for p in prompts.rows:
            record = theirs.get(f"sharegpt:{p['id'].split(':', 1)[-1]}")
            if p["id"] not in ours.done and record is not None and json.loads(record["messages"]) == json.loads(p["messages"]):
                journal.append(record | {"id": p["id"], "source": p["source"]})
                adopted += 1
    print(f"recipe b: {adopted} replies taken from bench/target_replies.py's journal")
    return adopted


def held_out_pool(demo: RunConfig, args) -> RunConfig:
    """Arm (a)'s rows and every arm's held-out prompts: ShareGPT's own replies, rebuilt once into runs/bench-recipes."""
    if args.conversations > HELD_OUT_OFFSET:
        raise SystemExit(f"--conversations {args.conversations} would reach the held-out rows (from {HELD_OUT_OFFSET})")
    return build_pool(demo, WORK, args.conversations, args.held_out, False, kinds=("history", "first"))


def arm_config(demo: RunConfig, pool: RunConfig, arm: str, budget: int, args, steps: int) -> RunConfig:
    """The arm's run: the rows whose trained tokens reach `budget`, the held-out prompts, the training settings."""
    rebuilt = pool if arm == "a" else bought_run(demo, arm)
    source = "train" if arm == "a" else "target"
    rows, tokens = rows_for(rebuilt, budget, source, "num_trained")
    if tokens < 0.98 * budget:  # the arms compare at equal trained tokens
        more = "--conversations" if arm == "a" else f"replies (buy {arm} with more --conversations)"
        raise SystemExit(f"arm ({arm}): {rows} rows hold {tokens} trained tokens, under --budget {budget}: it needs more {more}")
    rows_source = {"name": source, "path": str(stage_dir(rebuilt, "reconstruct")), "split": "train", "max_rows": rows}
    merge = demo.merge.model_dump(mode="json") | {"sources": [rows_source | {"drop_truncated": False}, *held_out_sources(pool)]}
    settings = run_settings(demo, args, steps, "3.1")
    settings["evaluate"] |= {"min_tau_gain": 0.0} if arm == "a" else {}  # (a) decodes the untrained draft too (no gate here)
    return RunConfig.model_validate(
        demo.model_dump(mode="json") | {"name": f"arm-{arm}-{budget}", "runs_dir": str(WORK), "merge": merge, **settings}
    )


def bought_run(demo: RunConfig, recipe: str) -> RunConfig:
    """The recipe's bought replies, rebuilt from the server's ids (reconstruct and validate run once)."""
    from tasks.reconstruct.stage import RECONSTRUCT
    from tasks.validate.stage import VALIDATE

    config = RunConfig.model_validate(
        demo.model_dump(mode="json")
        | {
            "name": f"buy-{recipe}",
            "runs_dir": str(WORK),
            "reconstruct": demo.reconstruct.model_dump(mode="json") | {"methods": ["server_ids"]},
        }
    )
    if not (stage_dir(config, "generate") / "summary.json").exists():
        raise SystemExit(f"recipe {recipe}: nothing bought yet (bench/recipes.py buy {recipe})")
    RECONSTRUCT.run(config)
    VALIDATE.run(config)
    return config


def bought(demo: RunConfig, arm: str, config: RunConfig) -> dict:
    """The reply tokens, prompt tokens and requests bought for the rows the arm trained on, and the cut ones."""
    trained = set(read_table("merged", stage_dir(config, "merge") / "train", columns=["id"]).column("id").to_pylist())
    if arm == "a":
        return {"rows": len(trained), "reply_tokens": None, "prompt_tokens": None, "requests": None, "cut": None}
    replies = read_table("generations", stage_dir(bought_run(demo, arm), "generate")).to_pylist()
    used = [r for r in replies if r["id"] in trained]
    return {
        "rows": len(trained),
        "reply_tokens": sum(r.get("completion_tokens") or 0 for r in used),
        "prompt_tokens": sum(r.get("prompt_tokens") or 0 for r in used),
        "requests": len(used),
        "cut": sum(r.get("finish_reason") == "length" for r in used),
    }


def run_arm(demo: RunConfig, arm: str, budget: int, args) -> dict:
    from tasks.extract.stage import EXTRACT
    from tasks.merge.stage import run_merge
    from tasks.target_model.loader import load_model

    pool = held_out_pool(demo, args)
    config = arm_config(demo, pool, arm, budget, args, 1)
    run_merge(config)
    per_epoch = batches_per_epoch(stage_dir(config, "merge"), demo)
    config = arm_config(demo, pool, arm, budget, args, max(10, round(args.epochs * per_epoch)))
    EXTRACT.run(config)
    target = load_model(demo.target, dtype="float32")
    result = {"arm": arm, "budget": budget} | bought(demo, arm, config)
    result = score(config, target, args, result | train(config, target, args, per_epoch))
    summary = json.loads((stage_dir(config, "evaluate") / "results.json").read_text())["summary"]
    result["untrained_tau"] = summary.get("untrained_acceptance_length")
    if arm != "a":
        result["gap_vs_a"] = paired_gap(*(WORK / f"arm-{name}-{budget}" / "eval" / "results.json" for name in (arm, "a")))
    return result


def stored() -> dict:
    return load(BENCH)["raw"] if RESULTS.exists() else {}


def record(arm: str, budget: int, result: dict, args) -> None:
    results = stored()
    results.setdefault(arm, {})[str(budget)] = result | {"machine": machine()}
    if args.price:
        results["price_per_million"] = {"input": args.price[0], "output": args.price[1]}
    save(BENCH, recipe_tables(results), raw=results)


def recipe_tables(results: dict) -> list[Table]:
    """Per budget and arm: τ, its gap to (a), what the rows cost to buy, and τ bought per million reply tokens."""
    price = results.get("price_per_million")
    columns = ["budget", "arm", "rows", "τ", "± σ", "τ − τ(a)", "± σ (paired)", "reply tokens bought", "requests", "cut"]
    columns += ["τ gain per M reply tokens"] + (["USD", "τ gain per USD"] if price else [])
    table = Table(
        f"τ at k = {K}, temperature 0, on the held-out prompts (half with their history, half first turns)",
        columns,
        note="τ gain: over the untrained draft, decoded on the same prompts by arm (a)'s run. Bought: the replies "
        "behind the rows the arm trained on (a conversation's turns each one request).",
    )
    for budget in sorted({b for arm in ARMS for b in results.get(arm, {})}, key=int):
        untrained = results.get("a", {}).get(budget, {}).get("untrained_tau")
        for arm in ARMS:
            r = results.get(arm, {}).get(budget)
            if r is None:
                continue
            gap = r.get("gap_vs_a") or (None, None)
            gain = (r["tau"] - untrained) / (r["reply_tokens"] / 1e6) if r["reply_tokens"] and untrained else None
            row = [int(budget), f"({arm}) {ARMS[arm]}", r["rows"], r["tau"], r[f"sigma_k{K}"], *gap]
            row += [r["reply_tokens"], r["requests"], r["cut"], gain]
            if price:
                usd = (r["prompt_tokens"] * price["input"] + r["reply_tokens"] * price["output"]) / 1e6 if r["requests"] else None
                row += [usd, (r["tau"] - untrained) / usd if usd and untrained else None]
            table.add(*row)
    return [table]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["buy", "arm", "table"])
    parser.add_argument("name", nargs="?", choices=sorted(ARMS))
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--conversations", type=int, default=HELD_OUT_OFFSET, help="ShareGPT conversations to ask")
    parser.add_argument("--budget", type=int, default=200_000, help="trained (loss-masked) tokens per arm")
    parser.add_argument("--max-tokens", type=int, default=768, help="reply length limit")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--held-out", type=int, default=24, help="held-out prompts of each kind (history, first turn)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--price", type=float, nargs=2, metavar=("IN", "OUT"), help="USD per million tokens")
    args = parser.parse_args()
    args.train_mode, args.ks, args.ttt_steps, args.vllm, args.dtype = "offline", [K], None, False, None
    args.prompts = 2 * args.held_out
    demo = load_config(args.config)
    if args.what == "buy":
        if args.name not in RECIPES:
            raise SystemExit(f"buy: a recipe, one of {sorted(RECIPES)}")
        WORK.mkdir(parents=True, exist_ok=True)
        if args.name == "b":
            adopt_bought(recipe_config(demo, "b", "http://127.0.0.1", args), args)
        buy(demo, lambda url: recipe_config(demo, args.name, url, args), WORK / f"vllm-{args.name}.log", args)
    elif args.what == "arm":
        record(args.name, args.budget, run_arm(demo, args.name, args.budget, args), args)
    else:
        for t in recipe_tables(stored()):
            print(f"\n{t.markdown()}")


if __name__ == "__main__":
    main()
