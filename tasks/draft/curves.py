"""Loss and accuracy curves of a training run, one PNG."""

from __future__ import annotations

import re
from pathlib import Path

from tasks.storage import atomic_path


def unrolled_steps(record: dict) -> int:
    """The number of unrolled steps a metrics record reports (`acc_0`, `acc_1`, ...)."""
    return sum(1 for key in record if re.fullmatch(r"acc_\d+", key))


def plot_curves(records: list[dict], path: Path) -> Path:
    """Total and per-step loss (left), per-step accuracy (right), against the optimizer step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in records]
    k = unrolled_steps(records[0]) if records else 0
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    ax_loss.plot(steps, [r["loss"] for r in records], color="black", label="weighted total")
    for i in range(k):
        ax_loss.plot(steps, [r[f"loss_{i}"] for r in records], alpha=0.6, label=f"step {i}")
        ax_acc.plot(steps, [r[f"acc_{i}"] for r in records], alpha=0.8, label=f"step {i}")
    ax_loss.set(xlabel="optimizer step", ylabel="soft cross-entropy (nats)", title="training-time test loss")
    ax_acc.set(xlabel="optimizer step", ylabel="top-1 agreement with target", title="accuracy per unrolled step", ylim=(0, 1))
    ax_loss.legend(fontsize=7)
    ax_acc.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(Path(path)) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return Path(path)
