"""Kimi-K2.5 in miniature on a real vLLM (CPU build): the wrapper itself, not its text body, serves chat with Kimi's
parsers, and the ids it reports are the ones draftsmith renders and counts.

Run by `make test-vllm` (DRAFTSMITH_VLLM_PYTHON names the vLLM environment).
"""

import os

import httpx
import pytest

from tasks.config import RunConfig
from tasks.vllm_server import VllmServer
from tests.support.kimi_mini import build_kimi_mini

VLLM_PYTHON = os.environ.get("DRAFTSMITH_VLLM_PYTHON", "")
pytestmark = pytest.mark.skipif(not VLLM_PYTHON, reason="needs DRAFTSMITH_VLLM_PYTHON (make test-vllm)")
# The parsers a provider serving Kimi-K2.5 runs; remote code for the tiktoken tokenizer only.
KIMI_ARGS = [
    "--enforce-eager",
    "--trust-remote-code",
    "--reasoning-parser",
    "kimi_k2",
    "--tool-call-parser",
    "kimi_k2",
    "--enable-auto-tool-choice",
]


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    return build_kimi_mini(tmp_path_factory.mktemp("kimi") / "kimi-mini")


def mini_config(mini, runs_dir, **sections) -> RunConfig:
    """A run of the miniature whose stages run it in vLLM, in bf16 as Kimi-K2.5 is served."""
    base = {
        "name": "kimi-mini",
        "runs_dir": str(runs_dir),
        "target": {"model": "kimi-mini", "source": "hf_dir", "path": str(mini), "trust_remote_code": True},
        "compute": {"dtype": "bfloat16"},
        "vllm": {"python": VLLM_PYTHON, "args": KIMI_ARGS, "startup_s": 600},
    }
    return RunConfig.model_validate(base | sections)


def test_the_kimi_miniature_serves_through_its_wrapper_with_the_ids_draftsmith_renders(mini, tmp_path):
    from tasks.target_model.loader import load_tokenizer

    config = mini_config(mini, tmp_path)
    messages = [{"role": "user", "content": "Name three colors."}]
    request = {"model": "kimi-mini", "messages": messages, "max_tokens": 16, "temperature": 0}
    request |= {"return_token_ids": True, "chat_template_kwargs": {"thinking": True}}
    with VllmServer(config, tmp_path / "vllm.log", [], 2048) as server:
        reply = httpx.post(f"{server.url}/v1/chat/completions", json=request, timeout=300).json()
    log = (tmp_path / "vllm.log").read_text()
    assert "Resolved architecture: KimiK25ForConditionalGeneration" in log and "Using CPU_MLA backend" in log
    tokenizer = load_tokenizer(config.target)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, thinking=True, tokenize=False)
    rendered = tokenizer.encode(text, add_special_tokens=False)
    assert reply["prompt_token_ids"] == rendered  # the engine renders K2.5's template as draftsmith does
    assert reply["prompt_token_ids"][-1] == tokenizer.convert_tokens_to_ids("<think>")  # thinking on
    [choice] = reply["choices"]
    assert reply["usage"]["completion_tokens"] == len(choice["token_ids"]) == 16  # the provider's count is the ids'


def test_extract_through_vllm_gives_the_text_bodys_states_at_the_default_layers(mini, tmp_path, prefect_harness):
    """vLLM's extract_hidden_states on the wrapper: the body's width, EAGLE-3's default layers of its depth, finite
    bf16 states for every token, and the final norm read by name from the wrapper's shards."""
    import json

    import torch

    from flows.extract import extract_flow
    from tasks.extract.shards import read_shard
    from tasks.target_model.loader import load_tokenizer
    from tests.tasks.extract_inputs import write_merged

    config = mini_config(mini, tmp_path, extract={"backend": "vllm", "shard_tokens": 400})
    rows = write_merged(config.run_dir, load_tokenizer(config.target), train=6, eval_=2)
    summary = extract_flow(config)
    meta = json.loads((config.run_dir / "hidden_states" / "meta.json").read_text())
    assert meta["backend"] == "vllm" and meta["hidden_size"] == 256 and meta["aux_layer_ids"] == [2, 4, 5]
    assert summary["tokens"] == sum(r["num_tokens"] for r in rows)
    for shard in sorted((config.run_dir / "hidden_states").glob("shard-*.safetensors")):
        aux, final = read_shard(shard)[:2]
        assert aux.shape[1] == 3 * 256 and final.shape[1] == 256 and aux.dtype == torch.bfloat16
        assert bool(torch.isfinite(aux.float()).all() and torch.isfinite(final.float()).all())


def test_an_mla_draft_trains_on_the_miniatures_states_and_loads_beside_it_in_vllm(mini, tmp_path, prefect_harness):
    """The chain past extract on Kimi's shape: the draft trains offline on vLLM's states with the embedding and lm_head
    read by name from the wrapper's shards, exports as Eagle3DeepseekV2ForCausalLM, and vLLM loads it unedited beside
    the MLA target and drafts with it."""
    import json

    import httpx

    from flows.extract import extract_flow
    from flows.train import train_flow
    from tasks.evaluate.vllm_engine import speculative_options
    from tasks.target_model.loader import load_tokenizer
    from tasks.vllm_server import counter
    from tests.tasks.extract_inputs import write_merged

    shape = {"arch": "mla", "fc_norm": True, "norm_output": True}
    # The full vocabulary: a random target's next token is any of 163,840, and a position whose token is outside the
    # draft's vocabulary trains nothing (a smaller vocabulary's d2t export is checked in tests/tasks). Enough steps for
    # the gate's first and last windows of ten; the demo's learning rate.
    train = {"draft": shape, "draft_vocab_size": 163_840, "ttt_steps": 2, "max_steps": 24, "warmup_steps": 3, "lr": 1e-3}
    train |= {"batch_tokens": 256, "checkpoint_every": 24, "min_acc_0_rise": None}
    config = mini_config(mini, tmp_path, extract={"backend": "vllm"}, train=train)
    write_merged(config.run_dir, load_tokenizer(config.target), train=8, eval_=2)
    extract_flow(config)
    trained = train_flow(config)
    export = config.run_dir / "draft" / "export"
    exported = json.loads((export / "config.json").read_text())
    assert exported["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and exported["kv_lora_rank"] == 512
    assert exported["draft_vocab_size"] == exported["vocab_size"] == 163_840 and trained["steps"] == 24
    request = {"model": "kimi-mini", "messages": [{"role": "user", "content": "Name three colors."}], "max_tokens": 16}
    with VllmServer(config, tmp_path / "draft.log", speculative_options(export, 2), 2048) as server:
        httpx.post(f"{server.url}/v1/chat/completions", json=request | {"temperature": 0}, timeout=300).raise_for_status()
        drafts = counter(httpx.get(f"{server.url}/metrics").text, "vllm:spec_decode_num_drafts_total")
    assert drafts > 0 and "Eagle3DeepseekV2ForCausalLM" in (tmp_path / "draft.log").read_text()
