"""Per-source rates and the markdown report of the validate stage."""

from __future__ import annotations

import pandas as pd

from tasks.validate.classify import BPE_ONLY, CLASSES, SEMANTIC

SIMULATE, SIMULATE_GUIDED = "simulate", "simulate-guided"
RATE_COLUMNS = ["source", "mode", "rows", "verified", *CLASSES, "semantic_rate", "bpe_only_rate"]


def rates_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (source, mode): class counts, and rates over verified rows (0 when none are verified)."""
    if rows.empty:
        return pd.DataFrame({c: pd.Series(dtype="float64" if c.endswith("_rate") else "object") for c in RATE_COLUMNS})
    counts = pd.crosstab([rows["source"], rows["mode"]], rows["klass"]).reindex(columns=list(CLASSES), fill_value=0)
    counts = counts.reset_index()
    counts.columns.name = None
    counts["rows"] = counts[list(CLASSES)].sum(axis=1)
    counts["verified"] = counts["rows"] - counts["unverified"]
    denominator = counts["verified"].where(counts["verified"] > 0, 1)
    counts["semantic_rate"] = (counts[SEMANTIC] / denominator).astype("float64")
    counts["bpe_only_rate"] = (counts[BPE_ONLY] / denominator).astype("float64")
    return counts[RATE_COLUMNS].sort_values(["mode", "source"]).reset_index(drop=True)


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ") if text is not None else "-"


ORIGIN_MARK = " (origin dataset)"


def report_markdown(
    rates: pd.DataFrame,
    rows: pd.DataFrame,
    examples: int,
    guided: dict[str, dict] | None = None,
    borrowed: set[str] = frozenset(),
) -> str:
    """Rates per source and mode, guided beside canonical where it ran, then the first examples of each mismatch.
    Sources of a dataset's own replies (`borrowed`) are marked: they have no target tokens to verify."""
    lines = [
        "# Validation",
        "",
        "`check`: rebuilt ids vs the server's ids. `simulate`: the text API played on rows with true ids, "
        "then re-encoded in one pass (canonical); `simulate-guided`: the same rows re-split by `guided`. "
        "Rates are over verified rows.",
        "",
        "| source | mode | rows | exact | bpe_only | semantic | unverified | bpe_only rate | semantic rate |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rates.itertuples(index=False):
        source = r.source + (ORIGIN_MARK if r.source in borrowed else "")
        lines.append(
            f"| {source} | {r.mode} | {r.rows} | {r.exact} | {r.bpe_only} | {r.semantic} | {r.unverified} "
            f"| {r.bpe_only_rate:.2%} | {r.semantic_rate:.2%} |"
        )
    if guided:
        lines += ["", "## Guided vs canonical (simulate)", ""]
        lines += ["| source | rows | rows changed | exact rows lost | mean nats gained | s per 1,000 tokens |"]
        lines.append("|---|---|---|---|---|---|")
        for source, g in sorted(guided.items()):
            gained = g["nats"] / g["changed"] if g["changed"] else 0.0
            lines.append(
                f"| {source} | {g['rows']} | {g['changed']} | {g['exact_lost']} | {gained:.1f} "
                f"| {1000 * g['seconds'] / max(1, g['tokens']):.2f} |"
            )
    mismatches = rows[rows["klass"].isin([BPE_ONLY, SEMANTIC])]
    if examples and not mismatches.empty:
        lines += ["", "## First examples", "", "The row, the token where its ids first differ, the tokens around it."]
        for (source, mode, klass), group in mismatches.groupby(["source", "mode", "klass"], sort=True):
            lines += ["", f"### {source} · {mode} · {klass}", "", "| id | at token | truth | rebuilt |", "|---|---|---|---|"]
            for r in group.head(examples).itertuples(index=False):
                lines.append(
                    f"| {_cell(r.id)} | {int(r.first_divergence)} | {_cell(r.truth_context)} | {_cell(r.rebuilt_context)} |"
                )
    return "\n".join(lines) + "\n"
