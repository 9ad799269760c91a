"""Kimi-K2.5 in miniature through every stage: configs/kimi-k2.5-mini.yaml run whole, as `make kimi-mini` runs it,
then draftsmith's own decoding loop on the same held-out prompts for the τ vLLM's counters give.

    .venv/bin/python bench/kimi_mini.py          # needs .venv-vllm (make .venv-vllm/.installed)

Builds the miniature (tests/support/kimi_mini.py: the real checkpoint's layout, random weights) into a temporary
folder, runs the pipeline there (replies from vLLM serving it with Kimi's parsers and thinking on; guided, extract
and evaluate on vLLM), and reads each stage's outputs: what was checked and what it came to. draftsmith's loop runs on
the miniature's text body in transformers (the same weights, in bf16 as vLLM serves them; transformers has no class
for the wrapper). The tables land in bench/results/kimi-mini.json.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tasks  # noqa: E402,F401  (offline defaults)
from bench.publish import Table, save  # noqa: E402
from tasks.config.loading import load_config  # noqa: E402
from tasks.storage import read_table  # noqa: E402
from tests.support.kimi_mini import build_kimi_mini, text_body_model  # noqa: E402
from tests.support.validation import classes_by_mode, exact_rows_lost  # noqa: E402

CONFIG = ROOT / "configs" / "kimi-k2.5-mini.yaml"


def checks(config, measured: dict, own: dict) -> Table:
    import pandas as pd

    run = config.run_dir
    table = Table("Kimi-K2.5 miniature, every stage through vLLM", ["stage", "what was checked", "result"])
    table.add("build", "the miniature written (config, 2 shards, tokenizer), seconds", measured["build"])
    gens = read_table("generations", run / "generations").to_pandas()
    table.add("generate", "replies from vLLM with Kimi's parsers, thinking on", len(gens))
    table.add("generate", "of them on prompts with tools (BFCL)", int(gens["tools"].notna().sum()))
    table.add("generate", "of them cut inside the reasoning (max_tokens)", int((gens["finish_reason"] == "length").sum()))
    rates = pd.read_parquet(run / "validation" / "rates.parquet").groupby("mode")[["rows", "exact"]].sum()
    check = rates.loc["check"]
    table.add("validate", "rebuilt ids equal to the server's", f"{int(check['exact'])}/{int(check['rows'])}")
    classes = classes_by_mode(run)
    lost = exact_rows_lost(classes)
    played = {"simulate": "as text, rebuilt in one pass: exact", "simulate-guided": "as text, guided on vLLM: exact"}
    for mode, what in played.items():
        table.add("validate", what, f"{int(rates.loc[mode, 'exact'])}/{int(rates.loc[mode, 'rows'])}")
    table.add("validate", "exact rows guided lost", lost)
    meta = json.loads((run / "hidden_states" / "meta.json").read_text())
    table.add("extract", "tokens stored from vLLM", measured["tokens"])
    table.add("extract", "state width; aux layers", f"{meta['hidden_size']}; {meta['aux_layer_ids']}")
    served = json.loads((run / "eval" / "results.json").read_text())["summary"]
    exported = json.loads((run / "draft" / "export" / "config.json").read_text())
    table.add("train", "export (draft vocabulary)", f"{exported['architectures'][0]} ({exported['draft_vocab_size']})")
    table.add("evaluate", "τ, vLLM serving target and draft", served["acceptance_length"])
    table.add("evaluate", "τ, draftsmith's loop on the text body", own["acceptance_length"])
    table.add("evaluate", "τ of the untrained draft, vLLM", served["untrained_acceptance_length"])
    identical = f"{served['identical']}/{served['prompts']} / {own['identical']}/{own['prompts']}"
    table.add("evaluate", "outputs equal to greedy, vLLM / draftsmith", identical)
    table.add("all", "pipeline wall-clock, seconds", measured["pipeline"])
    return table


def main() -> None:
    from flows.pipeline import eagle3_pipeline
    from tasks.evaluate.stage import evaluate_draft

    os.environ.setdefault("DRAFTSMITH_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python"))
    measured = {}
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        mini = build_kimi_mini(Path(tmp) / "kimi-k2.5-mini")
        measured["build"] = round(time.perf_counter() - started, 1)
        config = load_config(CONFIG, {"runs_dir": str(Path(tmp) / "runs"), "target.path": str(mini)})
        started = time.perf_counter()
        results = eagle3_pipeline(config)
        measured["pipeline"] = round(time.perf_counter() - started)
        measured["tokens"] = results["extract"]["tokens"]
        local = config.model_copy(update={"evaluate": config.evaluate.model_copy(update={"engine": "transformers"})})
        own = evaluate_draft(local, target=text_body_model(mini, "bfloat16"), out=Path(tmp) / "eval-transformers")
        table = checks(config, measured, own)
    save("kimi-mini", [table], raw={"measured": measured, "draftsmith_loop": own})


if __name__ == "__main__":
    main()
