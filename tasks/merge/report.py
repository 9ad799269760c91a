"""Markdown report of a merge: the mix (requested vs realised), rows by origin (the target's replies vs a
dataset's own), and drops per reason and source."""

from __future__ import annotations


def _share(value: float | None) -> str:
    return "all rows" if value is None else f"{100 * value:.1f}%"


def render_report(manifest: dict) -> str:
    """The mix table and the drops table, as one markdown document."""
    lines = [
        "# Merge: mix and drops",
        "",
        f"{manifest['rows']['train']} train rows and {manifest['rows']['eval']} eval rows "
        f"from {manifest['rows']['input']} input rows (seed {manifest['config']['seed']}).",
        "",
        "Requested and realised shares are among weighted sources; unweighted sources keep every row.",
        "",
        "| source | weight | max_rows | available | requested | realised | share of set | train | eval |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, mix in manifest["mix"].items():
        counts = manifest["counts"][name]
        lines.append(
            f"| {name} | {mix['weight'] if mix['weight'] is not None else '-'} "
            f"| {mix['max_rows'] if mix['max_rows'] is not None else '-'} | {counts['available']} "
            f"| {_share(mix['requested_share'])} | {_share(mix['realised_share'])} "
            f"| {_share(mix['share_of_set'])} | {counts['train']} | {counts['eval']} |"
        )
    lines += ["", "| origin | train rows | eval rows | train tokens | eval tokens |", "|---|---|---|---|---|"]
    for origin, n in manifest.get("by_origin", {}).items():
        lines.append(f"| {origin} | {n['train']} | {n['eval']} | {n['train_tokens']} | {n['eval_tokens']} |")
    if manifest.get("by_count_verdict"):
        lines += ["", "| count verdict | train rows | eval rows |", "|---|---|---|"]
        for verdict, n in manifest["by_count_verdict"].items():
            lines.append(f"| {verdict} | {n['train']} | {n['eval']} |")
    sources = list(manifest["mix"])
    lines += ["", "| reason | " + " | ".join(sources) + " | total |", "|---|" + "---|" * (len(sources) + 1)]
    if not manifest["drops"]:
        lines.append("| (no drops) |" + " 0 |" * (len(sources) + 1))
    for reason, per_source in manifest["drops"].items():
        cells = [str(per_source.get(name, 0)) for name in sources]
        lines.append(f"| {reason} | " + " | ".join(cells) + f" | {sum(per_source.values())} |")
    return "\n".join(lines)
