"""Draft training benchmark: tokens/s, and τ of a trained vs untrained vs no-TTT draft, one table.

    .venv/bin/python bench/train.py            # the demo budget from configs/demo.yaml
    .venv/bin/python bench/train.py --quick    # fewer steps, prompts and tokens

Data: ShareGPT conversations (first user turn and reply, cut to --max-tokens) rendered with the
demo target's chat template and run through the extract stage, cached under runs/bench-train/.
Held-out prompts come from the merged eval split, as in the evaluate stage. The table lands in
bench/results/train.json.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import tasks  # noqa: E402,F401  (offline defaults)
from bench.publish import Table, save  # noqa: E402
from tasks.config import RunConfig, load_config  # noqa: E402
from tasks.draft.data import OfflineSource  # noqa: E402
from tasks.draft.export import ExportTarget, export_draft, load_export  # noqa: E402
from tasks.draft.stage import train_stage  # noqa: E402
from tasks.draft.train import build_draft, pieces_from_model, prepare_vocab  # noqa: E402
from tasks.evaluate.speculative import acceptance_by_position, greedy_decode, speculative_decode  # noqa: E402
from tasks.evaluate.stage import held_out_prompts, stop_ids  # noqa: E402
from tasks.storage import write_table  # noqa: E402
from tasks.target_model.assets import resolve_path  # noqa: E402
from tasks.target_model.loader import load_model, load_tokenizer  # noqa: E402


def sharegpt_rows(config: RunConfig, tokenizer, rows: int, max_tokens: int) -> list[dict]:
    """The first user turn and reply of ShareGPT conversations, rendered and cut to `max_tokens`."""
    from tasks.generate.sources import iter_json_array

    out = []
    for item in iter_json_array(resolve_path(config.generate.sources[0].path)):
        if len(out) >= rows or not isinstance(item, tuple):
            break
        turns = item[0].get("conversations") or []
        if len(turns) < 2 or turns[0].get("from") != "human" or turns[1].get("from") != "gpt":
            continue
        user, reply = str(turns[0]["value"]).strip(), str(turns[1]["value"]).strip()
        if not user or len(reply) < 200:
            continue
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        if len(prompt_ids) > max_tokens // 2:
            continue
        reply_ids = tokenizer.encode(reply, add_special_tokens=False)[: max_tokens - len(prompt_ids)]
        ids = prompt_ids + reply_ids
        out.append(
            {
                "id": f"sharegpt-{len(out):04d}",
                "source": "sharegpt",
                "input_ids": ids,
                "loss_mask": [0] * len(prompt_ids) + [1] * len(reply_ids),
                "num_tokens": len(ids),
            }
        )
    return out


def prepare_data(config: RunConfig, rows: int, eval_rows: int, max_tokens: int) -> None:
    """merged/ and hidden_states/ for the bench run, built once."""
    from tasks.extract.stage import EXTRACT

    if (config.run_dir / "hidden_states" / "meta.json").exists():
        return
    data = sharegpt_rows(config, load_tokenizer(config.target), rows + eval_rows, max_tokens)
    for i, row in enumerate(data):
        row["split"] = "eval" if i >= rows else "train"
    for split in ("train", "eval"):
        write_table("merged", [r for r in data if r["split"] == split], config.run_dir / "merged" / split / "part-00000.parquet")
    started = time.perf_counter()
    summary = EXTRACT.run(config)
    print(f"extracted {summary['tokens']} tokens in {time.perf_counter() - started:.0f} s")


def train_variant(base: RunConfig, name: str, pieces, **train) -> tuple[Path, float | None, float]:
    """Train one variant in its own run dir sharing the data; returns (export dir, tokens/s, seconds)."""
    config = base.model_copy(update={"name": name, "train": base.train.model_copy(update=train)})
    for sub in ("merged", "hidden_states"):
        link = config.run_dir / sub
        if not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to((base.run_dir / sub).resolve())
    shutil.rmtree(config.run_dir / "draft", ignore_errors=True)
    started = time.perf_counter()
    if train.get("max_steps") == 0:
        source = OfflineSource(config.run_dir, "train")
        draft = build_draft(config, pieces, prepare_vocab(config, source.rows, pieces.config.vocab_size, 0))
        export_draft(
            draft.state_dict(),
            draft.cfg,
            source.meta["aux_layer_ids"],
            ExportTarget.from_meta(source.meta),
            config.run_dir / "draft" / "export",
            dtype="float32",
        )
        return config.run_dir / "draft" / "export", None, 0.0
    summary = train_stage(config, pieces)
    from tasks.draft.stage import export_stage

    export_stage(config)
    return config.run_dir / "draft" / "export", summary["tokens_per_s"], time.perf_counter() - started


def measure_tau(target, export_dir: Path, prompts, greedy, k: int, max_new: int, stops: set[int]) -> dict:
    from tasks.draft.export import read_export_config

    draft = load_export(export_dir, target.get_input_embeddings().weight.detach())
    _, layer_ids = read_export_config(export_dir)
    results = [speculative_decode(target, draft, p["prompt_ids"], layer_ids, k, max_new, stops) for p in prompts]
    rounds = sum(r.target_forwards for r in results)
    return {
        "tau": sum(sum(r.accepted) + len(r.accepted) for r in results) / max(1, rounds),
        "per_position": acceptance_by_position(results),
        "identical": sum(r.tokens == g for r, g in zip(results, greedy, strict=True)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1/3 of the steps, 4 prompts of 24 tokens")
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--rows", type=int, default=100, help="training rows")
    parser.add_argument("--max-tokens", type=int, default=320, help="tokens per row")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    demo = load_config(args.config)
    base = demo.model_copy(update={"name": "bench-train", "runs_dir": Path("runs")})
    steps = max(10, demo.train.max_steps // 3) if args.quick else demo.train.max_steps
    base = base.model_copy(update={"train": demo.train.model_copy(update={"max_steps": steps})})
    prompts_n, max_new = (4, 24) if args.quick else (demo.evaluate.num_prompts, demo.evaluate.max_new_tokens)
    k = demo.evaluate.num_draft_tokens
    prepare_data(base, args.rows, max(prompts_n, 8), args.max_tokens)

    target = load_model(base.target, dtype="float32")
    pieces = pieces_from_model(target, keep_model=False)
    variants = {
        "untrained": train_variant(base, "bench-untrained", pieces, max_steps=0),
        "no TTT (1 step)": train_variant(base, "bench-no-ttt", pieces, ttt_steps=1),
        f"trained (TTT {base.train.ttt_steps})": train_variant(base, "bench-trained", pieces),
    }
    prompts, _ = held_out_prompts(base)
    prompts = prompts[:prompts_n]
    stops = stop_ids(base)
    greedy = [greedy_decode(target, p["prompt_ids"], max_new, stops) for p in prompts]
    drafts = []
    for name, (export_dir, tps, seconds) in variants.items():
        scored = measure_tau(target, export_dir, prompts, greedy, k, max_new, stops)
        drafts.append({"draft": name, "train_tokens_per_s": tps, "train_s": seconds} | scored)
    raw = {"prompts": len(prompts), "max_new_tokens": max_new, "k": k, "steps": steps}
    raw |= {"batch_tokens": base.train.batch_tokens, "draft_vocab_size": base.train.draft_vocab_size, "drafts": drafts}
    save("train", [train_table(raw)], raw=raw)


def train_table(raw: dict) -> Table:
    """Each draft's training speed and τ, against the untrained draft's τ."""
    k, prompts = raw["k"], raw["prompts"]
    title = (
        f"{prompts} held-out prompts x {raw['max_new_tokens']} new tokens, {k} draft tokens per target forward, "
        f"{raw['steps']} steps of {raw['batch_tokens']} tokens, draft vocab {raw['draft_vocab_size']}"
    )
    columns = ["draft", "train tokens/s", "train s", "τ", "τ vs untrained", f"acceptance 1..{k}", "identical to greedy"]
    table = Table(title, columns)
    baseline = raw["drafts"][0]["tau"]
    for d in raw["drafts"]:
        accept = " ".join(f"{a:.2f}" for a in d["per_position"])
        identical = f"{d['identical']}/{prompts}"
        table.add(d["draft"], d["train_tokens_per_s"], d["train_s"], d["tau"], d["tau"] / baseline, accept, identical)
    return table


if __name__ == "__main__":
    main()
