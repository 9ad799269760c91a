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
from tasks.evaluate.speculative import acceptance_by_position, greedy_decode, speculative_decode
from tasks.failpoints import failpoint
from tasks.gates import enforce
from tasks.image_artifact import publish_image
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
    from tasks.target.chat import resolve_end_of_turn
    from tasks.target.loader import load_tokenizer

    tokenizer = load_tokenizer(config.target)
    ids = set(resolve_end_of_turn(tokenizer, config.target).ids)
    return ids | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())


def decode_prompts(
    config: RunConfig, target, draft, baseline, layer_ids: list[int], eos_ids: set[int]
) -> tuple[list[dict], list, list]:
    """Per prompt: greedy and speculative outputs, τ, whether they are identical, and τ of the untrained
    `baseline` draft on the same prompt (None: not decoded)."""
    ec = config.evaluate
    prompts, dropped = held_out_prompts(config)
    write_table("quarantine", dropped, stage_dir(config, "evaluate") / "quarantine.parquet")
    rows, results, baselines = [], [], []
    for p in prompts:
        started = time.perf_counter()
        plain = greedy_decode(target, p["prompt_ids"], ec.max_new_tokens, eos_ids)
        plain_s = time.perf_counter() - started
        started = time.perf_counter()
        spec = speculative_decode(target, draft, p["prompt_ids"], layer_ids, ec.num_draft_tokens, ec.max_new_tokens, eos_ids)
        spec_s = time.perf_counter() - started
        untrained = None
        if baseline is not None:
            untrained = speculative_decode(
                target, baseline, p["prompt_ids"], layer_ids, ec.num_draft_tokens, ec.max_new_tokens, eos_ids
            )
        baselines.append(untrained)
        mismatch = next((i for i, (a, b) in enumerate(zip(plain, spec.tokens, strict=False)) if a != b), None)
        if mismatch is None and len(plain) != len(spec.tokens):
            mismatch = min(len(plain), len(spec.tokens))
        results.append(spec)
        failpoint("evaluate.prompt")
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
                "greedy_s": round(plain_s, 3),
                "speculative_s": round(spec_s, 3),
            }
        )
    return rows, results, baselines


def pooled_tau(results) -> float | None:
    """Tokens per verifying target forward over all prompts (None where they were not decoded)."""
    if any(r is None for r in results):
        return None
    return sum(sum(r.accepted) + len(r.accepted) for r in results) / max(1, sum(r.target_forwards for r in results))


def untrained_draft(config: RunConfig, draft, target):
    """The draft as training started it: same shape, vocabulary and seed, no training."""
    from tasks.draft.train import fresh_draft

    embed, lm_head = target.get_input_embeddings().weight.detach(), target.get_output_embeddings().weight.detach()
    return fresh_draft(config, draft.cfg, embed, lm_head, draft.d2t, draft.t2d).to(embed.device).eval()


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
    return "\n".join(lines)


def evaluate_draft(config: RunConfig, target=None, export_dir: Path | None = None) -> dict:
    """Decode the held-out prompts both ways and write `eval/results.json` and `eval/acceptance.png`."""
    from tasks.target.loader import pick_device, shared_model

    export_dir = Path(export_dir or stage_dir(config, "train") / "export")
    target = target if target is not None else shared_model(config.target).to(pick_device(config.compute.device))
    device = next(target.parameters()).device
    draft = load_export(export_dir, target.get_input_embeddings().weight.detach()).to(device)
    _, layer_ids = read_export_config(export_dir)
    eos_ids = stop_ids(config)
    baseline = untrained_draft(config, draft, target) if config.evaluate.min_tau_gain is not None else None
    rows, results, baselines = decode_prompts(config, target, draft, baseline, layer_ids, eos_ids)
    if not rows:
        raise ValueError(f"evaluate: no held-out prompts in {config.run_dir / 'merged' / 'eval'}")
    per_position = acceptance_by_position(results)
    forwards = sum(r.target_forwards for r in results)
    tau, untrained_tau = pooled_tau(results), pooled_tau(baselines)
    summary = {
        "prompts": len(rows),
        "num_draft_tokens": config.evaluate.num_draft_tokens,
        "acceptance_length": tau,
        "untrained_acceptance_length": untrained_tau,
        "tau_gain": None if untrained_tau is None else tau - untrained_tau,
        "mean_prompt_acceptance_length": sum(r["acceptance_length"] for r in rows) / len(rows),
        "per_position_acceptance": per_position,
        "untrained_per_position_acceptance": acceptance_by_position(baselines) if baseline is not None else None,
        "identical": sum(r["identical"] for r in rows),
        "target_forwards": forwards,
        "new_tokens": sum(r["new_tokens"] for r in rows),
    }
    out = stage_dir(config, "evaluate")
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
    "prompts",
    "acceptance_length",
    "untrained_acceptance_length",
    "tau_gain",
    "per_position_acceptance",
    "identical",
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


@task(name="gate-eval")
def gate_eval_task(config: RunConfig) -> dict:
    return gate_eval(config)
