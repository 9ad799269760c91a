"""The pipeline's run report: one short row per stage, in pipeline order, linking to this run's artifacts."""

from __future__ import annotations

from tasks.config import RunConfig
from tasks.stage_record import load_record
from tasks.stages import BY_NAME, STAGES

# Artifact keys each stage publishes.
STAGE_ARTIFACTS = {"preflight": ["preflight"]} | {s.name: [*s.artifacts, s.gate_artifact] for s in STAGES}
UP_TO_DATE = "up_to_date"  # the pipeline marks a stage it skipped with this key
NOT_NEEDED = "not_needed"  # ...and a stage this run does not need (extract, when training streams its states)


def _figures(summary: dict, limit: int = 3) -> str:
    """A few short figures (no paths, no long texts) so the table fits a narrow frame."""
    shown = [
        f"{k}={format(v, '.4g') if isinstance(v, float) else v}"
        for k, v in summary.items()
        if isinstance(v, (int, float, str))
        and not isinstance(v, bool)
        and k not in (UP_TO_DATE, NOT_NEEDED)
        and "/" not in str(v)
        and len(str(v)) <= 24
    ]
    return ", ".join(shown[:limit]).replace("|", "\\|")


def evaluate_figures(config: RunConfig, summary: dict) -> str:
    """The evaluate row: the trained draft's τ against the untrained draft's on the same prompts, the gain, and the
    eval gate's verdict. A stage's summary reaches the report only once its gate held: a failed gate fails the run."""
    tau, untrained, gain = (summary.get(k) for k in ("acceptance_length", "untrained_acceptance_length", "tau_gain"))
    if tau is None:
        return _figures(summary)
    ec = config.evaluate
    if gain is None:
        return f"τ {tau:.3f}, untrained not decoded; gate passed (needs mean τ ≥ {ec.min_acceptance_length:g})"
    return f"τ {tau:.3f} vs untrained {untrained:.3f}: gain {gain:+.3f}; gate passed (needs gain > {ec.min_tau_gain:g})"


def summary_line(config: RunConfig, results: dict, run_name: str) -> str:
    """The pipeline's last log line: the run, the draft's τ against the untrained draft's, and where the export is."""
    evaluated = results.get("evaluate") or {}
    tau, untrained, gain = (evaluated.get(k) for k in ("acceptance_length", "untrained_acceptance_length", "tau_gain"))
    export = (results.get("train") or {}).get("export") or config.run_dir / BY_NAME["train"].out_dir / "export"
    if tau is None:
        figures = "not evaluated"
    elif gain is None:
        figures = f"τ {tau:.3f} (the untrained draft was not decoded)"
    else:
        figures = f"τ {tau:.3f} trained vs {untrained:.3f} untrained (gain {gain:+.3f})"
    return f"run {run_name} done: {figures}; draft export: {export}"


def _label(key: str) -> str:
    """A short link text: `gate-generate` -> gate, `generate-summary` -> summary (the row names the stage)."""
    return "gate" if key.startswith("gate-") else key.split("-", 1)[-1]


def run_artifacts(flow_run_id) -> dict[str, str]:
    """Artifact id by key, among those this flow run and its subflow runs published (the latest of each key)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterParentFlowRunId
    from prefect.client.schemas.sorting import ArtifactSort

    tree = FlowRunFilter(
        operator="or_",
        id=FlowRunFilterId(any_=[flow_run_id]),
        parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id]),
    )
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(flow_run_filter=tree, sort=ArtifactSort.CREATED_DESC)
    found: dict[str, str] = {}
    for artifact in artifacts:
        if artifact.key and artifact.key not in found:
            found[artifact.key] = str(artifact.id)
    return found


def run_report_markdown(config: RunConfig, results: dict, artifacts: dict[str, str]) -> str:
    """`artifacts`: this run's artifact ids by key; each links to its page in the UI."""
    lines = [
        f"# Run `{config.name}`",
        "",
        f"Outputs under `{config.run_dir}`; paths below are relative to it.",
        "",
        "| stage | status | s | output | figures | artifacts |",
        "|---|---|---|---|---|---|",
    ]
    for stage, summary in results.items():
        summary = summary or {}
        if summary.get(UP_TO_DATE):
            status, seconds = "up to date", "-"
        elif summary.get(NOT_NEEDED):
            status, seconds = "not needed", "-"
        else:
            record = load_record(config, stage) if stage in BY_NAME else None
            status, seconds = "ran", format((record or {}).get("seconds", 0), ".0f") if record else "-"
        where = f"`{BY_NAME[stage].out_dir}/`" if stage in BY_NAME else "-"
        keys = [k for k in STAGE_ARTIFACTS.get(stage, []) if k in artifacts]
        links = ", ".join(f"[{_label(k)}](/artifacts/artifact/{artifacts[k]})" for k in keys) or "-"
        figures = evaluate_figures(config, summary) if stage == "evaluate" else _figures(summary)
        lines.append(f"| {stage} | {status} | {seconds} | {where} | {figures} | {links} |")
    return "\n".join(lines)
