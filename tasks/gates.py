"""Quality gates: a Great Expectations suite from `expectations/<name>.json` over a pandas frame.

Validate scalar columns only (lengths, sums, flags): GX fingerprints the frame by pickling it, and a
list column makes that ~60x slower.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

from tasks.prefect_env import PROJECT_ROOT

EXPECTATIONS_DIR = PROJECT_ROOT / "expectations"
MAX_SHOWN_IDS = 5


@dataclass
class Failure:
    expectation: str
    column: str | None
    observed: Any
    row_ids: list[str] = field(default_factory=list)
    detail: str = ""

    def line(self) -> str:
        ids = f"; rows {self.row_ids}" if self.row_ids else ""
        detail = f"; {self.detail}" if self.detail else ""
        return f"{self.expectation} on column {self.column!r}: observed {self.observed}{ids}{detail}"


@dataclass
class GateResult:
    suite: str
    rows: int
    evaluated: int
    failures: list[Failure]
    passed: list[Failure] = field(default_factory=list)  # the expectations that held, with what they observed

    @property
    def success(self) -> bool:
        return not self.failures

    def markdown(self) -> str:
        status = "passed" if self.success else "FAILED"
        lines = [
            f"# Gate `{self.suite}`: {status}",
            "",
            f"{self.rows} rows of the checked table, {self.evaluated} expectations, {len(self.failures)} failed.",
            "",
            "| | expectation | column | observed | expected | offending row ids |",
            "|---|---|---|---|---|---|",
        ]
        for mark, checks in (("✗", self.failures), ("✓", self.passed)):
            for f in checks:
                expected = f.detail.removeprefix("expected ") or "-"
                cells = [mark, f.expectation, f.column or "-", f.observed, expected, ", ".join(f.row_ids) or "-"]
                lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
        return "\n".join(lines)


class GateError(RuntimeError):
    """A hand-off table failed its suite; the message names what failed and where."""

    def __init__(self, result: GateResult):
        self.result = result
        body = "\n".join(f"  - {f.line()}" for f in result.failures)
        super().__init__(f"gate {result.suite!r} failed ({len(result.failures)} expectation(s)):\n{body}")


def load_suite(name: str, directory: Path = EXPECTATIONS_DIR):
    """Load a suite JSON and check that GX kept every expectation (it drops unknown types silently)."""
    import great_expectations as gx

    path = Path(directory) / f"{name}.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    suite = gx.ExpectationSuite(**data)
    if len(suite.expectations) != len(data.get("expectations", [])):
        kept = {e.expectation_type for e in suite.expectations}
        lost = [e["type"] for e in data["expectations"] if e["type"] not in kept]
        raise ValueError(f"suite {path}: GX dropped unknown expectation type(s) {lost}")
    return suite


@cache
def _batch_definition():
    import great_expectations as gx

    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    context = gx.get_context(mode="ephemeral")
    try:
        context.variables.progress_bars = {"globally": False, "metric_calculations": False}
    except Exception:  # older/newer GX spell this differently; progress bars are cosmetic
        pass
    asset = context.data_sources.add_pandas("frames").add_dataframe_asset("frame")
    return asset.add_batch_definition_whole_dataframe("whole")


def _clean(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isnan(value):
        return round(value, 6)
    return value


def _failure(er: Any, id_column: str) -> Failure:
    config = er.expectation_config
    kwargs = dict(config.kwargs)
    result = er.result or {}
    column = kwargs.get("column") or kwargs.get("column_list")
    if "column_A" in kwargs:  # a pair expectation: both columns, and the pairs it saw below
        column = f"{kwargs['column_A']}, {kwargs['column_B']}"
    if "observed_value" in result:
        observed = _clean(result["observed_value"])
    elif result.get("unexpected_count") == 0:
        observed = "0 unexpected"
    elif "unexpected_count" in result:
        observed = (
            f"{result['unexpected_count']} unexpected ({_clean(result.get('unexpected_percent', 0))}%)"
            f", e.g. {[_clean(v) for v in (result.get('partial_unexpected_list') or [])[:MAX_SHOWN_IDS]]}"
        )
    else:
        observed = "n/a"
    ids: list[str] = []
    for entry in result.get("unexpected_index_list") or []:
        if isinstance(entry, dict) and id_column in entry:
            value = str(entry[id_column])
            if value not in ids:
                ids.append(value)
        if len(ids) >= MAX_SHOWN_IDS:
            break
    detail = ""
    info = er.exception_info or {}
    if info.get("raised_exception") or info.get("exception_message"):
        detail = str(info.get("exception_message"))
    else:  # GX 1.x keys exception info by metric when several metrics fail
        messages = [v.get("exception_message") for v in info.values() if isinstance(v, dict) and v.get("raised_exception")]
        detail = "; ".join(str(m) for m in messages[:1])
    bounds = {k: kwargs[k] for k in ("min_value", "max_value", "value_set") if k in kwargs}
    if bounds:
        condition = kwargs.get("row_condition")  # GX keeps a pandas condition as {"pass_through_filter": text, ...}
        condition = condition.get("pass_through_filter", condition) if isinstance(condition, dict) else condition
        where = f" where {condition}" if condition else ""
        detail = f"expected {bounds}{where}" + (f"; {detail}" if detail else "")
    return Failure(config.type, str(column) if column else None, observed, ids, detail)


def check(
    suite_name: str,
    frame: pd.DataFrame,
    id_column: str = "id",
    parameters: dict[str, Any] | None = None,
    directory: Path = EXPECTATIONS_DIR,
) -> GateResult:
    """Validate `frame` against a suite; suite parameters (`{"$PARAMETER": ...}`) come from `parameters`."""
    suite = load_suite(suite_name, directory)
    batch = _batch_definition().get_batch(batch_parameters={"dataframe": frame})
    result_format = {"result_format": "COMPLETE", "partial_unexpected_count": MAX_SHOWN_IDS}
    if id_column in frame.columns:
        result_format["unexpected_index_column_names"] = [id_column]
    outcome = batch.validate(suite, expectation_parameters=parameters or {}, result_format=result_format)
    failures = [_failure(er, id_column) for er in outcome.results if not er.success]
    failures.sort(key=lambda f: (f.expectation, f.column or ""))
    passed = [_failure(er, id_column) for er in outcome.results if er.success]
    passed.sort(key=lambda f: (f.expectation, f.column or ""))
    return GateResult(suite_name, len(frame), len(outcome.results), failures, passed)


def publish(result: GateResult) -> None:
    """Publish the gate report as a Prefect markdown artifact when running inside a flow or task."""
    from prefect.context import FlowRunContext, TaskRunContext

    if FlowRunContext.get() is None and TaskRunContext.get() is None:
        return
    from prefect.artifacts import create_markdown_artifact

    from tasks.stages import BY_SUITE

    owner = BY_SUITE.get(result.suite)
    create_markdown_artifact(
        key=owner.gate_artifact if owner else f"gate-{result.suite}".lower().replace("_", "-"),
        markdown=result.markdown(),
        description=f"Gate {result.suite}: {'passed' if result.success else 'failed'}",
    )


def enforce(suite_name: str, frame: pd.DataFrame, **options) -> GateResult:
    """`check` (same options), publish the report, and raise `GateError` if any expectation failed."""
    result = check(suite_name, frame, **options)
    publish(result)
    if not result.success:
        raise GateError(result)
    return result
