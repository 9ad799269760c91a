"""Draft model, vocabulary, training-time test and export on tiny tensors."""

import json
import math

import numpy as np
import pytest
import torch
from safetensors import safe_open

from tasks.draft.export import ExportTarget, export_draft, load_export, read_export_config
from tasks.draft.model import Eagle3Draft
from tasks.draft.ttt import target_in_vocab, unroll
from tasks.draft.vocab import build_draft_vocab, count_trained_tokens
from tests.support.draft import tiny_config, tiny_draft

torch.set_num_threads(1)


def test_vocab_from_hand_made_frequencies():
    rows = [([3, 3, 3, 7, 7, 1, 9], [0, 1, 1, 1, 1, 1, 0]), ([5, 5, 5, 5, 9, 2], [1, 1, 1, 1, 1, 1])]
    counts = count_trained_tokens(rows, vocab_size=10)
    # Under the mask: 5 x4, 3 x2, 7 x2, 1 x1, 9 x1, 2 x1 (the unmasked 3 and 9 do not count).
    assert counts.tolist() == [0, 1, 1, 2, 0, 4, 0, 2, 0, 1]
    vocab = build_draft_vocab(counts, size=4)
    # Top 4 by count: 5, 3, 7, then a three-way tie at 1 broken by the lower id (1); sorted by id.
    assert vocab.draft_to_target.tolist() == [1, 3, 5, 7]
    assert vocab.d2t.dtype == torch.int64 and vocab.d2t.tolist() == [1, 2, 3, 4]
    draft_ids = torch.arange(4)
    assert (draft_ids + vocab.d2t[draft_ids]).tolist() == [1, 3, 5, 7]
    assert vocab.t2d.dtype == torch.bool and vocab.t2d.nonzero().flatten().tolist() == [1, 3, 5, 7]
    assert vocab.coverage() == pytest.approx(9 / 11)
    # Asking for more than was seen fills with the lowest unseen ids; capped at the target vocab.
    assert build_draft_vocab(counts, size=8).draft_to_target.tolist() == [0, 1, 2, 3, 4, 5, 7, 9]
    assert build_draft_vocab(counts, size=50).size == 10


def _rms(x, w, eps):
    return w * x / torch.sqrt((x * x).mean() + eps)


def _rope(vec, pos, theta):
    d = vec.numel()
    out = vec.clone()
    for j in range(d // 2):
        angle = pos * theta ** (-2 * j / d)
        a, b = vec[j], vec[j + d // 2]
        out[j] = a * math.cos(angle) - b * math.sin(angle)
        out[j + d // 2] = b * math.cos(angle) + a * math.sin(angle)
    return out


def hand_ttt(draft: Eagle3Draft, ids, aux, final, mask, lm_rows, steps, decay):
    """The training-time test written out position by position, key by key."""
    cfg, layer = draft.cfg, draft.midlayer
    attn, eps = layer.self_attn, cfg.rms_norm_eps
    T, d, h, kv = len(ids), cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    p_target = torch.softmax(final @ lm_rows.T, -1)  # (T, N)
    hidden = [aux[t] @ draft.fc.weight.T for t in range(T)]
    tokens = [ids[t + 1] if t + 1 < T else 0 for t in range(T)]
    keys: list[list] = []  # keys[step][t] = (k heads, v heads)
    total, accs = 0.0, []
    for i in range(steps):
        step_keys, outs, new_tokens, losses, hits = [], [], [], [], []
        xs = []
        for t in range(T):
            x = torch.cat(
                [
                    _rms(draft.embed_tokens.weight[tokens[t]], layer.input_layernorm.weight, eps),
                    _rms(hidden[t], layer.hidden_norm.weight, eps),
                ]
            )
            xs.append(x)
            k = (attn.k_proj.weight @ x).view(kv, d)
            v = (attn.v_proj.weight @ x).view(kv, d)
            step_keys.append(([_rope(k[g], t + i, cfg.rope_theta) for g in range(kv)], [v[g] for g in range(kv)]))
        keys.append(step_keys)
        for t in range(T):
            q = (attn.q_proj.weight @ xs[t]).view(h, d)
            heads = []
            for head in range(h):
                g = head // (h // kv)
                qh = _rope(q[head], t + i, cfg.rope_theta)
                visible = [keys[0][s] for s in range(t + 1)] + [keys[j][t] for j in range(1, i + 1)]
                logits = torch.stack([qh @ kk[g] / math.sqrt(d) for kk, _ in visible])
                w = torch.softmax(logits, 0)
                heads.append(sum(w[n] * visible[n][1][g] for n in range(len(visible))))
            mid = hidden[t] + attn.o_proj.weight @ torch.cat(heads)
            mlp = layer.mlp
            y = _rms(mid, layer.post_attention_layernorm.weight, eps)
            out = mid + mlp.down_proj.weight @ (torch.nn.functional.silu(mlp.gate_proj.weight @ y) * (mlp.up_proj.weight @ y))
            outs.append(out)
            logit = draft.lm_head.weight @ _rms(out, draft.norm.weight, eps)
            p = t + 1 + i  # target logits position for this step
            # Trained: the token after p is model-generated and the target's full-vocab argmax is draftable.
            if p + 1 < T and mask[p + 1] and draft.t2d[(final[p] @ draft.embed_tokens.weight.T).argmax()]:
                losses.append(-(p_target[p] * torch.log_softmax(logit, 0)).sum())
                hits.append(float(logit.argmax() == p_target[p].argmax()))
            new_tokens.append(int(draft.to_target(logit.argmax())))
        hidden, tokens = outs, new_tokens
        total = total + decay**i * (torch.stack(losses).mean() if losses else 0.0)
        accs.append(sum(hits) / max(1, len(hits)))
    return total, accs


@pytest.mark.parametrize("steps", [1, 3])
def test_ttt_matches_hand_computation(steps):
    draft, draft_ids = tiny_draft()
    T = 7
    torch.manual_seed(1)
    ids = torch.randint(0, 12, (T,))
    aux = torch.randn(T, 24)
    final = torch.randn(T, 8)
    mask = torch.tensor([0, 0, 1, 1, 1, 1, 1], dtype=torch.float32)
    lm_rows = draft.embed_tokens.weight[draft_ids]
    in_vocab = draft.t2d[(final @ draft.embed_tokens.weight.T).argmax(-1)]  # a tied target head
    batch = {"input_ids": ids[None], "loss_mask": mask[None], "aux": aux[None], "final": final[None], "in_vocab": in_vocab[None]}
    scores = unroll(draft, batch, lm_rows, steps)
    loss = sum(0.8**i * s.loss_sum / s.count.clamp(min=1) for i, s in enumerate(scores))
    with torch.no_grad():
        expected, accs = hand_ttt(draft, ids.tolist(), aux, final, mask, lm_rows, steps, 0.8)
    assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-5)
    assert [float(s.correct / s.count.clamp(min=1)) for s in scores] == pytest.approx(accs)
    assert scores[0].count > 0
    loss.backward()
    assert draft.fc.weight.grad.abs().sum() > 0 and draft.embed_tokens.weight.grad is None


def test_draftable_check_computes_in_the_heads_dtype():
    """fp32 states against a bf16 head (training in bf16): the logits are bf16, the answer is the fp32 one where the
    winner is clear, and a row longer than a chunk (ragged last chunk) and an empty row both work."""
    torch.manual_seed(0)
    head = torch.randn(300, 16)
    t2d = torch.zeros(300, dtype=torch.bool)
    t2d[::3] = True
    winners = torch.tensor([0, 1, 3, 299, 150, 7, 9])
    final = 4 * head[winners] / head[winners].norm(dim=-1, keepdim=True) ** 2 * head.norm(dim=-1).max()  # clear winners
    expected = t2d[(final @ head.T).argmax(-1)]
    assert expected.tolist() == t2d[winners].tolist()
    assert target_in_vocab(final, head.bfloat16(), t2d, chunk=4).tolist() == expected.tolist()
    assert target_in_vocab(final[:0], head.bfloat16(), t2d).shape == (0,)


def test_export_names_shapes_dtypes_and_reload(tmp_path):
    draft, _ = tiny_draft()
    cfg = draft.cfg
    target = ExportTarget(30, "LlamaForCausalLM")
    export_draft(draft.state_dict(), cfg, [2, 15, 27], target, tmp_path / "bf16", engine="sglang", dtype="bfloat16")
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    H, Ht, inter, d = cfg.hidden_size, cfg.target_hidden_size, cfg.intermediate_size, cfg.head_dim
    expected = {
        "fc.weight": (H, 3 * Ht),
        "midlayer.input_layernorm.weight": (H,),
        "midlayer.hidden_norm.weight": (H,),
        "midlayer.self_attn.q_proj.weight": (cfg.num_attention_heads * d, 2 * H),
        "midlayer.self_attn.k_proj.weight": (cfg.num_key_value_heads * d, 2 * H),
        "midlayer.self_attn.v_proj.weight": (cfg.num_key_value_heads * d, 2 * H),
        "midlayer.self_attn.o_proj.weight": (H, cfg.num_attention_heads * d),
        "midlayer.post_attention_layernorm.weight": (H,),
        "midlayer.mlp.gate_proj.weight": (inter, H),
        "midlayer.mlp.up_proj.weight": (inter, H),
        "midlayer.mlp.down_proj.weight": (H, inter),
        "norm.weight": (H,),
        "lm_head.weight": (cfg.draft_vocab_size, H),
        "d2t": (cfg.draft_vocab_size,),
        "t2d": (cfg.vocab_size,),
    }
    assert {k: tuple(v.shape) for k, v in tensors.items()} == expected
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert all(v.dtype == torch.bfloat16 for k, v in tensors.items() if k not in ("d2t", "t2d"))
    config = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["num_hidden_layers"] == 1
    assert (config["vocab_size"], config["draft_vocab_size"], config["target_hidden_size"]) == (12, 6, 8)
    assert "eagle_aux_hidden_state_layer_ids" not in config["eagle_config"]  # EAGLE-3's default: any engine's
    assert read_export_config(tmp_path / "bf16")[1] == [2, 15, 27]

    # A float32 export reloads to the same logits; the embedding comes from the target, not the file.
    export_draft(draft.state_dict(), cfg, [2, 15, 27], target, tmp_path / "f32", dtype="float32")
    reloaded = load_export(tmp_path / "f32", draft.embed_tokens.weight)
    torch.manual_seed(3)
    aux, tokens, positions = torch.randn(2, 5, 24), torch.randint(0, 12, (2, 5)), torch.arange(5).expand(2, 5)
    with torch.no_grad():
        for a, b in zip(draft(aux, tokens, positions, 3), reloaded(aux, tokens, positions, 3), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_full_vocabulary_export_has_no_d2t_and_reloads(tmp_path):
    """vLLM makes no d2t parameter when the draft vocabulary is the target's, and refuses a weight it has no place for."""
    torch.manual_seed(0)
    cfg = tiny_config(draft_vocab_size=12)
    vocab = build_draft_vocab(np.arange(12), 12)
    draft = Eagle3Draft(cfg, torch.randn(12, cfg.hidden_size), vocab.d2t, vocab.t2d)
    export_draft(draft.state_dict(), cfg, [2, 15, 27], ExportTarget(30), tmp_path, dtype="float32")
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        assert "d2t" not in f.keys() and "t2d" in f.keys()
    reloaded = load_export(tmp_path, draft.embed_tokens.weight)
    assert torch.equal(reloaded.d2t, torch.zeros(12, dtype=torch.int64))
