"""A bench's figures as a results file: `bench/results/<bench>.json`, rendered into the docs at build time.

Every file is one envelope: what was run (`command`), where (`machine`: CPU model, cores, memory and the CPU flags
that decide torch's speed), when (`date`), at which `commit`, the `tables` the docs show (title, columns, rows,
an optional note) and, where a bench plots, `plots` (series of x/y points). `raw` keeps the bench's own figures
as measured, so a later renderer can show more without a rerun.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
# CPU flags that change what torch runs (bf16 and AMX matmuls, AVX-512 kernels); the rest would only be noise.
SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


@dataclass
class Table:
    """One table of a results page: `rows` hold plain values (str, int, float, None); the renderer formats them."""

    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    note: str = ""

    def add(self, *cells: Any) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"table {self.title!r}: {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(list(cells))

    def markdown(self) -> str:
        """The table as Markdown, for the bench's own console output."""
        return markdown_table(asdict(self))


@dataclass
class Plot:
    """A plot of `series`, each {"label", "x", "y"} and optionally "yerr" (error bars). With `x_ticks`, x values are
    positions among those labels (categories); `lines: False` draws the points alone."""

    title: str
    x_label: str
    y_label: str
    series: list[dict[str, Any]]
    x_log: bool = False
    x_ticks: list[str] = field(default_factory=list)
    lines: bool = True


def format_cell(value: Any) -> str:
    """Numbers as a person reads them: thousands separated; floats whole from 100, to 1 decimal from 10, else to 3
    decimals (or 3 significant digits below 0.01)."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value).replace("|", "\\|")
    if isinstance(value, int):
        return f"{value:,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3f}" if abs(value) >= 0.01 or value == 0 else f"{value:.3g}"


def markdown_table(table: dict[str, Any], cell=format_cell) -> str:
    """A table (as stored in a results file) as Markdown: its title in bold, `cell` rendering each value and header."""
    lines = [f"**{cell(table['title'])}**", "", "| " + " | ".join(cell(c) for c in table["columns"]) + " |"]
    lines.append("|" + "---|" * len(table["columns"]))
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in table["rows"]]
    return "\n".join(lines + (["", table["note"]] if table.get("note") else []))


def machine() -> dict[str, Any]:
    """This machine: CPU model, cores, memory, the speed-relevant CPU flags, and torch's version."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in cpuinfo.splitlines())}
    flags, model = set(fields.get("flags", "").split()), fields.get("model name", "")
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    return {
        "cpu": model or platform.processor(),
        "cores": os.cpu_count(),
        "memory_gib": round(memory, 1),
        "flags": [f for f in SPEED_FLAGS if f in flags],
        "torch": torch_version,
        "python": platform.python_version(),
    }


def commit() -> str:
    """The checked-out commit, with `-dirty` when the tree has uncommitted changes to tracked files."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()

    head = git("rev-parse", "HEAD") or "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def command(argv: list[str] | None = None) -> str:
    """The command line as typed from the project root: `python bench/<name>.py ARGS`."""
    argv = sys.argv if argv is None else argv
    script = Path(argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join([".venv/bin/python", str(shown), *argv[1:]])


def save(
    bench: str,
    tables: list[Table],
    raw: Any = None,
    plots: list[Plot] = (),
    argv: list[str] | None = None,
    notes: str = "",
) -> Path:
    """Write `bench/results/<bench>.json` atomically, print its tables, and return its path."""
    envelope = {
        "bench": bench,
        "command": command(argv),
        "machine": machine(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
        "notes": notes,
        "tables": [asdict(t) for t in tables],
        "plots": [asdict(p) for p in plots],
        "raw": raw,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{bench}.json"
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(envelope, indent=1, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    partial.replace(path)
    for table in tables:
        print(f"\n{table.markdown()}")
    print(f"\nresults: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return path


def load(bench: str) -> dict[str, Any]:
    """A results file's envelope; names the file and the missing key when it is not one."""
    path = RESULTS / f"{bench}.json"
    envelope = json.loads(path.read_text(encoding="utf-8"))
    for key in ("command", "machine", "date", "commit", "tables"):
        if key not in envelope:
            raise ValueError(f"{path}: no {key!r}: not a results file written by bench/publish.py")
    return envelope
