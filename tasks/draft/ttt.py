"""The training-time test: unroll the draft k steps on its own outputs and score each step.

Step i at position t drafts the token at t+2+i: its input is the previous step's hidden state and
token (step 0: fc(aux[t]) and x[t+1]); its target is the target's distribution at position t+1+i,
restricted to the draft vocab. Positions whose target argmax is outside the draft vocab, or whose
predicted token is not trained (loss_mask 0), are masked. Accuracy is counted both over the positions
trained on and over every position whose token is trained, out-of-vocabulary ones as misses
(SpecForge's denominator, what acceptance sees), and chained across steps for τ_sim (an estimate of the
acceptance length while training). A P-EAGLE draft unrolls the same way from its mask inputs (model.py).

Each position's loss (`train.loss`) compares p, the target's distribution renormalised on the draft vocabulary,
with q, the draft's: soft cross-entropy, or one that aims at acceptance: α = Σ min(p, q) is the chance a token
sampled from q is accepted against p (1 − TV(p, q)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class StepScores:
    """Sums over the local batch for one unrolled step; divide by a (global) count for means."""

    loss_sum: torch.Tensor  # `train.loss` summed over valid positions (carries grad)
    count: torch.Tensor  # valid positions
    correct: torch.Tensor  # valid positions whose draft argmax equals the target argmax
    trained: torch.Tensor  # positions whose token is trained, draftable or not
    chained: torch.Tensor  # positions whose drafted chain is right at every step so far (τ_sim's terms)


def shift_left(x: torch.Tensor, n: int) -> torch.Tensor:
    """x[:, t] <- x[:, t+n], zero-filled at the end. Works on (B, T, ...)."""
    if n == 0:
        return x
    out = torch.zeros_like(x)
    if n < x.shape[1]:
        out[:, : x.shape[1] - n] = x[:, n:]
    return out


@torch.no_grad()
def target_in_vocab(final: torch.Tensor, lm_head: torch.Tensor, t2d: torch.Tensor, chunk: int = 512) -> torch.Tensor:
    """Whether the target's full-vocab argmax is a draft token. final (T, H_t), lm_head (V, H_t) -> (T,) bool.

    The logits are computed in lm_head's dtype (bf16 where the target computes in bf16, as it does serving).
    """
    final = final.to(lm_head.dtype)
    tops = [(final[s : s + chunk] @ lm_head.T).argmax(-1) for s in range(0, final.shape[0], chunk)]
    return t2d[torch.cat(tops)] if tops else torch.zeros(0, dtype=torch.bool, device=final.device)


def position_loss(kind: str, p: torch.Tensor, logits: torch.Tensor, valid: torch.Tensor, eta: float = 3.0) -> torch.Tensor:
    """Each position's loss. p (..., N) the target's distribution, logits (..., N) the draft's, valid (...) 0/1 the
    positions trained on (lk's λ is their mean α). -> (...)

    soft_ce: −Σ p log q. tv: 1 − α. lk: λ·KL(p‖q) + (1 − λ)·(1 − α) with λ = exp(−eta · mean α), held constant (no
    gradient): KL leads while the draft is far from the target, acceptance once it is close.
    """
    log_q = F.log_softmax(logits.float(), dim=-1)
    if kind == "soft_ce":
        return -(p * log_q).sum(-1)
    alpha = torch.minimum(p, log_q.exp()).sum(-1)
    if kind == "tv":
        return 1.0 - alpha
    if kind != "lk":
        raise ValueError(f"train.loss: unknown loss {kind!r}; known: soft_ce, tv, lk")
    kl = (torch.xlogy(p, p) - p * log_q).sum(-1)
    with torch.no_grad():
        lam = torch.exp(-eta * (alpha * valid).sum() / valid.sum().clamp(min=1))
    return lam * kl + (1.0 - lam) * (1.0 - alpha)


def unroll(
    draft: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    draft_lm_head: torch.Tensor,
    steps: int,
    feed: str = "predicted",
    loss: str = "soft_ce",
    eta: float = 3.0,
) -> list[StepScores]:
    """Run the training-time test on a padded batch; `draft` is an `Eagle3Draft`, possibly DDP-wrapped.

    batch: input_ids (B, T), loss_mask (B, T), aux (B, T, 3*H_t), final (B, T, H_t), in_vocab (B, T) bool.
    draft_lm_head: the target's lm_head rows of the draft vocab, (N, H_t).
    feed: "predicted" feeds back the draft's own argmax token; "data" feeds the next data token (a P-EAGLE draft
    reads neither). loss, eta: `position_loss`'s.
    """
    ids, mask = batch["input_ids"], batch["loss_mask"]
    B, T = ids.shape
    with torch.no_grad():
        target_logits = batch["final"] @ draft_lm_head.T  # (B, T, N)
        target_p = torch.softmax(target_logits.float(), dim=-1)
        target_top = target_logits.argmax(-1)  # (B, T) draft ids
        # Logits at p predict token p+1: trained if loss_mask[p+1] and the target's choice is draftable.
        trained = torch.zeros_like(mask)
        trained[:, :-1] = mask[:, 1:]
        base = batch["in_vocab"].float() * trained
    positions = torch.arange(T, device=ids.device).expand(B, T)
    fed = [shift_left(ids, 2 + i) for i in range(steps - 1)] if feed == "data" else None
    step_logits = draft(batch["aux"], shift_left(ids, 1), positions, steps, fed)  # step 0 reads x[t+1]
    scores = []
    chain = torch.ones_like(base)  # (B, T): every step so far drafted its token right (an undraftable one breaks it)
    for i, logits in enumerate(step_logits):  # (B, T, N)
        valid = shift_left(base, 1 + i)  # (B, T)
        p = shift_left(target_p, 1 + i)  # (B, T, N)
        per = position_loss(loss, p, logits, valid, eta)  # (B, T)
        hit = (logits.argmax(-1) == shift_left(target_top, 1 + i)).float()
        every = shift_left(trained, 1 + i).sum()
        chain = chain * hit.detach() * valid
        scores.append(StepScores((per * valid).sum(), valid.sum().detach(), (hit * valid).sum().detach(), every, chain.sum()))
    return scores


def simulated_tau(chained: list[float], trained: float) -> float:
    """τ_sim = 1 + Σ_k (share of trained positions whose drafted chain is right through step k): the acceptance
    length greedy chain drafting would reach on these positions, each step reading the data token before it."""
    return 1.0 + sum(chained) / max(trained, 1.0)


def window_tau_sim(records: list[dict]) -> float | None:
    """τ_sim over the last tenth of the training steps' records (in a first epoch, rows not yet trained on)."""
    window = [r["tau_sim"] for r in records[-max(1, len(records) // 10) :] if "tau_sim" in r]
    return sum(window) / len(window) if window else None
