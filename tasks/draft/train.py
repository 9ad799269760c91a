"""The draft training loop: offline or online rows, the training-time test, AdamW + cosine, exact resume.

Runs in-process (one rank) or under `torchrun` (DDP, each rank reading its slice of every global
batch): `torchrun --nproc-per-node 2 -m tasks.draft.train runs/demo/draft/launch-config.json`.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import get_cosine_schedule_with_warmup

from tasks.completions import COMPLETIONS
from tasks.config import RunConfig
from tasks.draft.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from tasks.draft.data import OfflineSource, OnlineSource, collate, merged_rows, rank_slice, read_meta, schedule
from tasks.draft.model import DraftConfig, Eagle3Draft
from tasks.draft.states import STREAMED, StreamSource, plan_hidden_states
from tasks.draft.ttt import simulated_tau, target_in_vocab, unroll, window_tau_sim
from tasks.draft.vocab import build_draft_vocab, count_trained_tokens, load_vocab, save_vocab
from tasks.extract.backend import default_aux_layer_ids
from tasks.failpoints import failpoint
from tasks.progress_log import ProgressLog
from tasks.stages import stage_dir
from tasks.storage import atomic_path
from tasks.target_model.checkpoint import text_weights
from tasks.target_model.loader import model_dir, model_placement, resolve_dtype, shared_model

log = logging.getLogger(__name__)


@dataclass
class TargetPieces:
    """What training takes from the target: its config, frozen embedding and lm_head, and (online) the model."""

    config: object
    embed: torch.Tensor  # (V, H_t)
    lm_head: torch.Tensor  # (V, H_t)
    model: object | None = None


def load_target_pieces(config: RunConfig, keep_model: bool) -> TargetPieces:
    """Online, the target runs in the compute dtype (as extract does); offline only its embedding and lm_head are
    needed, read by name from its checkpoint (a wrapper transformers cannot build, such as Kimi-K2.5, included).
    The embedding and lm_head are fp32 either way."""
    if not keep_model:
        weights = text_weights(model_dir(config.target))
        return TargetPieces(weights.config, weights.embed, weights.lm_head)
    return pieces_from_model(shared_model(config.target, *model_placement(config.compute)), keep_model)


def pieces_from_model(model, keep_model: bool) -> TargetPieces:
    embed = model.get_input_embeddings().weight.detach().float()
    lm_head = model.get_output_embeddings().weight.detach().float()
    return TargetPieces(model.config, embed, lm_head, model if keep_model else None)


def aux_layer_ids(config: RunConfig, num_layers: int, mode: str) -> list[int]:
    if mode == "offline":
        return list(read_meta(config.run_dir)["aux_layer_ids"])
    return list(config.extract.aux_layer_ids or default_aux_layer_ids(num_layers))


def open_source(config: RunConfig, mode: str, pieces: TargetPieces, layer_ids: list[int]):
    """The training split's rows and where their states come from."""
    if mode == "offline":
        return OfflineSource(config.run_dir, "train")
    if mode == "online":
        return OnlineSource(config.run_dir, pieces.model, layer_ids, "train")
    return StreamSource(config, merged_rows(config.run_dir, "train"), cache=mode == "cache")


def prepare_vocab(config: RunConfig, rows, vocab_size: int, rank: int):
    """Build the draft vocab once (rank 0 writes it); later runs and other ranks reuse the same choice."""
    path = stage_dir(config, "train") / "vocab.safetensors"
    if path.exists():
        return load_vocab(path)
    counts = count_trained_tokens([(r.input_ids, r.loss_mask) for r in rows], vocab_size)
    vocab = build_draft_vocab(counts, config.train.draft_vocab_size)
    if rank == 0:
        save_vocab(vocab, path)
    return vocab


def build_draft(config: RunConfig, pieces: TargetPieces, vocab) -> Eagle3Draft:
    """A fresh draft seeded by `compute.seed`; lm_head starts from the target's rows of the draft vocab."""
    cfg = DraftConfig.from_target(pieces.config, vocab.size, config.train.draft_overrides, config.train.draft.model_dump())
    return fresh_draft(config, cfg, pieces.embed, pieces.lm_head, vocab.d2t, vocab.t2d)


def fresh_draft(config: RunConfig, cfg: DraftConfig, embed, lm_head, d2t, t2d) -> Eagle3Draft:
    """The draft as training starts it (the untrained baseline evaluate compares with is built the same way)."""
    torch.manual_seed(config.compute.seed)
    draft = Eagle3Draft(cfg, embed, d2t, t2d)
    if config.train.init_lm_head_from_target:
        with torch.no_grad():
            draft.lm_head.weight.copy_(lm_head[torch.arange(len(d2t), device=d2t.device) + d2t])
    return draft


def untrained_draft(config: RunConfig, draft: Eagle3Draft, embed, lm_head) -> Eagle3Draft:
    """`draft` as training started it: same shape, vocabulary and seed, no training (evaluate's baseline)."""
    return fresh_draft(config, draft.cfg, embed, lm_head, draft.d2t, draft.t2d).to(embed.device).eval()


# Settings that may change between resumes without invalidating the checkpoints.
RESUMABLE_FIELDS = {
    "max_steps",
    "disk_budget_gb",
    "prefetch_batches",
    "engine_restarts",
    "checkpoint_every",
    "keep_checkpoints",
    "processes",
    "threads_per_rank",
    "export_dtype",
    "export_engine",
}


def data_fingerprint(config: RunConfig, mode: str) -> str:
    """Names and sizes of the files training reads; a re-extracted or re-merged input changes it."""
    folder = config.run_dir / ("hidden_states" if mode == "offline" else "merged/train")
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and not p.name.startswith((".", "_")) and COMPLETIONS not in p.relative_to(folder).parts
    )  # completion markers are bookkeeping (they hold timings), not data training reads
    listing = "\n".join(f"{p.relative_to(folder)}:{p.stat().st_size}" for p in files)
    return hashlib.sha256(listing.encode()).hexdigest()


def reset_if_changed(config: RunConfig, mode: str) -> None:
    """Start over when the training setup differs from the one that wrote `draft/` (else resume)."""
    out = stage_dir(config, "train")
    key = {k: v for k, v in config.train.model_dump(mode="json").items() if k not in RESUMABLE_FIELDS}
    key["target"] = config.target.model_dump(mode="json")
    key["seed"] = config.compute.seed
    key["data"] = data_fingerprint(config, mode)
    key["hidden_states"] = mode  # as resolved (auto's choice)
    key["storage_dtype"] = config.extract.storage_dtype if mode in ("offline", "cache") else None
    path = out / "train-key.json"
    if path.exists() and json.loads(path.read_text(encoding="utf-8")) == key:
        return
    for stale in ("checkpoints", "export"):
        shutil.rmtree(out / stale, ignore_errors=True)
    for stale in ("vocab.safetensors", "metrics.jsonl", "curves.png"):
        (out / stale).unlink(missing_ok=True)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(key, sort_keys=True), encoding="utf-8")


def write_metrics(path: Path, records: list[dict]) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def train_draft(
    config: RunConfig,
    pieces: TargetPieces | None = None,
    rank: int = 0,
    world: int = 1,
    until_step: int | None = None,
) -> dict:
    """Train (or resume) to `train.max_steps`, or stop after `until_step`; returns a small summary."""
    plan = plan_hidden_states(config)
    if rank == 0:
        log.info(plan.line())
        reset_if_changed(config, plan.mode)
    if world > 1:
        dist.barrier()
    if plan.mode in STREAMED and world > 1:
        raise ValueError(f"train.hidden_states: {plan.mode} (auto's choice too) trains in one process; set train.processes: 1")
    pieces = pieces or load_target_pieces(config, keep_model=plan.mode == "online")
    layer_ids = aux_layer_ids(config, pieces.config.num_hidden_layers, plan.mode)
    with contextlib.closing(open_source(config, plan.mode, pieces, layer_ids)) as source:
        summary = _train(config, pieces, source, layer_ids, rank, world, until_step)
    return summary | {"hidden_states": plan.mode} | (source.report() if plan.mode in STREAMED else {})


def _train(config: RunConfig, pieces: TargetPieces, source, layer_ids, rank: int, world: int, until_step) -> dict:
    tc = config.train
    out = stage_dir(config, "train")
    device = _device(config.compute.device, rank)
    if not source.rows:
        raise ValueError(f"train: no training rows under {config.run_dir} ({type(source).__name__})")
    vocab = prepare_vocab(config, source.rows, pieces.config.vocab_size, rank)
    draft = build_draft(config, pieces, vocab).to(device)
    lm_head_full = pieces.lm_head.to(device)
    draft_lm_head = lm_head_full[vocab.draft_to_target.to(device)]  # (N, H_t)

    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=tc.lr, betas=tc.adam_betas, weight_decay=0.0)
    scheduler = get_cosine_schedule_with_warmup(optimizer, tc.warmup_steps, tc.max_steps)
    step, epoch, position = 0, 0, 0
    checkpoint = latest_checkpoint(out / "checkpoints")
    if checkpoint is not None:
        state = load_checkpoint(checkpoint, draft, optimizer, scheduler)
        step, epoch, position = state["step"], state["epoch"], state["position"]
    model = draft
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(draft)
    metrics_path = out / "metrics.jsonl"
    records = [r for r in read_metrics(metrics_path) if r["step"] <= step] if rank == 0 else []
    lengths = [len(r.input_ids) for r in source.rows]
    in_vocab_cache: dict[int, torch.Tensor] = {}
    stop = min(tc.max_steps, until_step or tc.max_steps)
    bf16 = resolve_dtype(tc.dtype, device.type) == "bfloat16"
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)
    # The full-vocab argmax (is the target's choice draftable?) is 57 MFLOP per token at SmolLM2's size: in bf16 with
    # the bf16 matmuls, 1.7x faster than fp32 on an AVX512-BF16 CPU; the stored final states are bf16 already.
    in_vocab_head = lm_head_full.to(torch.bfloat16) if bf16 else lm_head_full
    # tokens_seen counts this process (for tokens/s); the metrics keep counting across resumes.
    started, tokens_seen = time.perf_counter(), 0
    tokens_before = records[-1]["tokens"] if records else 0

    def note() -> str:
        last = records[-1] if records else None
        pace = f"{tokens_seen / (time.perf_counter() - started):.0f} tokens/s"
        if not last:
            return pace
        tau = window_tau_sim(records)
        return f"loss {last['loss']:.3f}, acc_0 {last['acc_0']:.3f}, τ_sim {tau or 1.0:.3f}, {pace}"

    def upcoming():
        return schedule(lengths, tc.batch_tokens * world, config.compute.seed, epoch, position)

    if isinstance(source, StreamSource):
        source.start(rank_slice(rows, rank, world)[0] for _, _, rows in itertools.islice(upcoming(), stop - step))
    batches = upcoming()
    with ProgressLog("train", stop - step, "steps", note=note) if rank == 0 else contextlib.nullcontext() as progress:
        while step < stop:
            epoch, position, global_rows = next(batches)
            mine, idle = rank_slice(global_rows, rank, world)
            batch = collate([source.rows[i] for i in mine], source.features(mine))
            if idle:
                batch["loss_mask"].zero_()
            batch = {k: v.to(device) for k, v in batch.items()}
            batch["in_vocab"] = _in_vocab(mine, lengths, batch, in_vocab_cache, in_vocab_head, draft.t2d)
            with autocast:
                scores = unroll(model, batch, draft_lm_head, tc.ttt_steps, tc.ttt_feed, tc.loss, tc.lk_eta)
            totals = torch.stack([torch.stack([s.count, s.correct, s.loss_sum.detach(), s.trained, s.chained]) for s in scores])
            if world > 1:
                dist.all_reduce(totals)
            # Each step's loss is a mean over the global batch; DDP averages gradients, hence the * world.
            loss = sum(tc.ttt_decay**i * s.loss_sum / totals[i, 0].clamp(min=1) for i, s in enumerate(scores)) * world
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, tc.grad_clip)
            optimizer.step()
            scheduler.step()
            step, position = step + 1, position + 1
            tokens_seen += sum(lengths[i] for i in global_rows)
            if rank == 0:
                records.append(_record(step, totals, tc.ttt_decay, scheduler, grad_norm, tokens_before + tokens_seen, started))
                progress.advance()
            if step % tc.checkpoint_every == 0 or step == stop:
                if rank == 0:
                    save_checkpoint(
                        out / "checkpoints",
                        draft,
                        optimizer,
                        scheduler,
                        {
                            "step": step,
                            "epoch": epoch,
                            "position": position,
                            "draft_config": draft.cfg.to_dict(),
                            "aux_layer_ids": layer_ids,
                        },
                        keep=tc.keep_checkpoints,
                    )
                    write_metrics(metrics_path, records)
                    failpoint("train.checkpoint")
                if world > 1:
                    dist.barrier()
    elapsed = time.perf_counter() - started
    if rank == 0:
        write_metrics(metrics_path, records)
    return {
        "step": step,
        "tokens_per_s": tokens_seen / elapsed if elapsed > 0 and tokens_seen else None,
        "draft_vocab_size": vocab.size,
        "vocab_coverage": vocab.coverage(),
        "aux_layer_ids": layer_ids,
    }


def _device(name: str, rank: int) -> torch.device:
    from tasks.target_model.loader import pick_device

    picked = pick_device(name)
    return torch.device(f"cuda:{rank}" if picked == "cuda" else picked)


def _in_vocab(rows, lengths, batch, cache: dict, lm_head: torch.Tensor, t2d: torch.Tensor) -> torch.Tensor:
    """(B, T) bool, the target argmax is draftable; the full-vocab argmax is computed once per row."""
    out = torch.zeros(batch["input_ids"].shape, dtype=torch.bool, device=lm_head.device)
    for b, i in enumerate(rows):
        if i not in cache:
            cache[i] = target_in_vocab(batch["final"][b, : lengths[i]], lm_head, t2d)
        out[b, : lengths[i]] = cache[i]
    return out


def _record(step, totals, decay, scheduler, grad_norm, tokens_seen, started) -> dict:
    counts, correct, sums, trained = totals[:, 0].clamp(min=1), totals[:, 1], totals[:, 2], totals[:, 3].clamp(min=1)
    losses = (sums / counts).tolist()
    record = {"step": step, "loss": sum(decay**i * v for i, v in enumerate(losses))}
    record["tau_sim"] = simulated_tau(totals[:, 4].tolist(), float(totals[0, 3]))  # (k, 5): counts, ..., chained
    record.update({f"loss_{i}": v for i, v in enumerate(losses)})
    record.update({f"acc_{i}": v for i, v in enumerate((correct / counts).tolist())})  # over draftable targets
    record.update({f"acc_{i}_all": v for i, v in enumerate((correct / trained).tolist())})  # out-of-vocab as misses
    record.update(
        {
            "positions": int(totals[0, 0]),
            "lr": scheduler.get_last_lr()[0],
            "grad_norm": float(grad_norm),
            "tokens": tokens_seen,
            "elapsed_s": time.perf_counter() - started,
        }
    )
    return record


def main(argv: list[str]) -> None:
    """torchrun entry: one RunConfig JSON path; rank and world size come from the environment."""
    config = RunConfig.model_validate_json(Path(argv[0]).read_text(encoding="utf-8"))
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    torch.set_num_threads(max(1, config.train.threads_per_rank))
    random.seed(config.compute.seed)
    if world > 1:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    try:
        summary = train_draft(config, rank=rank, world=world)
        if rank == 0:
            with atomic_path(stage_dir(config, "train") / "launch-summary.json") as tmp:
                tmp.write_text(json.dumps(summary), encoding="utf-8")
    finally:
        if world > 1:
            dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
