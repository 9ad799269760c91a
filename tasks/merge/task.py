"""Thin Prefect tasks over the merge stage (kept apart so the plain functions import without Prefect)."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact

from tasks.config import RunConfig
from tasks.merge.gate import gate_merged
from tasks.merge.manifest import read_manifest
from tasks.merge.report import render_report
from tasks.merge.stage import run_merge
from tasks.stages import stage_dir


# No Prefect cache: the manifest fingerprint covers input contents, which task inputs (a config) cannot.
@task(name="merge-sources", persist_result=False)
def merge_task(config: RunConfig, force: bool = False) -> dict:
    """Run the merge (or find it current) and publish the mix and drops table as an artifact."""
    summary = run_merge(config, force)
    report = render_report(read_manifest(stage_dir(config, "merge")))
    create_markdown_artifact(key="merge-mix", markdown=report, description="Merge: requested vs realised mix, drops")
    return summary


@task(name="gate-merge", persist_result=False)
def gate_merged_task(config: RunConfig) -> int:
    """Check the written shards against `expectations/merged.json`; returns the rows checked."""
    return gate_merged(stage_dir(config, "merge"), config.merge.share_tolerance).rows
