"""The stages, in pipeline order: the one list the pipeline, stage records, run report, CLI and deploy loop over.

A new stage goes here (its output directory, the config sections and upstream stages its rerun key
depends on, its gate suite and artifacts, its flow) and in `tasks/<stage>/` + `flows/<stage>.py`.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tasks.config import RunConfig


@dataclass(frozen=True)
class Stage:
    name: str
    out_dir: str  # under runs/<name>/
    sections: tuple[str, ...]  # config sections its rerun key depends on
    upstream: tuple[str, ...]  # stages whose outputs it reads
    suite: str  # gate suite in expectations/ (its gate task and report artifact are both gate-<stage name>)
    artifacts: tuple[str, ...]  # artifact keys it publishes besides the gate report
    flow: str  # "module:attribute" of its Prefect flow
    sharded: bool = False  # its rows go out as shard tasks (tasks/sharded.py), to the task runner's workers

    @property
    def gate_artifact(self) -> str:
        return f"gate-{self.name}"


STAGES: tuple[Stage, ...] = (
    Stage(
        "generate",
        "generations",
        ("target", "generate"),
        (),
        "generations",
        ("generate-summary",),
        "flows.generate:generate_flow",
    ),
    Stage(
        "reconstruct",
        "reconstructed",
        ("target", "reconstruct", "compute"),
        ("generate",),
        "reconstructed",
        ("reconstruct-summary",),
        "flows.reconstruct:reconstruct_flow",
        sharded=True,
    ),
    Stage(
        "validate",
        "validation",
        ("target", "validation"),
        ("reconstruct",),
        "validation",
        ("validation-report",),
        "flows.validate:validate_flow",
        sharded=True,
    ),
    Stage(
        "merge",
        "merged",
        ("merge", "compute"),
        ("reconstruct", "validate"),
        "merged",
        ("merge-mix",),
        "flows.merge:merge_flow",
    ),
    Stage(
        "extract",
        "hidden_states",
        ("target", "extract", "compute"),
        ("merge",),
        "hidden_states",
        ("extract-summary",),
        "flows.extract:extract_flow",
        sharded=True,
    ),
    Stage(
        "train",
        "draft",
        ("target", "train", "compute"),
        ("extract", "merge"),
        "train",
        ("train-summary", "train-metrics", "train-curves"),
        "flows.train:train_flow",
    ),
    Stage(
        "evaluate",
        "eval",
        ("target", "evaluate", "compute"),
        ("train", "merge"),
        "eval",
        ("eval-acceptance", "eval-histogram"),
        "flows.evaluate:evaluate_flow",
    ),
)
BY_NAME = {s.name: s for s in STAGES}
BY_SUITE = {s.suite: s for s in STAGES}
STAGE_NAMES = tuple(BY_NAME)
StageName = Literal[STAGE_NAMES]  # what a flow parameter naming stages accepts (the UI shows a choice)


def stage(name: str) -> Stage:
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown stage {name!r}; stages: {list(STAGE_NAMES)}") from None


def stage_dir(config: RunConfig, name: str) -> Path:
    """Where a stage writes, under the run directory."""
    return config.run_dir / stage(name).out_dir


def run_name(flow_name: str):
    """A flow's `flow_run_name`: `<config name>-<flow>-<MMDD-HHMMSS>`, so each run says which config and stage it is;
    a run started from a deployment keeps the name it was given there (the UI's run form, `prefect deployment run
    --flow-run-name`) unless it is one Prefect made up."""

    def name() -> str:
        from prefect.context import FlowRunContext
        from prefect.runtime import flow_run

        from tasks.run_names import is_generated_name

        current = FlowRunContext.get().flow_run
        if current.deployment_id is not None and not is_generated_name(current.name):
            return current.name
        config = flow_run.parameters.get("config")
        config_name = config.get("name") if isinstance(config, dict) else getattr(config, "name", None)
        return f"{config_name or 'run'}-{flow_name}-{time.strftime('%m%d-%H%M%S')}"

    return name


def stage_flow(name: str):
    """The stage's Prefect flow (imported on demand, so each flow module stays importable alone)."""
    module, attribute = stage(name).flow.split(":")
    return getattr(importlib.import_module(module), attribute)
