"""Hidden states from disk or from the engine: the same draft trained four ways on the same rows, side by side.

    .venv/bin/python bench/stream.py                       # 200k trained tokens: two epochs over 100k
    .venv/bin/python bench/stream.py --set-tokens 50000    # a shorter run

Every arm trains the demo target's draft on the same merged rows (ShareGPT replies rebuilt into a pool, as
bench/quality.py builds it), in the same order, for the same steps, on the states of one engine (vLLM's CPU build,
eager, in the demo's compute dtype):
- offline: extract (`extract.backend: vllm`) into bf16 shards, then train from them;
- stream: `train.hidden_states: stream`, each batch's states asked of the server while the one before trains, every
  file deleted once read;
- cache: `train.hidden_states: cache` with a disk budget of half the set's bf16 states: later epochs ask only for
  what the cache did not keep;
- offline-fp8: offline with `extract.storage_dtype: float8_e4m3fn`.
Each arm's export decodes the same held-out prompts at k draft tokens (τ with its bootstrap σ, and its gap to
offline's, paired over the prompts). The table adds training tokens/s, wall time including extraction and server
starts, the peak disk the hidden states took (the run's state folders sampled every 0.2 s) and the engine's busy
share (seconds with a request in flight over the arm's wall time). Results: bench/results/stream.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tasks  # noqa: E402,F401  (offline defaults)
from bench.publish import Table, save  # noqa: E402
from bench.quality import batches_per_epoch, build_pool, held_out_sources, paired_gap, rows_for, tau_sigma  # noqa: E402
from tasks.config import RunConfig, load_config  # noqa: E402
from tasks.stages import stage_dir  # noqa: E402

ARMS = {
    "offline": ({"hidden_states": "offline"}, "bfloat16"),
    "stream": ({"hidden_states": "stream"}, "bfloat16"),
    "cache": ({"hidden_states": "cache"}, "bfloat16"),
    "offline-fp8": ({"hidden_states": "offline"}, "float8_e4m3fn"),
}


class DiskSampler:
    """The bytes under some folders, sampled every `every` seconds on a thread; `peak` is the largest sample."""

    def __init__(self, folders: list[Path], every: float = 0.2):
        self.folders, self.every, self.peak = folders, every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _size(self) -> int:
        total = 0
        for folder in self.folders:
            for root, _, files in os.walk(folder):
                for name in files:
                    try:
                        total += os.stat(os.path.join(root, name)).st_size
                    except FileNotFoundError:  # deleted while walking
                        pass
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, self._size())

    def __enter__(self) -> DiskSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._size())


def arm_config(base: RunConfig, work: Path, arm: str, steps: int, budget_gb: float) -> RunConfig:
    train, storage = ARMS[arm]
    settings = base.model_dump(mode="json")
    settings["name"] = arm
    settings["runs_dir"] = str(work)
    settings["train"] |= train | {"max_steps": steps, "disk_budget_gb": budget_gb, "checkpoint_every": 1000}
    settings["extract"] |= {"backend": "vllm", "storage_dtype": storage}
    return RunConfig.model_validate(settings)


def run_arm(config: RunConfig, merged: Path, target, k: int) -> dict:
    """Extract (offline arms) and train, sampling the states' disk; then decode the held-out prompts."""
    from tasks.draft.stage import run_train
    from tasks.draft.train import pieces_from_model
    from tasks.evaluate.stage import evaluate_draft
    from tasks.extract.stage import EXTRACT

    shutil.rmtree(config.run_dir, ignore_errors=True)  # every arm from scratch: no shard, cache or checkpoint kept
    link = stage_dir(config, "merge")
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.symlink_to(merged, target_is_directory=True)
    folders = [stage_dir(config, "extract"), stage_dir(config, "train") / "stream", stage_dir(config, "train") / "states-cache"]
    started = time.perf_counter()
    with DiskSampler(folders) as disk:
        extract_s, extracted = 0.0, None
        if config.train.hidden_states == "offline":
            extracted = EXTRACT.run(config)["tokens"]
            extract_s = time.perf_counter() - started
        trained = run_train(config, pieces_from_model(target, False))
    wall = time.perf_counter() - started
    decoded = evaluate_draft(config, target, out=stage_dir(config, "evaluate"))
    busy = trained.get("engine_busy_s", extract_s)  # offline: the engine works only while extracting
    return {
        "arm": config.name,
        "steps": trained["step"],
        "tau": decoded["acceptance_length"],
        "sigma": tau_sigma(Path(decoded["results"])),
        "results": decoded["results"],
        "train_tokens_per_s": trained["tokens_per_s"],
        "extract_s": round(extract_s, 1),
        "wall_s": round(wall, 1),
        "peak_disk_bytes": disk.peak,
        "engine_busy_share": busy / wall,
        "asked_tokens": trained.get("asked_tokens", extracted),  # offline: every merged token, once
        "per_position": decoded["per_position_acceptance"],
        "k": k,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--set-tokens", type=int, default=100_000, help="target tokens in the merged train rows")
    parser.add_argument("--epochs", type=int, default=2, help="epochs over them (trained tokens = set × epochs)")
    parser.add_argument("--cache-share", type=float, default=0.5, help="cache budget, as a share of the set's bf16 states")
    parser.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=list(ARMS))
    parser.add_argument("--prompts", type=int, default=14, help="held-out prompts decoded")
    parser.add_argument("--k", type=int, default=4, help="draft tokens per target forward")
    args = parser.parse_args()
    if not os.environ.get("DRAFTSMITH_VLLM_PYTHON"):
        raise SystemExit("set DRAFTSMITH_VLLM_PYTHON to a Python with vLLM (`make test-vllm` sets up .venv-vllm)")
    from tasks.merge.stage import run_merge
    from tasks.target_model.loader import load_model

    demo = load_config(args.config)
    work = Path("runs/bench-stream").resolve()
    pool = build_pool(demo, work, min(3_600, args.set_tokens // 150), 8, guided=False)
    rows, _ = rows_for(pool, args.set_tokens)
    train_rows = {"name": "train", "path": str(stage_dir(pool, "reconstruct")), "split": "train", "max_rows": rows}
    evaluate = {"num_prompts": args.prompts, "max_new_tokens": 64, "num_draft_tokens": args.k}
    evaluate |= {"min_tau_gain": None, "min_acceptance_length": 0.0, "min_first_acceptance": 0.0}
    base = RunConfig.model_validate(
        demo.model_dump(mode="json")
        | {
            "name": "merged",
            "runs_dir": str(work),
            "merge": demo.merge.model_dump(mode="json")
            | {"sources": [train_rows | {"drop_truncated": False}, *held_out_sources(pool)]},
            "train": demo.train.model_dump(mode="json") | {"dtype": "auto", "adam_betas": [0.9, 0.999], "warmup_steps": 10},
            "evaluate": demo.evaluate.model_dump(mode="json") | evaluate,
            "vllm": demo.vllm.model_dump(mode="json") | {"args": ["--enforce-eager"]},
        }
    )
    run_merge(base)
    merged = stage_dir(base, "merge")
    manifest = json.loads((merged / "manifest.json").read_text())
    set_tokens = manifest["counts"]["train"]["train_tokens"]
    steps = args.epochs * batches_per_epoch(merged, demo)
    budget_gb = args.cache_share * set_tokens * 8 * 576 / 1e9
    target = load_model(demo.target, dtype="float32")
    results = []
    for arm in args.arms:
        config = arm_config(base, work, arm, steps, budget_gb if arm == "cache" else 50.0)
        results.append(run_arm(config, merged, target, args.k))
        print(json.dumps(results[-1]), flush=True)
    reference = next((r for r in results if r["arm"] == "offline"), None)
    table = Table(
        f"{set_tokens:,} merged tokens × {args.epochs} epochs, {steps} steps; τ at k = {args.k}, {args.prompts} held-out prompts",
        [
            "hidden states",
            "τ",
            "± σ",
            "gap to offline, paired",
            "± σ (paired)",
            "train tokens/s",
            "wall s (with extraction)",
            "peak state disk, MB",
            "engine busy share",
            "tokens asked of the engine",
        ],
    )
    for r in results:
        gap = paired_gap(Path(r["results"]), Path(reference["results"])) if reference and r is not reference else (None, None)
        r["gap"], r["gap_sigma"] = gap
        table.add(
            r["arm"],
            r["tau"],
            r["sigma"],
            gap[0],
            gap[1],
            r["train_tokens_per_s"],
            r["wall_s"],
            r["peak_disk_bytes"] / 1e6,
            r["engine_busy_share"],
            r["asked_tokens"],
        )
    notes = (
        f"cache budget: {args.cache_share:g} of the set's bf16 states ({budget_gb * 1e3:.0f} MB); vLLM CPU build, eager; "
        "offline arms' engine share is their extraction's wall time, and they ask the engine once for every merged "
        "token (train and eval splits)."
    )
    save("stream", [table], raw=results, notes=notes)


if __name__ == "__main__":
    main()
