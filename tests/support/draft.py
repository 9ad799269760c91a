"""A tiny EAGLE-3 draft (12-token vocabulary, 6 in the draft's) for tests of the model, training step and export."""

import numpy as np
import torch

from tasks.draft.model import DraftConfig, Eagle3Draft
from tasks.draft.vocab import build_draft_vocab


def tiny_config(**overrides) -> DraftConfig:
    values = dict(
        hidden_size=8,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=4,
        intermediate_size=16,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=64,
        target_hidden_size=8,
        vocab_size=12,
        draft_vocab_size=6,
    )
    values.update(overrides)
    return DraftConfig(**values)


def tiny_draft(seed: int = 0) -> tuple[Eagle3Draft, torch.Tensor]:
    torch.manual_seed(seed)
    cfg = tiny_config()
    vocab = build_draft_vocab(np.array([0, 5, 9, 1, 0, 7, 3, 0, 8, 2, 0, 6]), cfg.draft_vocab_size)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size)
    draft = Eagle3Draft(cfg, embed, vocab.d2t, vocab.t2d)
    for p in draft.parameters():  # norms away from 1 so that they matter in the comparison
        if p.requires_grad:
            p.data.add_(0.05 * torch.randn_like(p))
    return draft, vocab.draft_to_target
