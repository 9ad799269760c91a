"""Greedy chain speculative decoding with a target and an EAGLE-3 draft, both in transformers.

Each round the draft proposes k tokens in a chain from the target's aux states; one target forward
verifies them and adds its own next token, so a round yields accepted + 1 tokens. Acceptance is
exact-match against the target's greedy choice, so the output equals plain greedy decoding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tasks.draft.model import Eagle3Draft


@dataclass
class DecodeResult:
    tokens: list[int]  # generated ids (prompt excluded)
    accepted: list[int] = field(default_factory=list)  # draft tokens accepted per verifying target forward
    proposed: int = 0  # draft tokens per round

    @property
    def target_forwards(self) -> int:
        return len(self.accepted)

    @property
    def acceptance_length(self) -> float:
        """Tokens per verifying target forward (the prefill's first token is not counted)."""
        return (sum(self.accepted) + len(self.accepted)) / len(self.accepted) if self.accepted else 0.0


def _cut(tokens: list[int], eos_ids: set[int], room: int) -> list[int]:
    """Keep at most `room` tokens and stop after the first end token."""
    out = []
    for t in tokens[:room]:
        out.append(t)
        if t in eos_ids:
            break
    return out


@torch.no_grad()
def greedy_decode(target, prompt_ids: list[int], max_new_tokens: int, eos_ids: set[int]) -> list[int]:
    """Plain greedy decoding, one token per target forward, with the KV cache."""
    device = next(target.parameters()).device
    out = target(input_ids=torch.tensor([prompt_ids], device=device), use_cache=True)
    cache, generated = out.cache, []
    while True:
        token = int(out.logits[0, -1].argmax())
        generated.append(token)
        if token in eos_ids or len(generated) >= max_new_tokens:
            return generated
        out = target(input_ids=torch.tensor([[token]], device=device), cache=cache, use_cache=True)
        cache = out.cache


def _aux(hidden_states, layer_ids: list[int]) -> torch.Tensor:
    """Target hidden states -> the draft's aux input. -> (1, T, 3*H_t)"""
    return torch.cat([hidden_states[i] for i in layer_ids], dim=-1)


@torch.no_grad()
def propose(draft: Eagle3Draft, tokens: torch.Tensor, aux: torch.Tensor, start: int, past, k: int):
    """Draft a chain of k target ids after `tokens`.

    tokens (1, L + 1) all ids so far; aux (1, L, 3*H_t) the target states of the first L positions;
    positions before `start` are already in `past` (step-0 keys/values). Returns (ids, new past).
    A P-EAGLE draft drafts ids 2..k in one more forward: k - 1 masked slots after the last position, attending
    causally to the context and to each other, as vLLM runs them.
    """
    L = aux.shape[1]
    positions = torch.arange(start, L, device=aux.device)[None]  # (1, L - start)
    cache: list = []
    hidden = draft.fuse(aux[:, start:])  # (1, L - start, H)
    hidden, logits = draft.step(tokens[:, start + 1 : L + 1], hidden, positions, cache, past)
    past = cache[0]
    ids = [int(draft.to_target(logits[0, -1].argmax()))]
    if draft.cfg.parallel_drafting and k > 1:
        masked, hidden = draft.masked((1, k - 1))
        slots = torch.arange(L, L + k - 1, device=aux.device)[None]  # (1, k - 1)
        _, logits = draft.step(masked, hidden, slots, [], past)
        return ids + draft.to_target(logits[0].argmax(-1)).tolist(), past
    hidden = hidden[:, -1:]  # later steps draft from the last position only
    for i in range(1, k):
        hidden, logits = draft.step(torch.tensor([[ids[-1]]], device=aux.device), hidden, positions[:, -1:] + i, cache)
        ids.append(int(draft.to_target(logits[0, -1].argmax())))
    return ids, past


@torch.no_grad()
def speculative_decode(
    target,
    draft: Eagle3Draft,
    prompt_ids: list[int],
    layer_ids: list[int],
    num_draft_tokens: int,
    max_new_tokens: int,
    eos_ids: set[int],
) -> DecodeResult:
    """Greedy speculative decoding; `layer_ids` are the HF hidden_states indices the draft was trained on."""
    device = next(target.parameters()).device
    out = target(input_ids=torch.tensor([prompt_ids], device=device), use_cache=True, output_hidden_states=True)
    cache = out.cache
    aux = _aux(out.hidden_states, layer_ids)  # (1, P, 3*H_t)
    seq = list(prompt_ids) + [int(out.logits[0, -1].argmax())]
    result = DecodeResult(tokens=[seq[-1]], proposed=num_draft_tokens)
    past, done = None, 0  # draft step-0 keys cover positions [0, done)
    while result.tokens[-1] not in eos_ids and len(result.tokens) < max_new_tokens:
        tokens = torch.tensor([seq], device=device)
        drafted, past = propose(draft, tokens, aux, done, past, num_draft_tokens)
        done = aux.shape[1]
        verify = torch.tensor([[seq[-1], *drafted]], device=device)  # (1, k + 1)
        out = target(input_ids=verify, cache=cache, use_cache=True, output_hidden_states=True)
        greedy = out.logits[0].argmax(-1).tolist()  # the target's choice after each verified token
        n = 0
        while n < len(drafted) and drafted[n] == greedy[n]:
            n += 1
        new = _cut(drafted[:n] + [greedy[n]], eos_ids, max_new_tokens - len(result.tokens))
        result.accepted.append(len(new) - 1)
        # Keep the target cache and aux states of seq[-1] and the accepted drafts only.
        cache = out.cache
        if n < len(drafted):
            cache.crop(n - len(drafted))  # negative: drop the rejected drafts' entries
        aux = torch.cat([aux, _aux(out.hidden_states, layer_ids)[:, : n + 1].to(aux.dtype)], dim=1)
        seq += new
        result.tokens += new
    return result


def acceptance_by_position(results: list[DecodeResult]) -> list[float]:
    """Share of rounds whose i-th drafted token was accepted (i = 1..k)."""
    k = max((r.proposed for r in results), default=0)
    rounds = [n for r in results for n in r.accepted]
    if not rounds:
        return [0.0] * k
    return [sum(n >= i for n in rounds) / len(rounds) for i in range(1, k + 1)]
