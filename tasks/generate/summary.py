"""The generate summary: counts by finish_reason, errors by kind, tokens, cost, latency percentiles split into
time queued at the server and time the server computed, where the server reports them."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from tasks.storage import write_bytes_atomic


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return round(ordered[rank - 1], 4)


def spread(rows: list[dict], key: str) -> dict:
    """{key_p50_s, key_p95_s} over the rows that have `key`."""
    values = [r[key] for r in rows if r.get(key) is not None]
    name = key.removesuffix("_s")
    return {f"{name}_p50_s": percentile(values, 50), f"{name}_p95_s": percentile(values, 95)}


def truncated_by_source(rows: list[dict]) -> dict[str, dict]:
    """Per source: replies the target was asked for, how many were cut at max_tokens, and their share."""
    asked = Counter(r["source"] for r in rows if r.get("origin") != "dataset")
    cut = Counter(r["source"] for r in rows if r.get("truncated") and r.get("origin") != "dataset")
    return {s: {"replies": n, "cut": cut[s], "share": round(cut[s] / n, 4)} for s, n in asked.items()}


def summarize(rows: list[dict], failures: list[dict], quarantine: list[dict], extra: dict) -> dict:
    """A small JSON-able summary of the output table and what was refused."""
    costs = [r["cost"] for r in rows if r.get("cost") is not None]
    attempted = len(rows) + len(failures)
    return {
        "rows": len(rows),
        "by_finish_reason": dict(Counter(r.get("finish_reason") or "none" for r in rows).most_common()),
        "truncated": sum(1 for r in rows if r.get("truncated")),
        "truncated_by_source": truncated_by_source(rows),
        "errors_by_kind": dict(Counter(f["kind"] for f in failures).most_common()),
        "quarantine_by_reason": dict(Counter(q["reason"] for q in quarantine).most_common()),
        "error_rate": round(len(failures) / attempted, 6) if attempted else 0.0,
        "tokens_in": sum(r.get("prompt_tokens") or 0 for r in rows),
        "tokens_out": sum(r.get("completion_tokens") or 0 for r in rows),
        "cost_usd": round(sum(costs), 6) if costs else None,
        **spread(rows, "latency_s"),
        **spread(rows, "server_queue_s"),
        **spread(rows, "server_s"),
        "server_timed_rows": sum(1 for r in rows if r.get("server_s") is not None),
        "by_source": dict(Counter(r["source"] for r in rows).most_common()),
        "by_origin": dict(Counter(r.get("origin") or "target" for r in rows).most_common()),
        **extra,
    }


LATENCY_NOTE = (
    "latency: request sent to reply received. Of that, server_queue is the time the server held the request "
    "before scheduling it and server the time from scheduled to last token, as the server reports them (vLLM with "
    "`--enable-per-request-metrics`, the embedded server); OpenRouter reports neither. A server_queue close to the "
    "latency means more requests in flight (generate.api.concurrency) than the server batches."
)


def summary_markdown(summary: dict) -> str:
    lines = ["# Generate summary", "", "| metric | value |", "|---|---|"]
    for key, value in summary.items():
        shown = (", ".join(f"{k}: {v}" for k, v in value.items()) or "-") if isinstance(value, dict) else value
        lines.append(f"| {key} | {shown} |")
    lines += ["", LATENCY_NOTE]
    return "\n".join(lines)


def write_summary(summary: dict, path: Path) -> Path:
    write_bytes_atomic(path, json.dumps(summary, indent=2, sort_keys=False).encode("utf-8"))
    return path


def publish_summary(summary: dict) -> None:
    """The summary as a Prefect markdown artifact, when inside a flow or task run."""
    from tasks.generate.progress import in_prefect_run

    if not in_prefect_run():
        return
    from prefect.artifacts import create_markdown_artifact

    create_markdown_artifact(
        key="generate-summary",
        markdown=summary_markdown(summary),
        description=f"generate: {summary['rows']} rows, error rate {summary['error_rate']}",
    )
