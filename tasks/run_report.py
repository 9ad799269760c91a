"""The pipeline's run report: one table of every stage, linking to the artifacts each published."""

from __future__ import annotations

from tasks.config import RunConfig
from tasks.stage_record import load_record
from tasks.stages import BY_NAME, STAGES

# Artifact keys each stage publishes (the Prefect UI shows an artifact by key at /artifacts/key/<key>).
STAGE_ARTIFACTS = {"preflight": ["preflight"]} | {s.name: [*s.artifacts, s.gate_artifact] for s in STAGES}


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
        record = load_record(config, stage) if stage in BY_NAME else None
        status = "skipped (up to date)" if summary.get("skipped") else "ran"
        seconds = record.get("seconds", "-") if record else "-"
        where = f"`{config.run_dir / BY_NAME[stage].out_dir}`" if stage in BY_NAME else "-"
        links = ", ".join(f"[{key}](/artifacts/key/{key})" for key in STAGE_ARTIFACTS.get(stage, []))
        lines.append(f"| {stage} | {status} | {seconds} | {where} | {_figures(summary)} | {links} |")
    return "\n".join(lines)
