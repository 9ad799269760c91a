"""A validate stage's verdicts read back: each row's class per mode, and what guided lost of one-pass's exact rows."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from tasks.storage import read_table


def classes_by_mode(run_dir: Path) -> pd.DataFrame:
    """Row id × mode (check, simulate, simulate-guided) -> the row's class in that mode."""
    classes = read_table("validation", Path(run_dir) / "validation").to_pandas()
    return classes.pivot_table(index="id", columns="mode", values="klass", aggfunc="first")


def exact_rows_lost(classes: pd.DataFrame) -> int:
    """Rows a one-pass re-encode of the text got exact and guided did not."""
    return int(((classes["simulate"] == "exact") & (classes["simulate-guided"] != "exact")).sum())
