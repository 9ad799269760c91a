"""The evaluate stage: speculative vs plain greedy decoding on held-out prompts, τ table, histogram, gate."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
from prefect import task

from tasks.config import RunConfig
from tasks.contracts import quarantine_row
from tasks.draft.export import load_export, read_export_config
from tasks.draft.train import untrained_draft
from tasks.evaluate.speculative import DecodeResult, acceptance_by_position, greedy_decode, speculative_decode
from tasks.failpoints import failpoint
from tasks.gates import enforce
from tasks.image_artifact import publish_image
from tasks.progress_log import ProgressLog
from tasks.stages import stage_dir
from tasks.storage import atomic_path, read_table, write_table


def held_out_prompts(config: RunConfig) -> tuple[list[dict], list[dict]]:
    """Eval-split rows cut before their first trained token; rows with no trained token are quarantined."""
    rows = read_table("merged", stage_dir(config, "merge") / "eval", columns=["id", "source", "input_ids", "loss_mask"])
    prompts, dropped = [], []
    for row in sorted(rows.to_pylist(), key=lambda r: r["id"]):
        first = next((i for i, m in enumerate(row["loss_mask"]) if m), None)
        if not first:
            dropped.append(
                quarantine_row(
                    "evaluate",
                    row["id"],
                    row["source"],
                    "no_prompt",
                    "no loss-masked token after a non-empty prompt",
                    field="loss_mask",
                )
            )
            continue
        prompts.append({"id": row["id"], "prompt_ids": row["input_ids"][:first]})
    return prompts[: config.evaluate.num_prompts], dropped


def stop_ids(config: RunConfig) -> set[int]:
    """Ids that end a reply: the target's end-of-turn tokens (from its chat format) and eos."""
    from tasks.target_model.chat import resolve_end_of_turn
    from tasks.target_model.loader import load_tokenizer

    tokenizer = load_tokenizer(config.target)
    ids = set(resolve_end_of_turn(tokenizer, config.target).ids)
    return ids | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())


Decoded = tuple[list[tuple[DecodeResult, float]], list[tuple[DecodeResult, float]], list[DecodeResult | None]]


def decode_with_transformers(config: RunConfig, prompts: list[dict], target, export_dir: Path, eos_ids: set[int]) -> Decoded:
    """draftsmith's own loop: per prompt greedy, then speculative with the export, then with the untrained draft
    (only when the gate compares them); each with its seconds."""
    ec = config.evaluate
    embed, lm_head = target.get_input_embeddings().weight.detach(), target.get_output_embeddings().weight.detach()
    draft = load_export(export_dir, embed).to(embed.device)
    _, layer_ids = read_export_config(export_dir)
    baseline = untrained_draft(config, draft, embed, lm_head) if ec.min_tau_gain is not None else None
    plain, spec, untrained = [], [], []

    def note() -> str:
        done = [r for r, _ in spec[: len(untrained)]]  # prompts finished (the untrained draft's decode comes last)
        return f"τ so far {pooled_tau(done):.3f} at k={ec.num_draft_tokens}" if done else "decoding the first prompt"

    with ProgressLog("evaluate", len(prompts), "prompts", note=note) as progress:
        for p in prompts:
            started = time.perf_counter()
            tokens = greedy_decode(target, p["prompt_ids"], ec.max_new_tokens, eos_ids)
            plain.append((DecodeResult(tokens=tokens), time.perf_counter() - started))
            args = (p["prompt_ids"], layer_ids, ec.num_draft_tokens, ec.max_new_tokens, eos_ids)
            started = time.perf_counter()
            result = speculative_decode(target, draft, *args)
            spec.append((result, time.perf_counter() - started))
            untrained.append(speculative_decode(target, baseline, *args) if baseline is not None else None)
            failpoint("evaluate.prompt")
            progress.advance()
    return plain, spec, untrained


def decode_with_vllm(config: RunConfig, prompts: list[dict], export_dir: Path, eos_ids: set[int], out: Path) -> Decoded:
    """vLLM servers without a draft, with the export and (when the gate compares them) with the untrained draft,
    exported as the trained one is (evaluate/untrained-export)."""
    from tasks.draft.export import export_like
    from tasks.draft.train import load_target_pieces
    from tasks.evaluate.vllm_engine import decode_served, speculative_options

    k = config.evaluate.num_draft_tokens
    ids = [p["prompt_ids"] for p in prompts]
    plain = decode_served(config, out / "vllm-greedy.log", [], ids, eos_ids)
    spec = decode_served(config, out / "vllm-draft.log", speculative_options(export_dir, k), ids, eos_ids)
    untrained: list[DecodeResult | None] = [None] * len(prompts)
    if config.evaluate.min_tau_gain is not None:
        pieces = load_target_pieces(config, keep_model=False)
        baseline = untrained_draft(config, load_export(export_dir, pieces.embed), pieces.embed, pieces.lm_head)
        baseline_dir = export_like(baseline.state_dict(), export_dir, out / "untrained-export")
        served = decode_served(config, out / "vllm-untrained.log", speculative_options(baseline_dir, k), ids, eos_ids)
        untrained = [result for result, _ in served]
    return plain, spec, untrained


def prompt_rows(prompts: list[dict], decoded: Decoded) -> list[dict]:
    """Per prompt: τ of the draft and of the untrained one, whether the output is greedy's, and the seconds."""
    rows = []
    for p, (plain, plain_s), (spec, spec_s), untrained in zip(prompts, *decoded, strict=True):
        mismatch = next((i for i, (a, b) in enumerate(zip(plain.tokens, spec.tokens, strict=False)) if a != b), None)
        if mismatch is None and len(plain.tokens) != len(spec.tokens):
            mismatch = min(len(plain.tokens), len(spec.tokens))
        rows.append(
            {
                "id": p["id"],
                "prompt_tokens": len(p["prompt_ids"]),
                "new_tokens": len(spec.tokens),
                "target_forwards": spec.target_forwards,
                "acceptance_length": spec.acceptance_length,
                "untrained_acceptance_length": untrained.acceptance_length if untrained else None,
                "identical": mismatch is None,
                "first_mismatch": mismatch,
                "greedy_tokens": len(plain.tokens),
                "greedy_s": round(plain_s, 3),
                "speculative_s": round(spec_s, 3),
            }
        )
    return rows


def pooled_tau(results) -> float | None:
    """Tokens per verifying target forward over all prompts (None where they were not decoded)."""
    if any(r is None for r in results):
        return None
    return sum(sum(r.accepted) + len(r.accepted) for r in results) / max(1, sum(r.target_forwards for r in results))


def plot_acceptance(results, per_position: list[float], path: Path) -> Path:
    """Histogram of accepted draft tokens per target forward, and acceptance by draft position."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = max((r.proposed for r in results), default=1)
    accepted = [n for r in results for n in r.accepted]
    fig, (ax_hist, ax_pos) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax_hist.hist(accepted, bins=[x - 0.5 for x in range(k + 2)], rwidth=0.8, color="tab:blue")
    ax_hist.set(xlabel="draft tokens accepted per target forward", ylabel="rounds", title="acceptance histogram")
    ax_pos.bar(range(1, len(per_position) + 1), per_position, color="tab:green")
    ax_pos.set(xlabel="draft position", ylabel="share of rounds accepted", ylim=(0, 1), title="per-position acceptance")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return path


def figure(value: float | None, spec: str = ".3f") -> str:
    return "not measured" if value is None else format(value, spec)


# What the engine table's ratio measures, by evaluate.engine: τ carries over to a serving engine, this ratio does not.
SPEED_NOTES = {
    "transformers": "*speculative / greedy* is the wall-clock tokens/s of speculative decoding over plain greedy "
    "decoding, both in draftsmith's own un-optimised loop (transformers, one prompt at a time) on the device this run "
    "used. It is not a serving speed-up, which depends on the engine, batching and hardware: τ is the figure that "
    "carries over.",
    "vllm": "*speculative / greedy* is the wall-clock tokens/s of vLLM's speculative decoding over its plain greedy "
    "decoding, one prompt at a time, on the machine this run used: not a tuned serving set-up's speed-up. τ is the "
    "figure that carries over.",
}


def tau_table(summary: dict) -> str:
    lines = [
        "# Speculative decoding (greedy chain)",
        "",
        "| prompts | draft tokens / round | τ pooled | τ untrained | τ gain | τ mean over prompts | identical to greedy |",
        "|---|---|---|---|---|---|---|",
        f"| {summary['prompts']} | {summary['num_draft_tokens']} | {summary['acceptance_length']:.3f} | "
        f"{figure(summary['untrained_acceptance_length'])} | {figure(summary['tau_gain'], '+.3f')} | "
        f"{summary['mean_prompt_acceptance_length']:.3f} | {summary['identical']}/{summary['prompts']} |",
        "",
        "| draft position | " + " | ".join(str(i + 1) for i in range(len(summary["per_position_acceptance"]))) + " |",
        "|---|" + "---|" * len(summary["per_position_acceptance"]),
        "| accepted | " + " | ".join(f"{a:.3f}" for a in summary["per_position_acceptance"]) + " |",
    ]
    if summary["untrained_per_position_acceptance"]:
        untrained = summary["untrained_per_position_acceptance"]
        lines.append("| accepted, untrained | " + " | ".join(f"{a:.3f}" for a in untrained) + " |")
    greedy, spec = summary["greedy_tokens_per_s"], summary["speculative_tokens_per_s"]
    lines += [
        "",
        "| engine | tokens/s greedy | tokens/s speculative | speculative / greedy |",
        "|---|---|---|---|",
        f"| {summary['engine']} | {figure(greedy, '.1f')} | {figure(spec, '.1f')} | "
        f"{figure(spec / greedy if greedy and spec else None, '.2f')}x |",
        "",
        SPEED_NOTES[summary["engine"]],
    ]
    return "\n".join(lines)


def evaluate_draft(config: RunConfig, target=None, export_dir: Path | None = None, out: Path | None = None) -> dict:
    """Decode the held-out prompts both ways and write `results.json` and `acceptance.png` to `out` (the run's `eval/`)."""
    export_dir = Path(export_dir or stage_dir(config, "train") / "export")
    prompts, dropped = held_out_prompts(config)
    out = Path(out or stage_dir(config, "evaluate"))
    write_table("quarantine", dropped, out / "quarantine.parquet")
    if not prompts:
        raise ValueError(f"evaluate: no held-out prompts in {config.run_dir / 'merged' / 'eval'}")
    eos_ids = stop_ids(config)
    if config.evaluate.engine == "vllm":
        decoded = decode_with_vllm(config, prompts, export_dir, eos_ids, out)
    else:
        from tasks.target_model.loader import pick_device, shared_model

        target = target if target is not None else shared_model(config.target).to(pick_device(config.compute.device))
        decoded = decode_with_transformers(config, prompts, target, export_dir, eos_ids)
    rows = prompt_rows(prompts, decoded)
    results, baselines = [r for r, _ in decoded[1]], decoded[2]
    per_position = acceptance_by_position(results)
    tau, untrained_tau = pooled_tau(results), pooled_tau(baselines)
    greedy_s, spec_s = sum(r["greedy_s"] for r in rows), sum(r["speculative_s"] for r in rows)
    new_tokens = sum(r["new_tokens"] for r in rows)
    summary = {
        "engine": config.evaluate.engine,
        "prompts": len(rows),
        "num_draft_tokens": config.evaluate.num_draft_tokens,
        "acceptance_length": tau,
        "untrained_acceptance_length": untrained_tau,
        "tau_gain": None if untrained_tau is None else tau - untrained_tau,
        "mean_prompt_acceptance_length": sum(r["acceptance_length"] for r in rows) / len(rows),
        "per_position_acceptance": per_position,
        "untrained_per_position_acceptance": None if untrained_tau is None else acceptance_by_position(baselines),
        "identical": sum(r["identical"] for r in rows),
        "target_forwards": sum(r.target_forwards for r in results),
        "new_tokens": new_tokens,
        "greedy_tokens_per_s": sum(r["greedy_tokens"] for r in rows) / greedy_s if greedy_s else None,
        "speculative_tokens_per_s": new_tokens / spec_s if spec_s else None,
    }
    with atomic_path(out / "results.json") as tmp:
        tmp.write_text(json.dumps({"summary": summary, "prompts": rows}, indent=2), encoding="utf-8")
    plot_acceptance(results, per_position, out / "acceptance.png")
    return summary | {"results": str(out / "results.json"), "histogram": str(out / "acceptance.png")}


def gate_eval(config: RunConfig) -> dict:
    """Every output identical to greedy; the trained draft beats the untrained one on the same prompts (pooled τ,
    by `evaluate.min_tau_gain`) and its first drafted token is accepted often enough; mean τ at its floor."""
    data = json.loads((stage_dir(config, "evaluate") / "results.json").read_text(encoding="utf-8"))
    summary = data["summary"]
    frame = pd.DataFrame(data["prompts"])[["id", "acceptance_length", "identical"]]
    missing = float("nan")  # not compared: the untrained draft was not decoded
    frame["tau"] = summary["acceptance_length"]  # pooled figures, on every row: the gate names them beside the ids
    frame["untrained_tau"] = summary["untrained_acceptance_length"] if summary["tau_gain"] is not None else missing
    frame["tau_gain"] = summary["tau_gain"] if summary["tau_gain"] is not None else missing
    frame["first_acceptance"] = (summary["per_position_acceptance"] or [0.0])[0]
    ec = config.evaluate
    parameters = {
        "min_acceptance_length": ec.min_acceptance_length,
        "min_tau_gain": ec.min_tau_gain,
        "min_first_acceptance": ec.min_first_acceptance,
        "num_draft_tokens": ec.num_draft_tokens,
    }
    enforce("eval", frame, parameters=parameters)
    return summary


def run_evaluate(config: RunConfig, target=None) -> dict:
    """The whole stage without Prefect: decode, then gate."""
    summary = evaluate_draft(config, target)
    gate_eval(config)
    return summary


FIGURES = (
    "engine",
    "prompts",
    "acceptance_length",
    "untrained_acceptance_length",
    "tau_gain",
    "per_position_acceptance",
    "identical",
    "greedy_tokens_per_s",
    "speculative_tokens_per_s",
    "results",
    "histogram",
)


def stage_summary(summary: dict) -> dict:
    """The evaluate stage's figures for the run report and the stage record (not the per-prompt rows)."""
    return {k: summary[k] for k in FIGURES}


@task(name="evaluate-draft")
def evaluate_task(config: RunConfig) -> dict:
    from prefect.artifacts import create_markdown_artifact

    summary = evaluate_draft(config)
    create_markdown_artifact(
        key="eval-acceptance",
        markdown=tau_table(summary) + f"\n\nhistogram: `{summary['histogram']}`",
        description="Acceptance length on held-out prompts",
    )
    publish_image("eval-histogram", Path(summary["histogram"]), "Accepted draft tokens per target forward")
    return summary


@task(name="gate-evaluate")
def gate_eval_task(config: RunConfig) -> dict:
    return gate_eval(config)
