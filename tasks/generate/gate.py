"""The `generations` gate: every row has a reply and an allowed finish reason; the run's error rate is bounded."""

from __future__ import annotations

import pandas as pd
from prefect import task

from tasks.config import RunConfig
from tasks.gates import enforce
from tasks.generate.client import has_reply
from tasks.stages import stage_dir
from tasks.storage import read_table


def gate_frame(config: RunConfig, error_rate: float) -> pd.DataFrame:
    """Scalar columns only: id, whether the row has a reply, finish_reason, the run's error rate (an empty table
    fails the suite's row count)."""
    columns = ["id", "content", "tool_calls", "reasoning", "reasoning_kind", "finish_reason"]
    rows = read_table("generations", stage_dir(config, "generate"), columns=columns).to_pylist()
    frame = pd.DataFrame(rows, columns=columns)[["id", "finish_reason"]]
    return frame.assign(has_reply=[has_reply(row) for row in rows], error_rate=error_rate)


@task(name="gate-generate", persist_result=False)
def gate_generations_task(config: RunConfig, error_rate: float) -> int:
    """Gate the generations table before reconstruct reads it; returns the rows checked."""
    result = enforce("generations", gate_frame(config, error_rate), parameters={"max_error_rate": config.generate.max_error_rate})
    return result.rows
