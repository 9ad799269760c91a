"""The run report's evaluate row and the pipeline's last log line put τ where people look: trained against untrained."""

from tasks.config import RunConfig
from tasks.run_report import UP_TO_DATE, run_report_markdown, summary_line

EVALUATED = {
    "engine": "transformers",
    "prompts": 8,
    "acceptance_length": 1.0964,
    "untrained_acceptance_length": 1.0213,
    "tau_gain": 1.0964 - 1.0213,
    "identical": 8,
}


def config(tmp_path, **evaluate) -> RunConfig:
    return RunConfig.model_validate({"name": "x", "runs_dir": str(tmp_path), "evaluate": evaluate})


def row(report: str, stage: str) -> str:
    [line] = [line for line in report.splitlines() if line.startswith(f"| {stage} |")]
    return line


def test_the_evaluate_row_shows_trained_and_untrained_tau_the_gain_and_the_gate(tmp_path):
    results = {"train": {"steps": 50}, "evaluate": EVALUATED}
    report = run_report_markdown(config(tmp_path, min_tau_gain=0.05), results, {})
    assert "τ 1.096 vs untrained 1.021: gain +0.075; gate passed (needs gain > 0.05)" in row(report, "evaluate")
    assert "steps=50" in row(report, "train")  # the other rows keep their figures
    skipped = run_report_markdown(config(tmp_path, min_tau_gain=0.05), {"evaluate": EVALUATED | {UP_TO_DATE: True}}, {})
    assert "| up to date | - |" in row(skipped, "evaluate") and "gain +0.075" in row(skipped, "evaluate")
    alone = EVALUATED | {"untrained_acceptance_length": None, "tau_gain": None}  # evaluate.min_tau_gain: null
    report = run_report_markdown(config(tmp_path, min_tau_gain=None), {"evaluate": alone}, {})
    assert "τ 1.096, untrained not decoded; gate passed (needs mean τ ≥ 1)" in row(report, "evaluate")


def test_the_pipeline_s_last_line_names_the_run_tau_gain_and_export(tmp_path):
    results = {"train": {"export": "/runs/x/draft/export"}, "evaluate": EVALUATED}
    line = summary_line(config(tmp_path), results, "x-pipeline-0101-030000")
    assert line == (
        "run x-pipeline-0101-030000 done: τ 1.096 trained vs 1.021 untrained (gain +0.075); draft export: /runs/x/draft/export"
    )
    assert summary_line(config(tmp_path), {}, "r").endswith(f"not evaluated; draft export: {tmp_path / 'x' / 'draft' / 'export'}")
