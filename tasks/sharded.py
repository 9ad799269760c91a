"""The sharded-stage skeleton of reconstruct, validate and extract: plan -> one task per shard -> finalize.

A sharded stage says what its shards are (`plan`: each with its input, outputs and fingerprint),
how to build one (`build`: write the shard's outputs, return counts for its completion marker) and how
to finish (`finish`: the stage summary from every marker). This module owns the rest, once for all
three: resume by completion markers (`tasks/completions.py`), forced reruns, removal of outputs left by
an older plan, the failpoint after each durable shard, the Prefect tasks and the summary artifact.
The stage's gate task (`gate-<suite>`) runs after `finalize` in its flow.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prefect import task, unmapped

from tasks.completions import finished, mark_done, remove_stale_markers
from tasks.config import RunConfig
from tasks.failpoints import failpoint
from tasks.progress_log import ProgressLog
from tasks.stages import stage, stage_dir


@dataclass(frozen=True)
class Shard:
    """One unit of work and of resume."""

    name: str  # its completion marker's name, and the Prefect task run's
    source: str  # the input file it reads
    outputs: tuple[str, ...]  # files it writes in the stage directory
    fingerprint: str  # everything its outputs depend on; a change means redo
    start: int = 0  # first row of `source` it reads
    stop: int | None = None  # one past its last row (None: to the end)


@dataclass(frozen=True)
class ShardedStage:
    name: str  # the stage's name in tasks/stages.py (its directory, its `<name>.shard` failpoint)
    plan: Callable[[RunConfig], list[Shard]]
    build: Callable[[RunConfig, Shard], dict]  # writes shard.outputs; returns counts for the marker
    finish: Callable[[RunConfig, list[Shard], list[dict]], dict]  # the stage summary from every marker
    markdown: Callable[[dict], str]  # the summary artifact (the stage's first artifact key in tasks/stages.py)
    output_globs: tuple[str, ...]  # what shards write, so outputs of shards no longer planned can be removed

    def run_shard(self, config: RunConfig, shard: Shard, force: bool = False) -> dict:
        """Build one shard unless its marker says it is done for this fingerprint; returns the marker."""
        out = stage_dir(config, self.name)
        done = None if force else finished(out, shard.name, shard.fingerprint)
        if done is not None:
            return done | {"skipped": True}
        record = self.build(config, shard)
        marker = mark_done(out, shard.name, shard.fingerprint, [out / o for o in shard.outputs], record)
        failpoint(f"{self.name}.shard")
        return marker | {"skipped": False}

    def plan_current(self, config: RunConfig) -> list[Shard]:
        """The plan, with outputs and markers of shards it no longer has removed (fewer inputs, other sizes)."""
        shards = self.plan(config)
        out = stage_dir(config, self.name)
        keep = {o for s in shards for o in s.outputs}
        for pattern in self.output_globs:
            for path in out.glob(pattern):
                if path.name not in keep:
                    path.unlink()
        for path in out.glob(".*.tmp"):  # left by a killed atomic write
            path.unlink(missing_ok=True)
        remove_stale_markers(out, {s.name for s in shards})
        return shards

    def run(self, config: RunConfig, force: bool = False) -> dict:
        """The whole stage in-process, without Prefect (its flow runs the same steps as tasks)."""
        shards = self.plan_current(config)
        return self.finish(config, shards, [self.run_shard(config, s, force) for s in shards])

    def tasks(self) -> StageTasks:
        """The stage's Prefect tasks: `<name>-plan`, `<name>-shard` (one run per shard), `<name>-finalize`."""
        return StageTasks(
            name=self.name,
            plan=task(self.plan_current, name=f"{self.name}-plan", persist_result=False),
            shard=task(
                self.run_shard, name=f"{self.name}-shard", task_run_name=f"{self.name}-{{shard.name}}", persist_result=False
            ),
            finalize=task(self._finalize, name=f"{self.name}-finalize", persist_result=False),
        )

    def _finalize(self, config: RunConfig, shards: list[Shard], markers: list[dict]) -> dict:
        from prefect.artifacts import create_markdown_artifact

        summary = self.finish(config, shards, markers)
        key = stage(self.name).artifacts[0]
        create_markdown_artifact(key=key, markdown=self.markdown(summary), description=f"{self.name} summary")
        return summary


@dataclass(frozen=True)
class StageTasks:
    name: str
    plan: Callable
    shard: Callable
    finalize: Callable

    def run(self, config: RunConfig, force: bool = False) -> dict:
        """Inside a flow: plan, one task run per shard (spread by the flow's task runner), finalize."""
        from prefect.futures import as_completed

        shards = self.plan(config)
        futures = self.shard.map(unmapped(config), shards, force=unmapped(force))
        running = {f.task_run_id: s.name for f, s in zip(futures, shards, strict=True)}
        with ProgressLog(self.name, len(shards), "shards", note=lambda: waiting_on(list(running.values()))) as progress:
            for future in as_completed(futures):
                running.pop(future.task_run_id, None)
                progress.advance()
        return self.finalize(config, shards, [f.result() for f in futures])


def waiting_on(names: list[str], shown: int = 3) -> str:
    """'waiting on part-00003-0000, part-00004-0000 and 5 more' (what a progress line says it waits for)."""
    if not names:
        return "all shards done"
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return "waiting on " + ", ".join(names[:shown]) + more
