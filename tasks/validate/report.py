"""Per-source rates and the markdown report of the validate stage."""

from __future__ import annotations

import pandas as pd

from tasks.contracts import COUNT_VERIFIED, UNCOUNTED
from tasks.validate.classify import BPE_ONLY, CLASSES, EXACT, SEMANTIC, UNVERIFIED

SIMULATE, SIMULATE_GUIDED = "simulate", "simulate-guided"
# Per (source, mode), from the provider's counts: rows counted; count_verified; mismatches by side; `count_agreement`
# (rows with true ids whose counts agree with them: the convention holds); `text_count_verified` (text-only rows whose
# rebuilt lengths are the provider's); `count_precision` (count matched -> exact) and `count_recall` (not exact ->
# count mismatched), over rows with true ids.
COUNT_RATES = ["count_agreement", "text_count_verified", "prompt_mismatch_rate", "count_precision", "count_recall"]
COUNT_COLUMNS = ["counted", "count_verified", "reply_mismatch", "prompt_mismatch", *COUNT_RATES]
RATE_COLUMNS = ["source", "mode", "rows", "verified", *CLASSES, "semantic_rate", "bpe_only_rate", *COUNT_COLUMNS]


def _share(hits: pd.Series, among: pd.Series) -> float:
    """hits / among over boolean series (NaN when `among` holds no row)."""
    return float((hits & among).sum() / among.sum()) if among.any() else float("nan")


def count_rates(group: pd.DataFrame) -> pd.Series:
    """The count figures of one (source, mode) group of validation rows."""
    verdict = group["count_verdict"].fillna(UNCOUNTED) if "count_verdict" in group else pd.Series(UNCOUNTED, group.index)
    counted = verdict != UNCOUNTED
    prompt_ok = group.get("prompt_count_ok", pd.Series(None, group.index)).astype("boolean")
    reply_ok = group.get("reply_count_ok", pd.Series(None, group.index)).astype("boolean")
    verified = counted & (group["klass"] != UNVERIFIED)
    # Server ids include the prompt's; logprob rows' prompts are rendered here, so only their replies are the truth.
    method = group["method"] if "method" in group else pd.Series("", group.index)
    agrees = reply_ok.fillna(False) & (prompt_ok.fillna(False) | (method != "server_ids"))
    matched, known = reply_ok.fillna(False), reply_ok.notna() & (group["klass"] != UNVERIFIED)
    checked = (group["mode"] == "check").all()  # the rebuilt ids themselves; else a text-only rebuild played on truth
    none = pd.Series(False, group.index)
    return pd.Series(
        {
            "counted": int(counted.sum()),
            "count_verified": int((verdict == COUNT_VERIFIED).sum()),
            "reply_mismatch": int((reply_ok == False).fillna(False).sum()),  # noqa: E712 (a nullable boolean)
            "prompt_mismatch": int((prompt_ok == False).fillna(False).sum()),  # noqa: E712
            "count_agreement": _share(agrees, verified if checked else none),
            "text_count_verified": _share(verdict == COUNT_VERIFIED, counted & (group["klass"] == UNVERIFIED)),
            "prompt_mismatch_rate": _share((prompt_ok == False).fillna(False), counted),  # noqa: E712
            "count_precision": _share(group["klass"] == EXACT, known & matched & ~checked),
            "count_recall": _share(~matched, known & (group["klass"] != EXACT) & ~checked),
        }
    )


def rates_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (source, mode): class counts, and rates over verified rows (0 when none are verified), and the
    count figures."""
    if rows.empty:
        return pd.DataFrame(
            {c: pd.Series(dtype="float64" if c.endswith("_rate") or c in COUNT_RATES else "object") for c in RATE_COLUMNS}
        )
    counts = pd.crosstab([rows["source"], rows["mode"]], rows["klass"]).reindex(columns=list(CLASSES), fill_value=0)
    counts = counts.reset_index()
    counts.columns.name = None
    counts["rows"] = counts[list(CLASSES)].sum(axis=1)
    counts["verified"] = counts["rows"] - counts["unverified"]
    denominator = counts["verified"].where(counts["verified"] > 0, 1)
    counts["semantic_rate"] = (counts[SEMANTIC] / denominator).astype("float64")
    counts["bpe_only_rate"] = (counts[BPE_ONLY] / denominator).astype("float64")
    figures = rows.groupby(["source", "mode"])[list(rows.columns)].apply(count_rates).reset_index()
    counts = counts.merge(figures, on=["source", "mode"], how="left")
    return counts[RATE_COLUMNS].sort_values(["mode", "source"]).reset_index(drop=True)


HINT_COLUMNS = ["source", "method", "finish_reason", "prompt_count", "reply_count", "provider_prompt_count"]
HINT_COLUMNS += ["provider_reply_count", "reasoning_count", "provider_reasoning_count", "whitespace"]


def _usual_gap(gap: pd.Series) -> tuple[int, int] | None:
    """The most common nonzero gap and how many rows have it (None when every gap is 0)."""
    if not len(gap) or not (gap != 0).any():
        return None
    usual = int(gap.mode().iloc[0])
    return usual, int((gap == usual).sum())


def convention_hints(rebuilt: pd.DataFrame) -> dict[str, str]:
    """Per source, what the rows with true ids say of its count convention where they disagree with it: the usual gap
    between the provider's count (as the convention reads it) and the true length, and the setting that closes it."""
    hints = {}
    truth = rebuilt[rebuilt["method"].isin(["server_ids", "logprobs"]) & rebuilt["provider_reply_count"].notna()]
    for source, rows in truth.groupby("source"):
        found = []
        finished = rows[rows["finish_reason"] != "length"]
        if reply := _usual_gap((finished["provider_reply_count"] - finished["reply_count"]).astype(int)):
            fix = {-1: "counts.end_of_turn: false", 1: "counts.end_of_turn: true"}.get(reply[0], "another convention")
            found.append(f"reply {reply[0]:+d} token(s) on {reply[1]} of {len(finished)} finished rows ({fix})")
        served = rows[(rows["method"] == "server_ids") & rows["provider_prompt_count"].notna()]
        if prompt := _usual_gap((served["provider_prompt_count"] - served["prompt_count"]).astype(int)):
            fix = f"raise counts.prompt_offset by {prompt[0]:+d}"
            found.append(f"prompt {prompt[0]:+d} on {prompt[1]} of {len(served)} rows with server ids ({fix})")
        if found:
            hints[source] = "counts disagree with the true ids: " + "; ".join(found)
    for source, note in [*unreliable_reasoning(rebuilt).items(), *restored_whitespace(rebuilt).items()]:
        hints[source] = "; ".join(filter(None, [hints.get(source), note]))
    return hints


def restored_whitespace(rebuilt: pd.DataFrame) -> dict[str, str]:
    """Per source with rows off their count by whitespace a provider dropped at a parser join: how many the count
    settled (restored) and how many it could not (left off their count)."""
    tried = rebuilt[rebuilt["whitespace"].notna()] if "whitespace" in rebuilt else rebuilt.iloc[:0]
    out = {}
    for source, rows in tried.groupby("source"):
        restored = int((rows["whitespace"] == "restored").sum())
        out[source] = (
            f"whitespace dropped at parser joins restored on {restored} rows, {len(rows) - restored} left off their count"
        )
    return out


def unreliable_reasoning(rebuilt: pd.DataFrame) -> dict[str, str]:
    """Per source whose provider reports reasoning counts that disagree with the reasoning rebuilt while its
    completion counts agree (a 0 beside reasoning text, as vLLM counted for templates that prefill `<think>`): how
    often. Such rows are judged on completion_tokens alone."""
    out = {}
    reported = rebuilt[rebuilt["provider_reasoning_count"].notna() & rebuilt["reasoning_count"].notna()]
    for source, rows in reported.groupby("source"):
        off = rows[
            (rows["provider_reasoning_count"] != rows["reasoning_count"]) & (rows["provider_reply_count"] == rows["reply_count"])
        ]
        if len(off):
            zero = int((off["provider_reasoning_count"] == 0).sum())
            out[source] = (
                f"reasoning count unreliable on {len(off)} of {len(rows)} rows that report one ({zero} report 0 beside "
                "reasoning text): judged on completion_tokens alone"
            )
    return out


def _pct(value: float) -> str:
    return "-" if pd.isna(value) else f"{value:.1%}"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ") if text is not None else "-"


ORIGIN_MARK = " (origin dataset)"


def report_markdown(
    rates: pd.DataFrame,
    rows: pd.DataFrame,
    examples: int,
    guided: dict[str, dict] | None = None,
    borrowed: set[str] = frozenset(),
    hints: dict[str, str] | None = None,
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
    counted = rates[rates["counted"].fillna(0) > 0] if "counted" in rates else rates.iloc[0:0]
    if not counted.empty:
        lines += [
            "",
            "## The provider's token counts",
            "",
            "`agreement`: rows with true ids whose counts agree with them (the count convention holds). `text verified`: "
            "text-only rows whose rebuilt lengths are the provider's. `precision`: count matched -> exact; `recall`: not "
            "exact -> count mismatched (rows with true ids). A count match is no proof: a re-split of the same length passes.",
            "",
            "| source | mode | counted | count verified | reply mismatch | prompt mismatch | agreement | text verified "
            "| precision | recall |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in counted.itertuples(index=False):
            shares = [_pct(getattr(r, c)) for c in ("count_agreement", "text_count_verified", "count_precision", "count_recall")]
            sides = f"{int(r.counted)} | {int(r.count_verified)} | {int(r.reply_mismatch)} | {int(r.prompt_mismatch)}"
            lines.append(f"| {r.source} | {r.mode} | {sides} | " + " | ".join(shares) + " |")
        for source, hint in sorted((hints or {}).items()):
            lines.append(f"\n**{source}**: {hint}.")
    if guided:
        lines += ["", "## Guided vs canonical (simulate)", ""]
        lines += ["| source | rows | rows searched | rows changed | exact rows lost | mean nats gained | s per 1,000 tokens |"]
        lines.append("|---|---|---|---|---|---|---|")
        for source, g in sorted(guided.items()):
            gained = g["nats"] / g["changed"] if g["changed"] else 0.0
            lines.append(
                f"| {source} | {g['rows']} | {g['searched']} | {g['changed']} | {g['exact_lost']} | {gained:.1f} "
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
