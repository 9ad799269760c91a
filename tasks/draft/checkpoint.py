"""Training checkpoints: weights, optimizer, scheduler, RNG and data position, written atomically."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from tasks.storage import atomic_path


def checkpoint_path(directory: Path, step: int) -> Path:
    return Path(directory) / f"step-{step:07d}.pt"


def latest_checkpoint(directory: Path) -> Path | None:
    found = sorted(Path(directory).glob("step-*.pt"))
    return found[-1] if found else None


def save_checkpoint(directory: Path, draft, optimizer, scheduler, position: dict, keep: int) -> Path:
    """Write `step-NNNNNNN.pt`; keep only the newest `keep` checkpoints."""
    state = {
        "model": draft.state_dict(),  # no embedding: it is the target's
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        **position,
    }
    path = checkpoint_path(directory, position["step"])
    with atomic_path(path) as tmp:
        torch.save(state, tmp)
    for old in sorted(Path(directory).glob("step-*.pt"))[:-keep]:
        old.unlink()
    return path


def load_checkpoint(path: Path, draft, optimizer=None, scheduler=None) -> dict:
    """Restore into the given objects; returns the checkpoint's position fields (step, epoch, position, ...)."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    draft.load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None:
        scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"]["torch"])
    random.setstate(state["rng"]["python"])
    return {k: v for k, v in state.items() if k not in ("model", "optimizer", "scheduler", "rng")}
