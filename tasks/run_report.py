"""The pipeline's run report: one table of every stage, linking to the artifacts each published."""

from __future__ import annotations

from tasks.config import RunConfig
from tasks.stage_record import STAGES, load_record

# Artifact keys each stage publishes (the Prefect UI shows an artifact by key at /artifacts/key/<key>).
STAGE_ARTIFACTS = {
    "preflight": ["preflight"],
    "generate": ["generate-summary", "gate-generations"],
    "reconstruct": ["reconstruct-summary", "gate-reconstructed"],
    "validate": ["validation-report", "gate-validation"],
    "merge": ["merge-mix", "gate-merged"],
    "extract": ["extract-summary", "gate-hidden-states"],
    "train": ["train-summary", "train-metrics", "train-curves", "gate-train"],
    "evaluate": ["eval-acceptance", "eval-histogram", "gate-eval"],
}


def _figures(summary: dict, limit: int = 6) -> str:
    shown = [f"{k}={v}" for k, v in summary.items() if isinstance(v, (int, float, str)) and k != "skipped"]
    return ", ".join(shown[:limit]).replace("|", "\\|")


def run_report_markdown(config: RunConfig, results: dict) -> str:
    lines = [
        f"# Run `{config.name}`",
        "",
        f"Outputs under `{config.run_dir}`.",
        "",
        "| stage | status | seconds | output | figures | artifacts |",
        "|---|---|---|---|---|---|",
    ]
    for stage, summary in results.items():
        summary = summary or {}
        record = load_record(config, stage) if stage in STAGES else None
        status = "skipped (up to date)" if summary.get("skipped") else "ran"
        seconds = record.get("seconds", "-") if record else "-"
        where = f"`{config.run_dir / STAGES[stage][0]}`" if stage in STAGES else "-"
        links = ", ".join(f"[{key}](/artifacts/key/{key})" for key in STAGE_ARTIFACTS.get(stage, []))
        lines.append(f"| {stage} | {status} | {seconds} | {where} | {_figures(summary)} | {links} |")
    return "\n".join(lines)
