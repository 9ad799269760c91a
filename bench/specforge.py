"""draftsmith vs SpecForge 0.2.0: EAGLE-3 draft training on the same hidden states, tokens/s and τ, one table.

    make bench-specforge                      # installs SpecForge once, then the demo budget (50 steps, 100 rows)
    make bench-specforge ARGS="--steps 3 --rows 8 --max-tokens 128 --prompts 2 --max-new 16"   # a smoke run

Install (what `make bench-specforge` does, once): SpecForge goes into a folder of its own and is put first on
sys.path; the project venv's torch 2.13.0 (CPU) and transformers 5.24.0 serve it, none of its pinned dependencies
(torch==2.11.0, transformers==5.8.1, sglang==0.5.14, ...) is installed, and none is needed for these pieces:

    .venv/bin/python -m pip install --no-deps --upgrade --target .cache/specforge specforge==0.2.0

Both drafts start from the same weights (draftsmith's fresh draft, exported, then loaded into SpecForge's
`LlamaForCausalLMEagle3` by its own `warm_start_draft_model`), with the same d2t/t2d, rows, batches (draftsmith's
`plan_batches`), steps, TTT length, lr, AdamW betas (0.9, 0.999), warmup + cosine, grad clip, step decay (0.8)
and fp32. SpecForge's side is its own offline EAGLE-3 path: rows through `normalize_offline_sample` and
`DataCollatorWithPadding` into a `TrainBatch`; `TrainerCore(Eagle3TrainStrategy(OnlineEagle3Model(draft,
length=ttt)), FSDPTrainingBackend)` with `BF16Optimizer`, `TargetHead` recomputing the teacher logits from the
stored final states. Its weights are written as draftsmith's export (same config.json and dtype) and both τ come
from draftsmith's loop at temperature 0 on the same held-out prompts. What still differs: the first warmup step's
lr (SpecForge: lr/warmup, draftsmith: 0); SpecForge's loss is a mean over all B*T positions, draftsmith's over the
trained ones; SpecForge masks position t by loss_mask[t], draftsmith by loss_mask[t+2] (the token drafted).
tokens/s counts every token of every batch, both sides. The tables land in bench/results/specforge.json.

What SpecForge 0.2.0 needs on a CPU (paths under specforge/):
- core/loss.py:10 `import triton`: ModuleNotFoundError, the CPU torch wheel has no triton, and
  algorithms/eagle3/model.py:38 imports it. With triton 3.9.0 installed (1 GB) the import works and
  `LogSoftmaxLoss.forward` fails at core/loss.py:185 (`log_softmax_forward_kernel[grid]`): "RuntimeError: 0
  active drivers ([]). There should only be one." Setting: a stand-in `triton` module for the import, and
  OnlineEagle3Model's loss is SpecForge's own reference `_compute_loss` (core/loss.py:16, torch.compile, so
  inductor's C++ backend on CPU: its first calls compile, counted in tokens/s; see "first step s").
- modeling/target/target_head.py:75 `TargetHead.from_pretrained`: "FileNotFoundError: No index.json file found"
  for a one-file model (SmolLM2), which also has no `lm_head.weight` (tied embeddings); line 53 casts the head
  to bf16. Setting: `TargetHead(model_dir)` with `fc.weight` = the target's output embedding, fp32.
- training/backend.py:281 `FSDPTrainingBackend.prepare_model` wraps in FSDP (default SHARD_GRAD_OP), which
  fails on CPU even with a gloo process group: "RuntimeError: FSDP needs a non-CPU accelerator device, but no
  accelerator device is detected." FSDP_SHARDING=NO_SHARD wraps in DDP instead, which runs on gloo. Setting:
  one process, `prepare_model(model, wrap=False)`, no torch.distributed init (what one rank needs).
- algorithms/model_providers.py `build_eagle3_draft`/`build_eagle3_model` take a full `Config` and place the
  model with `get_local_device()` (CPU when no CUDA/NPU: fine) in `cfg.model.torch_dtype`; the bench calls the
  pieces they call (`AutoDraftModel.from_config(..., attention_backend="sdpa", torch_dtype=float32)`,
  `warm_start_draft_model`, `load_embedding`, `freeze_embedding`, `OnlineEagle3Model`). Attention backend
  "sdpa" (flex_attention and fa are GPU kernels; modeling/draft/llama3_eagle.py:33 warns at import that it
  falls back to flex_attention, which the sdpa backend never uses); `torch.cuda.empty_cache()`
  (eagle3/model.py:307) is a no-op without CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPECFORGE_DIR = ROOT / ".cache" / "specforge"
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch  # noqa: E402

import tasks  # noqa: E402,F401  (offline defaults)
from bench.publish import Table, save  # noqa: E402
from bench.train import measure_tau, prepare_data, train_variant  # noqa: E402
from tasks.config import load_config  # noqa: E402
from tasks.draft.data import OfflineSource, plan_batches  # noqa: E402
from tasks.draft.export import export_like  # noqa: E402
from tasks.draft.export import load_export as load_draftsmith_export  # noqa: E402
from tasks.draft.train import pieces_from_model  # noqa: E402
from tasks.draft.ttt import shift_left  # noqa: E402
from tasks.evaluate.speculative import greedy_decode  # noqa: E402
from tasks.evaluate.stage import held_out_prompts, stop_ids  # noqa: E402
from tasks.target_model.loader import load_model, model_dir  # noqa: E402


def import_specforge():
    """SpecForge from .cache/specforge; a stand-in `triton` lets core/loss.py import, its reference loss is used."""
    if not (SPECFORGE_DIR / "specforge").is_dir():
        raise SystemExit(f"SpecForge is not installed: pip install --no-deps --target {SPECFORGE_DIR} specforge==0.2.0")
    sys.path.insert(0, str(SPECFORGE_DIR))
    torch.compile(lambda x: x)  # loads torch's compiler stack before the stand-in: it probes for the real triton

    try:
        import triton  # noqa: F401

        stand_in = {}
    except ModuleNotFoundError:
        language = types.SimpleNamespace(constexpr=int)
        stand_in = {"triton": types.SimpleNamespace(jit=lambda fn: fn, language=language), "triton.language": language}
    sys.modules.update(stand_in)
    try:
        import specforge.algorithms.eagle3.model as eagle3
        from specforge.core.loss import _compute_loss
    finally:
        for name in stand_in:
            del sys.modules[name]

    eagle3.LogSoftmaxLoss = types.SimpleNamespace(apply=_compute_loss)


def specforge_draft(export_dir: Path, target_dir: Path):
    """SpecForge's draft from a draftsmith export, as its build_eagle3_draft does; returns (draft, loading info)."""
    from specforge.modeling.auto import AutoDraftModel, AutoDraftModelConfig
    from specforge.training.model_loading import warm_start_draft_model

    config = AutoDraftModelConfig.from_file(str(export_dir / "config.json"))
    _, info = AutoDraftModel.from_pretrained(str(export_dir), config=config, output_loading_info=True)
    draft = AutoDraftModel.from_config(config, attention_backend="sdpa", torch_dtype=torch.float32)
    warm_start_draft_model(draft, str(export_dir), draft_config=config, strategy="eagle3", allow_missing_embedding=True)
    draft.load_embedding(str(target_dir), embedding_key="model.embed_tokens.weight")
    draft.freeze_embedding()
    return draft.float(), {k: sorted(v) for k, v in info.items()}


def target_head(target, target_dir: Path):
    """SpecForge's TargetHead over the target's (tied) output embedding, fp32."""
    from specforge.modeling.target.target_head import TargetHead

    head = TargetHead(str(target_dir))
    with torch.no_grad():
        head.fc.weight.copy_(target.get_output_embeddings().weight)
    head.freeze_weights()
    return head.eval()


@torch.no_grad()
def logits_gap(sf_draft, ds_draft, source: OfflineSource, steps: int) -> float:
    """Largest |logit difference| of the two implementations over `steps` unrolled steps on one row (data feed)."""
    row, feat = source.rows[0], source.features([0])[0]
    ids = torch.tensor([row.input_ids])
    aux, T = feat["aux"][None], ids.shape[1]
    positions = torch.arange(T)[None]
    ours = ds_draft(aux, shift_left(ids, 1), positions, steps, [shift_left(ids, 2 + i) for i in range(steps - 1)])
    mask = sf_draft.prepare_decoder_attention_mask(torch.ones(1, T, dtype=torch.bool), aux, 1, T, 0)
    hidden, cache, gap = sf_draft.project_hidden_states(aux), [[], []], 0.0
    for i in range(steps):
        embeds = sf_draft.embed_input_ids(shift_left(ids, 1 + i))
        hidden = sf_draft.backbone(embeds, hidden, cache, mask, positions)
        gap = max(gap, float((sf_draft.compute_logits(hidden) - ours[i]).abs().max()))
    return gap


def train_specforge(draft, head, source: OfflineSource, tc, steps: int, seed: int, max_len: int) -> dict:
    """SpecForge's offline EAGLE-3 step over draftsmith's batches: (seconds, tokens) after each step, and its weights."""
    from specforge.algorithms.eagle3.data import build_offline_collator, normalize_offline_sample
    from specforge.algorithms.eagle3.model import OnlineEagle3Model
    from specforge.optimizer import BF16Optimizer
    from specforge.runtime.contracts import TrainBatch
    from specforge.training.backend import FSDPTrainingBackend, ParallelConfig
    from specforge.training.controller import TrainerCore
    from specforge.training.strategies.base import Eagle3TrainStrategy

    model = OnlineEagle3Model(draft, length=tc.ttt_steps, attention_backend="sdpa")
    backend = FSDPTrainingBackend(ParallelConfig.from_distributed(param_dtype=torch.float32))
    backend.prepare_model(model, wrap=False)
    warmup_ratio = (tc.warmup_steps + 0.5) / steps  # int(ratio * steps) == warmup_steps
    optimizer = BF16Optimizer(model, lr=tc.lr, max_grad_norm=tc.grad_clip, total_steps=steps, warmup_ratio=warmup_ratio)
    backend.set_optimizer(optimizer)
    core = TrainerCore(Eagle3TrainStrategy(model, target_head=head, ploss_decay=tc.ttt_decay), backend)
    collate = build_offline_collator()
    lengths = [len(r.input_ids) for r in source.rows]
    step, epoch, tokens, marks = 0, 0, 0, []
    started = time.perf_counter()
    while step < steps:
        for rows in plan_batches(lengths, tc.batch_tokens, seed, epoch):
            if step == steps:
                break
            samples = []
            for i, feat in zip(rows, source.features(rows), strict=True):
                raw = {
                    "input_ids": torch.tensor(source.rows[i].input_ids),
                    "loss_mask": torch.tensor(source.rows[i].loss_mask),
                    "hidden_state": feat["final"][None],
                    "aux_hidden_state": feat["aux"][None],
                }
                samples.append(normalize_offline_sample(raw, max_len))
            batch = TrainBatch([source.rows[i].id for i in rows], "eagle3", collate(samples), {"target_repr": "hidden_state"})
            core.train_step(batch)
            step, tokens = step + 1, tokens + sum(lengths[i] for i in rows)
            marks.append((time.perf_counter() - started, tokens))
        epoch += 1
    state = core.strategy.checkpoint_state_filter(model.state_dict())  # draft weights as SpecForge saves them
    return {"marks": marks, "state": state}


def draftsmith_marks(run_dir: Path) -> list[tuple[float, int]]:
    """(seconds, tokens) after each step of a draftsmith training run, from its metrics."""
    records = [json.loads(line) for line in (run_dir / "draft" / "metrics.jsonl").read_text().splitlines() if line]
    return [(r["elapsed_s"], r["tokens"]) for r in records]


def pace(marks: list[tuple[float, int]]) -> dict:
    """tokens/s over all steps and over steps 2+ (the first holds torch.compile's work), first step seconds."""
    (first_s, first_tokens), (last_s, last_tokens) = marks[0], marks[-1]
    later = (last_tokens - first_tokens) / (last_s - first_s) if len(marks) > 1 else None
    return {"all": last_tokens / last_s, "later": later, "first_s": first_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the config's)")
    parser.add_argument("--rows", type=int, default=100, help="training rows")
    parser.add_argument("--max-tokens", type=int, default=320, help="tokens per row")
    parser.add_argument("--prompts", type=int, default=None, help="held-out prompts (default: the config's)")
    parser.add_argument("--max-new", type=int, default=None, help="new tokens per prompt (default: the config's)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import_specforge()

    demo = load_config(args.config)
    steps = args.steps or demo.train.max_steps
    train = demo.train.model_copy(
        update={
            "max_steps": steps,
            "warmup_steps": min(demo.train.warmup_steps, steps // 2),
            "adam_betas": (0.9, 0.999),  # SpecForge's BF16Optimizer: torch's AdamW defaults
            "dtype": "float32",  # SpecForge's draft here is fp32 too
            "draft": demo.train.draft.model_copy(update={"fc_norm": False, "norm_output": False}),  # its EAGLE-3.0 layer
        }
    )
    name = f"bench-specforge-{args.rows}x{args.max_tokens}"
    base = demo.model_copy(update={"name": name, "runs_dir": Path("runs"), "train": train})
    prompts_n, max_new = args.prompts or demo.evaluate.num_prompts, args.max_new or demo.evaluate.max_new_tokens
    k = demo.evaluate.num_draft_tokens
    prepare_data(base, args.rows, max(prompts_n, 8), args.max_tokens)

    target = load_model(base.target, dtype="float32")
    target_dir = model_dir(base.target)
    pieces = pieces_from_model(target, keep_model=False)
    untrained_dir, _, _ = train_variant(base, f"{name}-untrained", pieces, max_steps=0)
    source = OfflineSource(base.run_dir, "train")

    draft, info = specforge_draft(untrained_dir, target_dir)
    embed = target.get_input_embeddings().weight.detach()
    gap = logits_gap(draft, load_draftsmith_export(untrained_dir, embed), source, train.ttt_steps)
    sf = train_specforge(draft, target_head(target, target_dir), source, train, steps, base.compute.seed, args.max_tokens)
    ds_dir, _, _ = train_variant(base, f"{name}-draftsmith", pieces)
    paces = {"draftsmith": pace(draftsmith_marks(ds_dir.parent.parent)), "SpecForge": pace(sf["marks"])}
    sf_dir = export_like(sf["state"], ds_dir, base.runs_dir / f"{name}-specforge" / "export")

    prompts = held_out_prompts(base)[0][:prompts_n]
    stops = stop_ids(base)
    greedy = [greedy_decode(target, p["prompt_ids"], max_new, stops) for p in prompts]
    taus = {
        label: measure_tau(target, d, prompts, greedy, k, max_new, stops)
        for label, d in (("untrained", untrained_dir), ("draftsmith", ds_dir), ("SpecForge", sf_dir))
    }

    raw = {"loading_info": info, "logit_gap": gap, "rows": len(source.rows), "steps": steps}
    raw |= {"batch_tokens": train.batch_tokens, "ttt_steps": train.ttt_steps, "lr": train.lr}
    raw |= {"draft_vocab_size": train.draft_vocab_size, "prompts": len(prompts), "max_new_tokens": max_new, "k": k}
    raw |= {"pace": paces, "tau": taus}
    save("specforge", specforge_tables(raw), raw=raw)


def specforge_tables(raw: dict) -> list[Table]:
    """The two trainers side by side (tokens/s, τ) with their ratio; and the check that both start from one draft."""
    k, prompts = raw["k"], raw["prompts"]
    title = (
        f"{raw['rows']} rows, {raw['steps']} steps of {raw['batch_tokens']} tokens, TTT {raw['ttt_steps']}, "
        f"lr {raw['lr']}, draft vocab {raw['draft_vocab_size']}; τ on {prompts} held-out prompts x "
        f"{raw['max_new_tokens']} new tokens, k={k}, greedy"
    )
    columns = ["trainer", "train tokens/s", "steps 2+ tokens/s", "first step s", "τ", f"acceptance 1..{k}", "identical"]
    table = Table(title, columns)
    paces, taus = raw["pace"], raw["tau"]
    for label in ("draftsmith", "SpecForge"):
        p, m = paces[label], taus[label]
        accept = " ".join(f"{a:.2f}" for a in m["per_position"])
        table.add(label, p["all"], p["later"], p["first_s"], m["tau"], accept, f"{m['identical']}/{prompts}")
    table.add("untrained", None, None, None, taus["untrained"]["tau"], None, None)
    ds, sf = paces["draftsmith"], paces["SpecForge"]
    later = ds["later"] / sf["later"] if ds["later"] and sf["later"] else None
    ratio = taus["draftsmith"]["tau"] / taus["SpecForge"]["tau"]
    table.add("draftsmith / SpecForge", ds["all"] / sf["all"], later, None, ratio, None, None)
    start = Table("The same start", ["check", "value"])
    start.add("SpecForge's AutoDraftModel.from_pretrained on a draftsmith export", "; ".join(
        f"{key}: {', '.join(map(str, value)) or 'none'}" for key, value in raw["loading_info"].items()
    ))  # fmt: skip
    start.add(f"largest |logit gap| over {raw['ttt_steps']} unrolled steps, same initial weights", raw["logit_gap"])
    return [table, start]


if __name__ == "__main__":
    main()
