"""Speed where a draft is served: vLLM with the target alone and with each draft, at each k, on the same prompts.

    DRAFTSMITH_VLLM_PYTHON=.venv-vllm/bin/python .venv/bin/python bench/quality.py --train-mode offline \
        --budgets 200000 --variants 3.1 p-eagle --ks 3 5 7 --serve-ks 1 2 3 4 5 6 7 --serve-reps 3

(`bench/quality.py --serve-ks` trains and scores the drafts, then calls `measure` here on their exports.)

One server without a draft stays up while the (draft, k) servers start beside it, `together` at a time; the
prompts then go through greedy, then each of those drafts in turn, `reps` times, so a drift of the machine reaches
both sides alike and one greedy pass is the baseline of several drafts. tokens/s is a pass's output tokens over
its summed request seconds (one request at a time, as a single user sees it); a pass's speed-up is the draft's
pass over the greedy pass that opened the round, and the spread over the passes is what the machine's noise
leaves. τ comes from vLLM's spec-decode counters over the passes. Each (draft, k) row is kept in the draft's run
folder (`serve-kK.json`) as soon as it is measured: a stopped sweep resumes where it stopped. Servers run with
--enforce-eager unless `compiled` (the CPU build recompiles at every start, 1.5-2.5 min on 2 cores).
"""

from __future__ import annotations

import json
import statistics
from contextlib import ExitStack
from pathlib import Path

from bench.publish import Table
from tasks.config import RunConfig
from tasks.evaluate.speculative import DecodeResult
from tasks.evaluate.stage import pooled_tau
from tasks.evaluate.vllm_engine import decode_on, served_length, speculative_options
from tasks.vllm_server import VllmServer


def tokens_per_s(decoded: list[tuple[DecodeResult, float]]) -> float:
    return sum(len(r.tokens) for r, _ in decoded) / sum(s for _, s in decoded)


def spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values), "values": values}


def measure(
    config: RunConfig,
    drafts: dict[str, Path],
    prompts: list[list[int]],
    eos_ids: set[int],
    ks: list[int],
    reps: int,
    out: Path,
    kept: dict[str, Path],
    together: int = 3,
    compiled: bool = False,
) -> list[dict]:
    """One row per (draft, k): τ by vLLM, greedy and speculative tokens/s per pass, the speed-up per pass, and
    whether every speculative reply was the greedy one. A row lands in its draft's `kept` folder as soon as it is
    measured, and a rerun with the same prompts and passes reuses it."""
    args = config.vllm.args if compiled else [*config.vllm.args, "--enforce-eager"]
    config = config.model_copy(
        update={
            "vllm": config.vllm.model_copy(update={"args": args}),
            "evaluate": config.evaluate.model_copy(update={"num_draft_tokens": max(ks)}),
        }
    )
    longest = served_length(config)
    rows = {(name, k): row for name in drafts for k in ks if (row := kept_serve(kept[name], k, reps, len(prompts), drafts[name]))}
    todo = [(name, k) for k in ks for name in drafts if (name, k) not in rows]
    if todo:
        with VllmServer(config, out / "greedy.log", [], longest) as greedy:
            decode_on(greedy, config, prompts[:1], eos_ids, 0)  # warm-up, not timed
            for start in range(0, len(todo), together):
                group = todo[start : start + together]
                measured = serve_group(config, greedy, drafts, group, prompts, eos_ids, reps, out, longest)
                for (name, k), row in zip(group, measured, strict=True):
                    rows[name, k] = row
                    kept_file(kept[name], k).write_text(json.dumps(row | {"export": export_stamp(drafts[name])}))
                    print(f"serve speed {name} k={k}: τ {row['tau']:.3f}, speed-up {row['speed_up']}", flush=True)
    return [rows[name, k] for name in drafts for k in ks]


def kept_file(folder: Path, k: int) -> Path:
    return folder / f"serve-k{k}.json"


def export_stamp(export: Path) -> list[int]:
    """The export's weights file as written (size, mtime): a draft trained again is served again."""
    stat = (export / "model.safetensors").stat()
    return [stat.st_size, stat.st_mtime_ns]


def kept_serve(folder: Path, k: int, reps: int, prompts: int, export: Path) -> dict | None:
    """A (draft, k) row measured before on the same export, number of prompts and passes."""
    path = kept_file(folder, k)
    row = json.loads(path.read_text()) if path.exists() else None
    same = row and row["prompts"] == prompts and len(row["speed_up"]["values"]) == reps
    return row if same and row.get("export") == export_stamp(export) else None


def serve_group(config, greedy, drafts, group, prompts, eos_ids, reps, out, longest) -> list[dict]:
    """Serve a few (draft, k) at once beside the greedy server: each pass decodes the prompts greedy, then with each
    draft in turn, so one greedy pass is the baseline for all of them."""
    with ExitStack() as stack:
        servers = []  # (server, k), in the group's order
        for name, k in group:
            log = out / f"{name}-k{k}.log"
            servers.append((stack.enter_context(VllmServer(config, log, speculative_options(drafts[name], k), longest)), k))
        for server, k in servers:
            decode_on(server, config, prompts[:1], eos_ids, k)
        passes = []
        for _ in range(reps):
            plain = decode_on(greedy, config, prompts, eos_ids, 0)
            passes.append((plain, [decode_on(server, config, prompts, eos_ids, k) for server, k in servers]))
    return [served_row(name, k, [(plain, spec[i]) for plain, spec in passes], len(prompts)) for i, (name, k) in enumerate(group)]


def served_row(name: str, k: int, passes: list, prompts: int) -> dict:
    greedy_tps = [tokens_per_s(plain) for plain, _ in passes]
    draft_tps = [tokens_per_s(spec) for _, spec in passes]
    return {
        "draft": name,
        "k": k,
        "tau": pooled_tau([r for _, spec in passes for r, _ in spec]),
        # Prompts whose reply equals greedy's in every pass: all of them in fp32; in bf16 vLLM's CPU kernels round a
        # verifying forward of k + 1 tokens otherwise than a one-token one, so a near-tie can go the other way and the
        # two replies part there.
        "identical": sum(all(plain[i][0].tokens == spec[i][0].tokens for plain, spec in passes) for i in range(prompts)),
        "prompts": prompts,
        "greedy_tokens_per_s": spread(greedy_tps),
        "speculative_tokens_per_s": spread(draft_tps),
        "speed_up": spread([d / g for d, g in zip(draft_tps, greedy_tps, strict=True)]),
    }


def speed_table(results: list[dict], reference: str) -> list[Table]:
    """One row per budget, k and shape: τ by draftsmith (paired gap to `reference` where measured), τ by vLLM, and
    vLLM's output tokens/s with the draft against the target alone."""
    served = sorted(
        ((r, m) for r in results for m in r.get("serve", [])), key=lambda rm: (rm[0]["tokens"], rm[1]["k"])
    )  # fmt: skip
    if not served:
        return []
    reps = len(served[0][1]["speed_up"]["values"])
    table = Table(
        f"τ by draftsmith and by vLLM, and tokens/s served by vLLM against the target alone ({reps} alternating passes)",
        ["target tokens", "k", "shape", "τ", f"gap to {reference}, paired", "± σ (paired)", "τ by vLLM",
         "greedy tokens/s", "speculative tokens/s", "speed-up", "min", "max", "replies = greedy's"],
        note="τ: draftsmith's own loop; the gap to the reference shape is bootstrapped over the same prompts. Speeds: mean "
        "over the passes; min and max: the passes' own speed-ups (each draft pass over the greedy pass that opened its "
        "round). replies = greedy's: prompts whose speculative reply was the greedy one in every pass; in bfloat16 "
        "vLLM's CPU kernels round a forward of k + 1 tokens otherwise than a one-token forward, so a near-tie can part them.",
    )  # fmt: skip
    for r, m in served:
        k, up = m["k"], m["speed_up"]
        table.add(
            r["tokens"], k, r["variant"], r.get(f"tau_k{k}"), r.get(f"gap_k{k}"), r.get(f"gap_sigma_k{k}"), m["tau"],
            m["greedy_tokens_per_s"]["mean"], m["speculative_tokens_per_s"]["mean"], up["mean"], up["min"], up["max"],
            f"{m['identical']}/{m['prompts']}",
        )  # fmt: skip
    return [table]
