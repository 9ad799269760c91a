"""Generate flow: prompts -> the target's replies (journaled), gated before reconstruct reads them."""

from __future__ import annotations

import pandas as pd
from prefect import flow, get_run_logger

import tasks  # noqa: F401  (offline defaults before Prefect starts)
from tasks.config import RunConfig
from tasks.contracts import read_table
from tasks.gates import enforce
from tasks.generate.stage import generate_task
from tasks.target.preflight import preflight_task


def gate_frame(generations: str, error_rate: float) -> pd.DataFrame:
    """Scalar columns only: id, whether the row has a reply, finish_reason, the run's error rate."""
    table = read_table("generations", generations, columns=["id", "content", "tool_calls", "finish_reason"])
    frame = table.to_pandas()
    has_reply = frame["content"].fillna("").str.strip().ne("") | frame["tool_calls"].notna()
    if frame.empty:  # the error rate still has to be checked when nothing came back
        return pd.DataFrame({"id": ["<none>"], "has_reply": [True], "finish_reason": ["stop"], "error_rate": [error_rate]})
    return pd.DataFrame(
        {"id": frame["id"], "has_reply": has_reply, "finish_reason": frame["finish_reason"], "error_rate": error_rate}
    )


@flow(name="generate")
def generate_flow(config: RunConfig) -> dict:
    """Generate replies for every configured prompt source, then gate the table."""
    preflight_task(config.target)
    summary = generate_task(config)
    if summary["stopped"]:
        get_run_logger().warning("generation stopped early (%s); rerun to finish", summary["stopped"])
    enforce(
        "generations",
        gate_frame(summary["generations"], summary["error_rate"]),
        parameters={"max_error_rate": config.generate.max_error_rate},
    )
    return summary
