"""The docs stay true: references generated from the code, figures only from results files, never typed into prose.

`make docs` (part of `make test`) builds the site with --strict; these tests check what a build cannot see.
"""

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROSE = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# The README may carry one figure, on its headline line.
HEADLINE = "<!-- headline -->"
# A measured figure typed into prose: an acceptance length (τ, tau), a throughput (tokens/s, rows/s), a run's time
# to the second, or a table row of two or more measured decimals.
TYPED_FIGURE = re.compile(
    r"(?:τ|\btau\b|acceptance length)[^|\n]{0,40}?\b\d\.\d{2,}"
    r"|\b\d[\d,]*(?:\.\d+)?\s*k?\s*(?:tokens|tok|rows|requests)\s*/\s*s\b"
    r"|\b\d+ min \d+ s\b"
    r"|^\|.*\b\d\.\d{2,}\b.*\b\d\.\d{2,}\b",
    re.IGNORECASE,
)


def macros():
    spec = importlib.util.spec_from_file_location("docs_macros", ROOT / "docs" / "macros.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def results_files() -> list[Path]:
    return sorted((ROOT / "bench" / "results").glob("*.json"))


def test_the_config_reference_shows_every_key_with_its_docstring():
    from tasks.config import config_fields

    page = macros().config_reference()
    for key, _, _, description in config_fields():
        assert f"| `{key}` |" in page, f"{key} missing from the generated config reference"
        assert description and description.replace("|", "\\|")[:40] in page, key


@pytest.mark.parametrize(
    "text, typed",
    [
        ("τ 1.103 vs 1.000 untrained", True),
        ("the acceptance length reached 1.57", True),
        ("extract runs at 12,400 tokens/s on two cores", True),
        ("1.6k tok/s", True),
        ("`make test` took 6 min 47 s", True),
        ("| 3.1, Llama | 1,487 | 404 | 1.531 | 1.418 ± 0.038 |", True),
        ("| `train.lr` | float | 0.0001 | peak learning rate |", False),
        ("the gate fails when τ does not beat the untrained τ by `min_tau_gain`", False),
        ("`train.max_steps` (default 200)", False),
    ],
)
def test_the_typed_figure_check_tells_a_figure_from_prose(text, typed):
    assert bool(TYPED_FIGURE.search(text)) is typed


def test_no_measured_figure_is_typed_into_the_readme_or_the_docs():
    typed = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}"
        for path in PROSE
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if TYPED_FIGURE.search(line) and not (path.name == "README.md" and HEADLINE in line)
    ]
    assert typed == [], "figures belong in bench/results/*.json, rendered by the docs:\n" + "\n".join(typed)
    headlines = (ROOT / "README.md").read_text(encoding="utf-8").count(HEADLINE)
    assert headlines <= 1, "the README holds one headline figure at most"


def test_the_readme_stays_a_few_screens():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 250


def test_every_results_file_says_what_ran_where_and_when():
    from bench.publish import load

    assert results_files(), "no results files under bench/results/"
    for path in results_files():
        envelope = load(path.stem)
        assert envelope["bench"] == path.stem, path
        assert envelope["command"].startswith(".venv/bin/python bench/"), path
        assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", envelope["commit"]), path
        assert envelope["machine"].get("cpu") and envelope["machine"].get("cores"), path
        for table in envelope["tables"]:
            assert all(len(row) == len(table["columns"]) for row in table["rows"]), (path, table["title"])


def test_every_results_file_is_rendered_by_a_docs_page():
    pages = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "docs").rglob("*.md"))
    called = set(re.findall(r"""results\(\s*["']([\w.-]+)["']""", pages))
    assert {p.stem for p in results_files()} <= called, "a results file no page renders"
    assert called <= {p.stem for p in results_files()}, "a page renders a results file that does not exist"


def test_a_page_that_calls_a_macro_renders_macros():
    """Pages opt in to macros (`render_macros: true`): a call on any other page would show as its literal text."""
    literal = [
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "docs").rglob("*.md")
        if "{{ results(" in (text := p.read_text(encoding="utf-8")) and not text.startswith("---\nrender_macros: true\n")
    ]
    assert not literal, f"these pages call results() without render_macros: true: {literal}"


def test_every_bench_writes_its_figures_through_publish():
    benches = [p for p in (ROOT / "bench").glob("*.py") if p.name != "publish.py"]
    silent = [p.name for p in benches if "from bench.publish import" not in p.read_text(encoding="utf-8")]
    assert silent == []


def test_a_results_file_without_provenance_is_refused(tmp_path, monkeypatch):
    from bench import publish

    monkeypatch.setattr(publish, "RESULTS", tmp_path)
    (tmp_path / "bare.json").write_text(json.dumps({"tables": []}))
    with pytest.raises(ValueError, match="bare.json: no 'command'"):
        publish.load("bare")
