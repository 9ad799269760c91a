from pathlib import Path

import pandas as pd
import pytest

from tasks.gates import EXPECTATIONS_DIR, GateError, check, enforce, load_suite

SUITES = Path(__file__).resolve().parents[1] / "fixtures" / "expectations"


def frame(**columns):
    base = {"id": ["r1", "r2", "r3"], "n_tokens": [5, 9, 12], "finish_reason": ["stop", "stop", "length"]}
    return pd.DataFrame(base | columns)


def test_gate_passes():
    result = enforce("probe", frame(), parameters={"max_tokens": 100}, directory=SUITES)
    assert result.success and result.evaluated == 3


def test_gate_names_expectation_column_value_and_rows():
    bad = frame(n_tokens=[5, 0, 500], finish_reason=["stop", "tool", "length"])
    with pytest.raises(GateError) as err:
        enforce("probe", bad, parameters={"max_tokens": 100}, directory=SUITES)
    message = str(err.value)
    assert "expect_column_values_to_be_between on column 'n_tokens'" in message
    assert "['r2', 'r3']" in message
    assert "expect_column_values_to_be_in_set on column 'finish_reason'" in message
    assert "'tool'" in message
    assert len(err.value.result.failures) == 2


def test_the_report_lists_every_expectation_with_what_it_observed():
    """A passing gate's card names each expectation, its column, what it saw and its bounds; a failing one
    marks the failures and their rows."""
    passed = check("probe", frame(), parameters={"max_tokens": 100}, directory=SUITES).markdown()
    rows = [line for line in passed.splitlines() if line.startswith("| ✓ |")]
    assert len(rows) == 3 and any("n_tokens" in r and "'max_value': 100" in r for r in rows)
    bad = frame(n_tokens=[5, 0, 500])
    failed = check("probe", bad, parameters={"max_tokens": 100}, directory=SUITES).markdown()
    [row] = [line for line in failed.splitlines() if line.startswith("| ✗ |")]
    assert "n_tokens" in row and "r2, r3" in row and failed.count("| ✓ |") == 2


def test_parameters_change_the_limit():
    assert not check("probe", frame(), parameters={"max_tokens": 10}, directory=SUITES).success
    assert check("probe", frame(), parameters={"max_tokens": 12}, directory=SUITES).success


def test_missing_column_fails_not_crashes():
    result = check("probe", frame().drop(columns=["n_tokens"]), parameters={"max_tokens": 9}, directory=SUITES)
    assert [f.column for f in result.failures] == ["n_tokens"]


def test_unknown_expectation_type_is_an_error():
    with pytest.raises(ValueError, match="expect_column_values_to_be_wonderful"):
        load_suite("unknown", SUITES)


def test_project_suites_load_whole():
    for path in sorted(EXPECTATIONS_DIR.glob("*.json")):
        assert load_suite(path.stem).expectations, path
