"""A draft from the target's own replies, bought as text, against one from its token ids: one table at equal
trained (loss-masked) tokens.

    export DRAFTSMITH_VLLM_PYTHON=.venv-vllm/bin/python          # the venv `make test-vllm` builds
    .venv/bin/python bench/target_replies.py generate --first-turns 700 --bfcl 60   # the committed table's replies
    .venv/bin/python bench/target_replies.py generate              # every readable first turn + BFCL, at most 768 tokens
    .venv/bin/python bench/target_replies.py arm b --budget 200000   # one arm; (a) (b) (c) (d)
    .venv/bin/python bench/target_replies.py speed --budget 1000000  # vLLM greedy vs speculative at k = 2, 3, 4
    .venv/bin/python bench/target_replies.py table                   # prints the results file's tables

`generate` buys the demo target's replies through the pipeline's own generate stage (its journal: a rerun asks only
for the prompts it lacks) from vLLM on CPU, started as `evaluate.engine: vllm` starts it (127.0.0.1, no seed,
`return_token_ids`): the first user turns of ShareGPT conversations before the held-out slice, and BFCL prompts
with their tools, at temperature 0.7 and at most `--max-tokens` reply tokens. It prints the engine's throughput
and how many replies the limit cut. The journal is copied, compressed, beside the results
(bench/results/target-replies-journal.jsonl.gz, committed): a fresh checkout starts from it, so the same command asks
for nothing already bought (and, with nothing missing, writes the replies' table without starting vLLM), and every
arm at one budget trains on the same replies (an arm refuses replies of another count than the arms at its budget
drew from: a journal that holds more is fine, the flags say which of its replies a run uses).

Each arm trains on rows whose trained tokens add up to `--budget`, with the settings, held-out prompts and decoding
of `bench/quality.py`'s curve (three epochs offline, k = 4, 64 new tokens, temperature 0):
(a) ShareGPT's own replies (`replies: dataset`, the curve's data); (b) the target's replies with the server's ids;
(c) the same replies as text only, re-encoded in one pass; (d) the same as text only, `guided` (driven by the
provider's counts). (c) and (d) are validated against (b)'s ids: their exact-row rates. Each arm's result lands in
bench/results/target-replies.json (committed), so the table fills arm by arm.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tasks  # noqa: E402,F401  (offline defaults)
from bench.publish import Plot, Table, load, machine, save  # noqa: E402
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
    vllm_summary,
)
from tasks.config import RunConfig, SourceConfig, load_config  # noqa: E402
from tasks.stages import stage_dir  # noqa: E402
from tasks.storage import read_table, write_table  # noqa: E402

WORK = Path("runs/bench-target").resolve()
BENCH = "target-replies"
RESULTS = Path(__file__).resolve().parent / "results" / f"{BENCH}.json"
# The bought replies, committed beside the results: the arms of one table train on the same replies, whichever
# machine runs them, and a fresh checkout asks the engine only for prompts the copy lacks.
JOURNAL_COPY = RESULTS.with_name("target-replies-journal.jsonl.gz")
BFCL = [f"pypi:bfcl-eval==2026.3.23/bfcl_eval/data/BFCL_v4_{name}.json" for name in ("live_simple", "live_multiple")]
# What each arm trains on: the reconstruct methods over the target's replies (None: ShareGPT's own replies).
ARMS = {"a": None, "b": ["server_ids"], "c": ["reencode"], "d": ["guided"]}
# The file fills arm by arm, on whichever machine each arm ran: its envelope names the last one, each run recorded
# since keeps its own, and the runs recorded before are named here.
NOTES = (
    "Filled arm by arm: the command, machine, date and commit above are the last recorded run's. Each run recorded "
    "since keeps its own machine in the raw figures, and each row names its hidden-state dtype (bf16 where the CPU "
    "computes it natively). The runs recorded before: arms (a), (b) and (c) at 200,000 trained tokens on an AMD EPYC "
    "without native bf16; the (b) rerun, (d), every arm at 1,000,000 and the vLLM speed runs on an AMD EPYC with "
    "AVX512-BF16, each as `arm X --budget N` or `speed --budget N` with `DRAFTSMITH_VLLM_PYTHON=.venv-vllm/bin/python`, "
    "on the replies of `generate --first-turns 700 --bfcl 60` (200,000) and `generate --first-turns 2800 --bfcl 100` "
    "(1,000,000)."
)
ARM_NAMES = {
    "a": "dataset replies (ShareGPT's)",
    "b": "target replies, server ids",
    "c": "target replies as text, one pass",
    "d": "target replies as text, guided",
}


def first_turns(path: Path, limit: int | None) -> Path:
    """The first user turn of each readable ShareGPT conversation before the held-out slice, as OpenAI rows."""
    from tasks.generate.sources import load_source

    source = SourceConfig(name="first", format="sharegpt", path=SHAREGPT, limit=HELD_OUT_OFFSET, max_prompt_chars=1500)
    rows = load_source(source).rows[:limit]
    with open(path, "w", encoding="utf-8") as out:
        for row in rows:
            first = next(m for m in json.loads(row["messages"]) if m["role"] == "user")
            out.write(json.dumps({"id": row["id"].split(":", 1)[-1], "messages": [first]}, ensure_ascii=False) + "\n")
    return path


def replies_config(demo: RunConfig, base_url: str, args) -> RunConfig:
    """The generate stage's run: ShareGPT first turns and BFCL prompts, asked of the engine at `base_url`."""
    turns = first_turns(WORK / "sharegpt-first-turns.jsonl", args.first_turns)
    sources = [{"name": "sharegpt", "format": "openai", "path": str(turns)}]
    sources += [{"name": f"bfcl{i}", "format": "bfcl", "path": path, "limit": args.bfcl} for i, path in enumerate(BFCL)]
    generate = engine_generate(sources, base_url, 0.7, args)
    return RunConfig.model_validate(
        demo.model_dump(mode="json") | {"name": "replies", "runs_dir": str(WORK), "generate": generate}
    )


def engine_generate(sources: list[dict], base_url: str, temperature: float, args) -> dict:
    """The generate section that asks the vLLM server at `base_url` for replies with their token ids (no seed)."""
    request = {"temperature": temperature, "max_tokens": args.max_tokens, "return_token_ids": True, "seed": None}
    api = {"base_url": f"{base_url}/v1", "provider": "vllm", "api_key_env": None, "concurrency": args.concurrency}
    return {"sources": sources, "api": api, "request": request, "max_error_rate": 0.02}


def reply_tokens(config: RunConfig) -> tuple[int, int, int]:
    """(replies, reply tokens, replies cut at the limit) in the run's journal so far."""
    from tasks.generate.journal import read_journal

    done = read_journal(stage_dir(config, "generate") / "journal.jsonl").done.values()
    return len(done), sum(r.get("completion_tokens") or 0 for r in done), sum(r.get("finish_reason") == "length" for r in done)


def journal_path() -> Path:
    return stage_dir(RunConfig(name="replies", runs_dir=WORK), "generate") / "journal.jsonl"


def restore_journal() -> None:
    """Start from the committed copy where this machine has no journal yet."""
    journal = journal_path()
    if journal.exists() or not JOURNAL_COPY.exists():
        return
    journal.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(JOURNAL_COPY, "rb") as copy, open(journal, "wb") as out:
        shutil.copyfileobj(copy, out)
    print(f"journal restored from {JOURNAL_COPY.name}")


def keep_journal() -> None:
    JOURNAL_COPY.parent.mkdir(parents=True, exist_ok=True)
    with open(journal_path(), "rb") as journal, gzip.GzipFile(JOURNAL_COPY, "wb", mtime=0) as copy:
        shutil.copyfileobj(journal, copy)


def generate(demo: RunConfig, args) -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    restore_journal()
    try:
        buy(demo, lambda url: replies_config(demo, url, args), WORK / "vllm-generate.log", args)
    finally:
        if journal_path().exists():
            keep_journal()


def buy(demo: RunConfig, configure, log: Path, args) -> None:
    """Ask vLLM on CPU for the replies the run `configure(base_url)` lacks (its journal: nothing is bought twice); with
    nothing missing, the replies' table is written without starting the engine."""
    from tasks.generate.stage import run_generate, to_request
    from tasks.vllm_server import VllmServer

    # BFCL prompts carry tools with tool_choice "auto", which vLLM serves only with a tool-call parser: the demo
    # target writes Hermes calls (its `chatml` format).
    tools = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    bought = configure("http://127.0.0.1")
    prompts, _, missing = to_request(bought)
    if not missing:
        run_generate(bought)
        print(f"journal: all {len(prompts.rows)} prompts already bought (of {reply_tokens(bought)[0]}); nothing requested")
        return
    server = VllmServer(demo, log, tools, demo.target.max_length + args.max_tokens)
    with server:
        config = configure(server.url)
        before = reply_tokens(config)
        started = time.perf_counter()
        run_generate(config)
        seconds = time.perf_counter() - started
    rows, tokens, cut = reply_tokens(config)
    print(f"vLLM ready in {server.startup_s:.0f} s; {rows - before[0]} replies bought this run in {seconds:.0f} s, ")
    print(f"{(tokens - before[1]) / seconds:.0f} reply tokens/s at {args.concurrency} requests in flight")
    print(f"journal: {rows} replies, {tokens} reply tokens; {cut} ({cut / max(1, rows):.0%}) cut at {args.max_tokens} tokens")


def arm_config(demo: RunConfig, pool: RunConfig, arm: str, budget: int, args, steps: int) -> RunConfig:
    """The arm's run: its reconstruct methods over the bought replies (or the pool's dataset replies for (a)), then
    the rows whose trained tokens reach `budget`, the fixed held-out prompts, the curve's training settings."""
    name = f"arm-{arm}-{budget}"
    if ARMS[arm] is None:
        rows, tokens = rows_for(pool, budget, "train", "num_trained")
        train = {"name": "train", "path": str(stage_dir(pool, "reconstruct")), "split": "train", "max_rows": rows}
        more = f"a --pool-rows up to {HELD_OUT_OFFSET}, where the held-out slice begins, or a smaller --budget"
    else:
        rebuilt = RunConfig.model_validate(demo.model_dump(mode="json") | {"name": f"arm-{arm}", "runs_dir": str(WORK)})
        rows, tokens = rows_for(rebuilt, budget, "target", "num_trained")
        train = {"name": "target", "path": str(stage_dir(rebuilt, "reconstruct")), "split": "train", "max_rows": rows}
        more = "more replies (generate with larger --first-turns or --bfcl)"
    # The arms compare at equal trained tokens: within 2% (the last row's overshoot alone reached that at 200k).
    if tokens < 0.98 * budget:
        raise SystemExit(f"arm ({arm}): its {rows} rows hold {tokens} trained tokens, under --budget {budget}: it needs {more}")
    train |= {"drop_truncated": False}
    merge = demo.merge.model_dump(mode="json") | {"sources": [train, *held_out_sources(pool)]}
    return RunConfig.model_validate(
        demo.model_dump(mode="json") | {"name": name, "runs_dir": str(WORK), "merge": merge, **run_settings(demo, args, steps)}
    )


def rebuild(demo: RunConfig, arm: str) -> dict:
    """(b), (c), (d): reconstruct and validate the bought replies with the arm's methods, all in one source."""
    from tasks.reconstruct.stage import RECONSTRUCT
    from tasks.validate.stage import VALIDATE

    replies = stage_dir(RunConfig(name="replies", runs_dir=WORK), "generate")
    config = RunConfig.model_validate(
        demo.model_dump(mode="json")
        | {
            "name": f"arm-{arm}",
            "runs_dir": str(WORK),
            "reconstruct": demo.reconstruct.model_dump(mode="json") | {"methods": ARMS[arm]},
        }
    )
    bought = stage_dir(config, "generate")
    bought.parent.mkdir(parents=True, exist_ok=True)
    if not bought.exists():  # one source for every reply generate wrote: its rows drawn in one order
        rows = read_table("generations", replies).to_pylist()
        write_table("generations", [r | {"source": "target"} for r in rows], bought / "part-00000.parquet")
    elif (n := replies_in(bought)) != (m := replies_in(replies)):
        raise SystemExit(f"{bought.parent} was rebuilt from {n} replies, generate last wrote {m}: remove it to rebuild")
    started = time.perf_counter()
    rebuilt = RECONSTRUCT.run(config)
    seconds = time.perf_counter() - started
    checked = VALIDATE.run(config)
    return {"rebuild_s": round(seconds, 1), "classes": checked["classes"], "counts": rebuilt.get("count_verdicts")}


def trained_classes(arm: str, budget: int) -> dict:
    """(c), (d): how many of the arm's trained rows, and of their trained tokens, are exact or BPE-only against the
    server's ids (the validation check of the arm's rebuild)."""
    checks = read_table("validation", stage_dir(RunConfig(name=f"arm-{arm}", runs_dir=WORK), "validate"))
    klass = {r["id"]: r["klass"] for r in checks.to_pylist() if r["mode"] == "check"}
    trained = read_table("merged", WORK / f"arm-{arm}-{budget}" / "merged" / "train", columns=["id", "num_trained"])
    rows, tokens = Counter(), Counter()
    for r in trained.to_pylist():
        rows[klass[r["id"]]] += 1
        tokens[klass[r["id"]]] += r["num_trained"]
    return {"trained_rows_by_class": dict(rows), "trained_tokens_by_class": dict(tokens)}


def replies_in(generations: Path) -> int:
    """How many replies a generations table holds."""
    return read_table("generations", generations, columns=["id"]).num_rows


def same_replies(budget: int) -> int:
    """The replies `generate` last wrote out (its flags' prompts, whatever else the journal holds): every arm on the
    target's replies at one budget must share their count, since each draws its rows from them in one hashed order,
    and another set of replies would give them other rows."""
    replies = replies_in(journal_path().parent)
    results = stored()
    for arm in ("b", "c", "d"):
        drawn = results.get(arm, {}).get(str(budget), {}).get("journal_replies", replies)
        if drawn != replies:
            raise SystemExit(
                f"{RESULTS}: arm ({arm}) at {budget} tokens was drawn from {drawn} bought replies, generate last "
                f"wrote {replies}: run generate with that arm's flags, or rerun every arm at {budget}"
            )
    return replies


def run_arm(demo: RunConfig, arm: str, budget: int, args) -> dict:
    from tasks.extract.stage import EXTRACT
    from tasks.merge.stage import run_merge
    from tasks.target_model.loader import load_model

    pool = build_pool(demo, Path("runs/bench-quality").resolve(), args.pool_rows, args.held_out, False)
    rebuilt = {}
    if ARMS[arm] is not None:
        rebuilt = {"journal_replies": same_replies(budget)} | rebuild(demo, arm)
    config = arm_config(demo, pool, arm, budget, args, 1)
    run_merge(config)
    manifest = json.loads((stage_dir(config, "merge") / "manifest.json").read_text())
    source = next(iter(manifest["counts"]))
    per_epoch = batches_per_epoch(stage_dir(config, "merge"), demo)
    config = arm_config(demo, pool, arm, budget, args, max(10, round(args.epochs * per_epoch)))
    started = time.perf_counter()
    EXTRACT.run(config)
    extract_s = time.perf_counter() - started
    target = load_model(demo.target, dtype="float32")
    trained_tokens = int(
        sum(read_table("merged", stage_dir(config, "merge") / "train", columns=["num_trained"]).column(0).to_pylist())
    )
    result = {"arm": arm, "budget": budget, "rows": manifest["counts"][source]["train"], "trained_tokens": trained_tokens}
    result |= {"tokens": manifest["counts"][source]["train_tokens"], "extract_s": round(extract_s, 1), **rebuilt}
    # bf16 where the CPU has it natively, fp32 elsewhere: arms on other machines differ by more than their σ.
    result["hidden_dtype"] = json.loads((stage_dir(config, "extract") / "meta.json").read_text())["dtype"]
    if arm in ("c", "d"):
        result |= trained_classes(arm, budget)
    return score(config, target, args, result | train(config, target, args, per_epoch))


def speed(demo: RunConfig, budget: int, args) -> dict:
    """vLLM's own tokens/s, greedy vs speculative with arm (b)'s draft at k = 2, 3 and 4, beside draftsmith's loop."""
    from tasks.evaluate.stage import evaluate_draft
    from tasks.target_model.loader import load_model

    steps = stored()["b"][str(budget)]["steps"]
    pool = build_pool(demo, Path("runs/bench-quality").resolve(), args.pool_rows, args.held_out, False)
    config = arm_config(demo, pool, "b", budget, args, steps)
    target, out = load_model(demo.target, dtype="float32"), {}
    for k in (2, 3, 4):
        decoding = config.model_copy(update={"evaluate": config.evaluate.model_copy(update={"num_draft_tokens": k})})
        ours = evaluate_draft(decoding, target, out=stage_dir(config, "evaluate").with_name(f"eval-speed-k{k}"))
        theirs = vllm_summary(config, k)
        out[k] = {
            "tau": ours["acceptance_length"],
            "greedy_tokens_per_s": ours["greedy_tokens_per_s"],
            "speculative_tokens_per_s": ours["speculative_tokens_per_s"],
            "vllm_tau": theirs["acceptance_length"],
            "vllm_greedy_tokens_per_s": theirs["greedy_tokens_per_s"],
            "vllm_speculative_tokens_per_s": theirs["speculative_tokens_per_s"],
        }
    return out


def stored() -> dict:
    """Every arm recorded so far (the results file's raw figures), by arm and budget; {} before the first."""
    return load(BENCH)["raw"] if RESULTS.exists() else {}


def record(key: str, budget: int, result: dict) -> None:
    """An arm's result at a budget, with the machine it ran on; a rerun is kept beside the first run (the other arms'
    paired gaps were taken against that one), which stays the table's row."""
    results = stored()
    result["machine"] = machine()
    earlier = results.setdefault(key, {}).get(str(budget))
    if earlier is not None and key in ARMS:
        earlier.setdefault("reruns", []).append(result)
    else:
        results[key][str(budget)] = result
    save(BENCH, replies_tables(results), raw=results, plots=replies_plot(results), notes=NOTES)


def gap_to_b(arm: str, budget: int) -> tuple[float, float]:
    """τ(arm) − τ(b) on the same held-out prompts, and its σ by a paired bootstrap."""
    return paired_gap(*(WORK / f"arm-{name}-{budget}" / "eval" / "results.json" for name in (arm, "b")))


def arm_runs(results: dict) -> list[tuple[str, dict, int]]:
    """(arm, result, n) for every run, budget by budget and arm by arm: n = 0 for the first run, 1+ for its reruns."""
    firsts = sorted(((arm, r) for arm in ARMS for r in results.get(arm, {}).values()), key=lambda p: p[1]["budget"])
    return [(arm, r, n) for arm, first in firsts for n, r in enumerate((first, *first.get("reruns", [])))]


def replies_tables(results: dict) -> list[Table]:
    """τ per arm; the text arms' rebuilds checked against the server's ids; the paired gaps to (b); vLLM's speed."""
    taus = Table(
        "τ per arm at k = 4, temperature 0, on the held-out prompts",
        ["budget", "arm", "hidden states", "trained tokens", "rows", "prompts", "τ", "± σ", "acceptance 1..4"]
        + ["τ_sim", "train s"],
    )
    checked = Table(
        "Text arms: rebuilt replies checked against the server's ids",
        ["budget", "arm", "replies checked", "exact", "bpe_only", "semantic", "exact share", "trained rows"]
        + ["trained rows BPE-only", "rebuild s"],
    )
    notes = []
    for arm, r, n in arm_runs(results):
        name = f"({arm}) {ARM_NAMES[arm]}" + (" (rerun)" if n else "")
        accept = " ".join(f"{a:.2f}" for a in r["per_position"])
        taus.add(
            r["budget"], name, r.get("hidden_dtype"), r["trained_tokens"], r["rows"], r["prompts"], r["tau"],
            r["sigma_k4"], accept, r["tau_sim"], r["train_s"],
        )  # fmt: skip
        notes += [f"{name} at {r['budget']:,}: {r[key]}." for key in ("timing_note", "rebuild_note") if key in r]
        classes = r.get("classes") or {}
        verified = sum(classes.get(k, 0) for k in ("exact", "bpe_only", "semantic"))
        if arm in ("c", "d") and verified:
            bpe_rows = r.get("trained_rows_by_class", {}).get("bpe_only")
            checked.add(
                r["budget"], name, verified, classes["exact"], classes["bpe_only"], classes["semantic"],
                classes["exact"] / verified, r["rows"], bpe_rows, r.get("rebuild_s"),
            )  # fmt: skip
    taus.note = " ".join(notes)
    gaps = Table(
        "Paired gaps to (b): τ(arm) − τ(b) over the prompts both scored",
        ["budget", "arm", "τ(arm) − τ(b)", "± σ (paired bootstrap)", "(b)'s τ"],
        note="(b)'s τ: the (b) run on the same machine the gap was taken against; `-`: the first (b) run at that budget.",
    )
    for arm, r, _ in arm_runs(results):
        if "tau_gap_vs_b" in r:
            gaps.add(r["budget"], f"({arm}) {ARM_NAMES[arm]}", *r["tau_gap_vs_b"], r.get("b_tau"))
    tables = [taus, checked, gaps]
    for budget, by_k in sorted(results.get("speed", {}).items(), key=lambda p: int(p[0])):
        speed = Table(
            f"Arm (b)'s draft at {int(budget):,} trained tokens: greedy vs speculative tokens/s, vLLM and draftsmith's loop",
            ["k", "τ (vLLM)", "vLLM greedy", "vLLM speculative", "vLLM speed-up"]
            + ["τ (draftsmith)", "draftsmith greedy", "draftsmith speculative", "draftsmith speed-up"],
        )
        for k, v in sorted(by_k.items()):
            vllm = [v["vllm_tau"], v["vllm_greedy_tokens_per_s"], v["vllm_speculative_tokens_per_s"]]
            ours = [v["tau"], v["greedy_tokens_per_s"], v["speculative_tokens_per_s"]]
            speed.add(int(k), *vllm, vllm[2] / vllm[1], *ours, ours[2] / ours[1])
        tables.append(speed)
    return tables


def table() -> None:
    """The results file's tables, printed: nothing is measured or written."""
    for t in replies_tables(stored()):
        print(f"\n{t.markdown()}")


def replies_plot(results: dict) -> list[Plot]:
    """τ ± σ per arm, one series per budget and hidden-state dtype (reruns beside their first run)."""
    runs = arm_runs(results)
    budgets = sorted({r["budget"] for _, r, _ in runs})
    series = []
    for b, budget in enumerate(budgets):
        shift = (b - (len(budgets) - 1) / 2) * 0.15
        at_budget = [(arm, r, n) for arm, r, n in runs if r["budget"] == budget]
        for dtype in sorted({r.get("hidden_dtype", "float32") for _, r, _ in at_budget}):
            picked = [(arm, r, n) for arm, r, n in at_budget if r.get("hidden_dtype", "float32") == dtype]
            series.append(
                {
                    "label": f"{budget:,} trained tokens, {dtype} hidden states",
                    "x": [list(ARMS).index(arm) + shift + 0.12 * n for arm, _, n in picked],
                    "y": [r["tau"] for _, r, _ in picked],
                    "yerr": [r["sigma_k4"] for _, r, _ in picked],
                }
            )
    ticks = [f"({arm})\n{ARM_NAMES[arm]}" for arm in ARMS]
    return [Plot("τ per arm", "", "τ at k=4 (± bootstrap σ)", series, x_ticks=ticks, lines=False)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["generate", "arm", "speed", "table"])
    parser.add_argument("arm", nargs="?", choices=sorted(ARMS))
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--budget", type=int, default=200_000, help="trained (loss-masked) tokens per arm")
    parser.add_argument("--first-turns", type=int, default=None, help="ShareGPT first turns to ask (default: all readable)")
    parser.add_argument("--bfcl", type=int, default=None, help="BFCL prompts to ask from each file (default: all)")
    parser.add_argument("--max-tokens", type=int, default=768, help="reply length limit")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--pool-rows", type=int, default=3_600, help="ShareGPT rows of arm (a)'s pool (bench/quality.py's)")
    parser.add_argument("--held-out", type=int, default=8)
    parser.add_argument("--epochs", type=float, default=3.0)
    args = parser.parse_args()
    # The curve's training and evaluation settings (bench/quality.py --train-mode offline --epochs 3): 16 held-out prompts
    # decoded at k = 4, 64 new tokens.
    args.train_mode, args.ks, args.prompts, args.new_tokens, args.ttt_steps, args.vllm = "offline", [4], 16, 64, None, False
    demo = load_config(args.config)
    if args.what == "generate":
        generate(demo, args)
    elif args.what == "arm":
        result = run_arm(demo, args.arm, args.budget, args)
        b_eval = WORK / f"arm-b-{args.budget}" / "eval" / "results.json"
        if args.arm != "b" and b_eval.exists():  # against the (b) run on this machine, named by its τ
            result["tau_gap_vs_b"] = gap_to_b(args.arm, args.budget)
            result["b_tau"] = json.loads(b_eval.read_text())["summary"]["acceptance_length"]
        record(args.arm, args.budget, result)
    elif args.what == "speed":
        record("speed", args.budget, speed(demo, args.budget, args))
    else:
        table()


if __name__ == "__main__":
    main()
