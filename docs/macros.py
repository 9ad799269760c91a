"""Pages rendered from the project itself at build time: the config reference from the pydantic models, and each
results section from its file under `bench/results/`. A page calls these with `render_macros: true`."""

from __future__ import annotations

import html
import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.publish import format_cell, load, markdown_table  # noqa: E402


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def config_reference() -> str:
    """Every config key, section by section: type, default and the field's own docstring."""
    from tasks.config import RunConfig, config_fields

    sections: dict[str, list[tuple[str, str, str, str]]] = {}
    for key, kind, default, description in config_fields():
        top = key.split(".", 1)[0].removesuffix("[]")
        sections.setdefault(top if "." in key else "run", []).append((key, kind, default, description))
    out = []
    for top, rows in sections.items():
        field = RunConfig.model_fields.get(top)
        about = " ".join((field.description or "").split()) if field else "Top-level keys of a run config."
        out += [f"## `{top}`", "", about, "", "| key | type | default | what it does |", "|---|---|---|---|"]
        out += [f"| `{key}` | `{cell(kind)}` | `{cell(default)}` | {cell(text)} |" for key, kind, default, text in rows]
        out.append("")
    return "\n".join(out)


def provenance(envelope: dict) -> str:
    """Where a results file's figures come from: command, machine, date and commit."""
    machine = envelope["machine"]
    flags = machine.get("flags")
    if flags is not None:  # None: not recorded (figures measured before the file existed)
        flags = ", ".join(flags) or "none of " + "/".join(("AVX2", "AVX-512", "AMX"))
    cpu = f"{machine.get('cpu') or 'unknown CPU'}, {machine.get('cores')} cores" + (f" ({flags})" if flags else "")
    commit = f"`{envelope['commit'][:12]}`" + (" with uncommitted changes" if envelope["commit"].endswith("-dirty") else "")
    lines = [
        f"`{envelope['command']}`",
        "",
        f"<small>{html.escape(cpu)}; {envelope['date'][:10]}; commit {commit}",
        f" ({envelope['bench']}.json)</small>",
    ]
    if envelope.get("notes"):
        lines += ["", envelope["notes"]]
    return "\n".join(lines)


def escaped(value) -> str:
    """A cell as the site shows it: formatted, on one line, and HTML-escaped so a token string such as `<s>` shows as
    itself (format_cell escapes `|`)."""
    return html.escape(format_cell(value).replace("\n", " "), quote=False)


def plot_svg(plot: dict) -> str:
    """A results plot as inline SVG (drawn at build time from the file's series)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    for series in plot["series"]:
        style = {"marker": "o", "label": series["label"], "linestyle": "-" if plot.get("lines", True) else "none"}
        ax.errorbar(series["x"], series["y"], yerr=series.get("yerr"), capsize=3, **style)
    if plot.get("x_log"):
        ax.set_xscale("log")
    if plot.get("x_ticks"):
        ax.set_xticks(range(len(plot["x_ticks"])), plot["x_ticks"], fontsize=7)
    ax.set(title=plot["title"], xlabel=plot["x_label"], ylabel=plot["y_label"])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    buffer = io.StringIO()
    with plt.rc_context({"svg.hashsalt": plot["title"]}):  # the same file draws the same SVG, build after build
        fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    svg = buffer.getvalue()
    return '<div class="results-plot">' + svg[svg.index("<svg") :] + "</div>"


def results(bench: str) -> str:
    """One results file as its provenance, its tables and its plots."""
    envelope = load(bench)
    parts = [provenance(envelope), *(markdown_table(t, escaped) for t in envelope["tables"])]
    return "\n\n".join(parts + [plot_svg(p) for p in envelope.get("plots") or []])


def define_env(env) -> None:
    """mkdocs-macros entry point."""
    for function in (config_reference, results):
        env.macro(function)
