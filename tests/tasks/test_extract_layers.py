"""The layer rule (aux id i = input of decoder layer i), checked by hand and against output_hidden_states."""

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tasks.extract.backend import check_aux_layer_ids, default_aux_layer_ids, layer_id_forms
from tasks.extract.batching import cut_shards, order_rows, pack_batches, padding_tokens
from tasks.extract.transformers_backend import TransformersBackend

torch.set_num_threads(1)


def counting_model(layers: int = 8, hidden: int = 16) -> LlamaForCausalLM:
    """A Llama whose layer j adds exactly 1.0 to feature j and nothing else, from zero embeddings.

    The input of layer i is then ones on features 0..i-1 and zeros elsewhere: the number of ones
    names the layer, so which tensor a hook caught can be read off by hand.
    """
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=hidden,
        intermediate_size=8,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        mlp_bias=True,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.zero_()
        for j, layer in enumerate(model.model.layers):
            layer.self_attn.o_proj.weight.zero_()  # attention adds nothing to the residual
            layer.mlp.down_proj.weight.zero_()  # the MLP adds only its output bias
            layer.mlp.down_proj.bias.zero_()
            layer.mlp.down_proj.bias[j] = 1.0
    return model


def test_aux_states_are_layer_inputs_by_hand():
    layers, hidden = 8, 16
    backend = TransformersBackend(counting_model(layers, hidden), aux_layer_ids=[2, 4, 5])
    (row,) = backend.extract([[3, 7, 9, 11]])
    assert row.aux.shape == (4, 3 * hidden) and row.final.shape == (4, hidden)
    assert row.aux.dtype == torch.bfloat16 and row.final.dtype == torch.bfloat16
    for k, layer_id in enumerate([2, 4, 5]):
        chunk = row.aux[:, k * hidden : (k + 1) * hidden].float()  # (T, H)
        expected = torch.zeros(hidden)
        expected[:layer_id] = 1.0  # layers 0..id-1 ran before layer `id` reads its input
        assert torch.equal(chunk, expected.expand(4, hidden)), f"aux chunk {k} is not the input of layer {layer_id}"
    # final = RMSNorm of L ones: each becomes sqrt(H/L) (norm weight 1), i.e. the post-norm state.
    expected_final = torch.zeros(hidden)
    expected_final[:layers] = math.sqrt(hidden / layers)
    torch.testing.assert_close(row.final.float(), expected_final.expand(4, hidden), rtol=1e-2, atol=1e-2)


def test_hooks_match_output_hidden_states_on_a_random_llama():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(config).eval()
    backend = TransformersBackend(model)
    assert backend.aux_layer_ids == default_aux_layer_ids(8) == [2, 4, 5]
    rows = [[1, 5, 9, 13, 17, 21], [2, 4, 6]]
    got = backend.extract(rows)
    for row, states in zip(rows, got, strict=True):
        with torch.no_grad():
            ref = model(torch.tensor([row]), output_hidden_states=True).hidden_states
        expected_aux = torch.cat([ref[i][0] for i in backend.aux_layer_ids], dim=-1)
        torch.testing.assert_close(states.aux, expected_aux.to(torch.bfloat16), rtol=0, atol=0.02)
        torch.testing.assert_close(states.final, ref[-1][0].to(torch.bfloat16), rtol=0, atol=0.02)


def test_hooks_match_output_hidden_states_on_the_demo_target(demo_model, demo_tokenizer):
    backend = TransformersBackend(demo_model)
    assert backend.aux_layer_ids == [2, 15, 27]
    ids = demo_tokenizer.apply_chat_template([{"role": "user", "content": "Name a prime."}], tokenize=True)["input_ids"]
    (states,) = backend.extract([ids])
    with torch.no_grad():
        ref = demo_model(torch.tensor([ids]), output_hidden_states=True).hidden_states  # 31 = embeddings + 30
    h = demo_model.config.hidden_size
    for k, i in enumerate([2, 15, 27]):
        assert torch.equal(states.aux[:, k * h : (k + 1) * h], ref[i][0].to(torch.bfloat16))
        other = ref[i + 1][0].to(torch.bfloat16)
        assert not torch.equal(states.aux[:, k * h : (k + 1) * h], other), "off by one layer"
    assert torch.equal(states.final, ref[-1][0].to(torch.bfloat16))


def test_layer_ids_are_checked_and_spelled_per_engine():
    assert default_aux_layer_ids(30) == [2, 15, 27]
    assert layer_id_forms([2, 15, 27]) == {"hf_hidden_states": [2, 15, 27], "vllm": [2, 15, 27], "sglang": [1, 14, 26]}
    for bad in ([2, 15], [2, 2, 27], [2, 15, 30], [-1, 2, 3]):
        with pytest.raises(ValueError, match="aux_layer_ids"):
            check_aux_layer_ids(bad, 30)


def test_batches_respect_the_token_budget_with_little_padding():
    lengths = [90, 12, 400, 33, 33, 250, 7, 64, 64, 1000]
    keys = [f"r{i}" for i in range(len(lengths))]
    order = order_rows(lengths, keys)
    assert order == order_rows(lengths, keys)
    ordered = [lengths[i] for i in order]
    assert ordered == sorted(lengths, reverse=True)
    batches = pack_batches(ordered, batch_tokens=512)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) == 1 or len(batch) * max(ordered[i] for i in batch) <= 512
    assert batches[0] == [0]  # 1000 > budget runs alone
    assert padding_tokens(ordered, batches) < 0.5 * sum(lengths)
    with pytest.raises(ValueError):
        pack_batches([1, 5], 512)
    shards = cut_shards(ordered, shard_tokens=500)
    assert [i for s in shards for i in s] == list(range(len(lengths)))
    assert all(len(s) == 1 or sum(ordered[i] for i in s) <= 500 for s in shards)
