"""The train stage: train (in-process or under torchrun), gate the metrics, export for SGLang/vLLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
from prefect import task

from tasks.config import RunConfig
from tasks.draft.checkpoint import latest_checkpoint
from tasks.draft.curves import plot_curves, unrolled_steps
from tasks.draft.export import ExportTarget, export_draft
from tasks.draft.model import DraftConfig
from tasks.draft.train import TargetPieces, read_metrics, train_draft
from tasks.draft.ttt import window_tau_sim
from tasks.gates import enforce
from tasks.image_artifact import publish_image
from tasks.stages import stage_dir
from tasks.storage import atomic_path


def launch_torchrun(config: RunConfig) -> dict:
    """Run the same training under `torchrun` with `train.processes` ranks; returns rank 0's summary."""
    launch = stage_dir(config, "train") / "launch-config.json"
    with atomic_path(launch) as tmp:
        tmp.write_text(config.model_dump_json(), encoding="utf-8")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={config.train.processes}",
        "-m",
        "tasks.draft.train",
        str(launch),
    ]
    env = dict(os.environ, OMP_NUM_THREADS=str(config.train.threads_per_rank))
    subprocess.run(command, check=True, env=env)
    return json.loads((stage_dir(config, "train") / "launch-summary.json").read_text(encoding="utf-8"))


def train_stage(config: RunConfig, pieces: TargetPieces | None = None) -> dict:
    """Train or resume to `train.max_steps`, then draw the curves."""
    if config.train.processes > 1:
        summary = launch_torchrun(config)
    else:
        summary = train_draft(config, pieces)
    records = read_metrics(stage_dir(config, "train") / "metrics.jsonl")
    plot_curves(records, stage_dir(config, "train") / "curves.png")
    return summary


def metrics_frame(records: list[dict], window: int = 10) -> pd.DataFrame:
    """One row per step with scalar columns for the gate; `loss_drop` compares the first and last windows."""
    frame = pd.DataFrame(records)
    frame["id"] = frame["step"].astype(str)
    n = max(1, min(window, len(frame) // 4 or 1))
    frame["loss_drop"] = float(frame["loss"].head(n).mean() - frame["loss"].tail(n).mean())
    frame["acc_0_rise"] = float(frame["acc_0"].tail(n).mean() - frame["acc_0"].head(n).mean())
    frame["acc_steps_reported"] = unrolled_steps(records[0])
    return frame


def gate_train(config: RunConfig) -> dict:
    """Loss finite and falling, first-step accuracy rising, accuracy reported for every unrolled step."""
    records = read_metrics(stage_dir(config, "train") / "metrics.jsonl")
    if not records:
        raise ValueError(f"train gate: no metrics in {stage_dir(config, 'train') / 'metrics.jsonl'}")
    frame = metrics_frame(records)
    enforce("train", frame, parameters={"ttt_steps": config.train.ttt_steps, "min_acc_0_rise": config.train.min_acc_0_rise})
    last = records[-1]
    return {
        "steps": last["step"],
        "loss": last["loss"],
        "loss_drop": float(frame["loss_drop"].iloc[0]),
        "tau_sim": window_tau_sim(records),
        **{k: v for k, v in last.items() if k.startswith("acc_")},
    }


def export_stage(config: RunConfig) -> str:
    """Export the newest checkpoint to `draft/export/`."""
    import torch

    from tasks.extract.plan import read_target_info
    from tasks.target_model.loader import load_tokenizer

    checkpoint = latest_checkpoint(stage_dir(config, "train") / "checkpoints")
    if checkpoint is None:
        raise FileNotFoundError(f"export: no checkpoint in {stage_dir(config, 'train') / 'checkpoints'}")
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    tokenizer = load_tokenizer(config.target)
    info = read_target_info(config)  # from the target itself: an online run has no extract meta.json
    out = export_draft(
        state["model"],
        DraftConfig(**state["draft_config"]),
        state["aux_layer_ids"],
        ExportTarget(info.num_hidden_layers, info.architecture),
        stage_dir(config, "train") / "export",
        engine=config.train.export_engine,
        dtype=config.train.export_dtype,
        eos_token_id=tokenizer.eos_token_id,
    )
    return str(out)


def publish_metrics(config: RunConfig) -> None:
    """The per-step metrics (at most 100 rows) and the run's summary as Prefect artifacts."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    records = read_metrics(stage_dir(config, "train") / "metrics.jsonl")
    stride = max(1, len(records) // 100)
    keep = [k for k in records[0] if k in ("step", "loss", "lr", "tau_sim") or k.startswith(("loss_", "acc_"))]
    rows = [{k: round(r[k], 5) if isinstance(r[k], float) else r[k] for k in keep} for r in records[::stride]]
    create_table_artifact(key="train-metrics", table=rows, description="Draft training metrics per step")
    last = records[-1]
    header = "| unrolled step | loss | accuracy | accuracy, out-of-vocab as misses |"
    lines = ["# Draft training", "", header, "|---|---|---|---|"]
    lines += [
        f"| {i} | {last[f'loss_{i}']:.4f} | {last[f'acc_{i}']:.3f} | {last[f'acc_{i}_all']:.3f} |"
        for i in range(config.train.ttt_steps)
    ]
    if (tau := window_tau_sim(records)) is not None:
        lines += [
            "",
            f"τ_sim (last tenth of the steps): {tau:.3f}: the acceptance length greedy chain drafting would"
            f" reach on the training positions at k = {config.train.ttt_steps} (evaluate measures the real one).",
        ]
    lines += ["", f"curves: `{stage_dir(config, 'train') / 'curves.png'}`"]
    create_markdown_artifact(key="train-summary", markdown="\n".join(lines), description="Last step per unrolled step")
    publish_image("train-curves", stage_dir(config, "train") / "curves.png", "Draft loss and accuracy per unrolled step")


def run_train(config: RunConfig, pieces: TargetPieces | None = None) -> dict:
    """The whole stage without Prefect: train, gate, export."""
    summary = train_stage(config, pieces)
    summary["gate"] = gate_train(config)
    summary["export"] = export_stage(config)
    return summary


def stage_summary(config: RunConfig, trained: dict, gate: dict, export: str) -> dict:
    """The train stage's figures for the run report and the stage record."""
    return {
        "steps": trained["step"],
        "tokens_per_s": trained["tokens_per_s"],
        "draft_vocab_size": trained["draft_vocab_size"],
        "loss": gate["loss"],
        "acc_0": gate["acc_0"],
        "metrics": str(stage_dir(config, "train") / "metrics.jsonl"),
        "export": export,
    }


@task(name="train-draft")
def train_task(config: RunConfig, force: bool = False) -> dict:
    """Train (resuming from the last checkpoint; force: from scratch) and publish the curves."""
    if force:  # without its key, the next run cannot match the checkpoints and starts over
        (stage_dir(config, "train") / "train-key.json").unlink(missing_ok=True)
    summary = train_stage(config)
    publish_metrics(config)
    return summary


@task(name="gate-train")
def gate_train_task(config: RunConfig) -> dict:
    return gate_train(config)


@task(name="export-draft")
def export_task(config: RunConfig) -> str:
    return export_stage(config)
