"""Kimi-K2.5 in miniature on a real vLLM (CPU build): the wrapper itself, not its text body, serves chat with Kimi's
parsers, and the ids it reports are the ones draftsmith renders and counts.

Run by `make test-vllm` (DRAFTSMITH_VLLM_PYTHON names the vLLM environment).
"""

import json
import os
import shutil

import httpx
import pandas as pd
import pytest
import torch

from tasks.config import RunConfig
from tasks.config.train import DraftShape
from tasks.draft.export import read_export_config
from tasks.evaluate.vllm_engine import speculative_options
from tasks.extract.shards import read_shard
from tasks.prefect_env import PROJECT_ROOT
from tasks.storage import read_table
from tasks.vllm_server import VllmServer
from tests.support.kimi_mini import build_kimi_mini, text_body_model
from tests.support.validation import classes_by_mode, exact_rows_lost
from tests.vllm.test_vllm import FIGURES

VLLM_PYTHON = os.environ.get("DRAFTSMITH_VLLM_PYTHON", "")
pytestmark = pytest.mark.skipif(not VLLM_PYTHON, reason="needs DRAFTSMITH_VLLM_PYTHON (make test-vllm)")
# The parsers a provider serving Kimi-K2.5 runs; remote code for the tiktoken tokenizer only.
# vLLM's CPU build serving a Llama-style draft beside an MLA target: one KV cache, two kernels, no block size both take.
BLOCK_SIZES = "No common block size for 16 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])"
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


@pytest.fixture(scope="module")
def kimi_run(mini, tmp_path_factory, prefect_harness):
    """configs/kimi-k2.5-mini.yaml run whole, as `make kimi-mini` runs it: replies from vLLM serving the miniature
    with Kimi's parsers, then every stage through vLLM (guided's likelihoods, extract, evaluate) and the MLA draft."""
    from flows.pipeline import eagle3_pipeline
    from tasks.config.loading import load_config

    runs = tmp_path_factory.mktemp("kimi-runs")
    overrides = {"runs_dir": str(runs), "target.path": str(mini), "vllm.python": VLLM_PYTHON}
    config = load_config(PROJECT_ROOT / "configs" / "kimi-k2.5-mini.yaml", overrides)
    return config, eagle3_pipeline(config)


def test_the_servers_ids_are_rebuilt_and_counted_and_guided_loses_no_exact_row(kimi_run):
    """Thinking replies (BFCL prompts with tools among them) from vLLM with Kimi's parsers: every row's rebuilt ids
    are the server's, the server's counts agree with them, and the same rows played as text and re-split by guided
    on vLLM's likelihoods lose no exact row."""
    config, _ = kimi_run
    generations = read_table("generations", config.run_dir / "generations").to_pandas()
    assert generations["tools"].notna().any() and (generations["reasoning_kind"] == "text").all()
    rates = pd.read_parquet(config.run_dir / "validation" / "rates.parquet")
    check = rates[rates["mode"] == "check"]
    assert int(check["rows"].sum()) == len(generations) and int(check["exact"].sum()) == len(generations)
    assert (check["count_agreement"] == 1.0).all()
    classes = classes_by_mode(config.run_dir)
    lost = exact_rows_lost(classes)
    assert lost == 0 and (classes["simulate-guided"] != "semantic").all()


def test_extract_through_vllm_gives_the_bodys_states_at_the_layers_the_export_names(kimi_run):
    """vLLM's extract_hidden_states on the wrapper: the body's width, EAGLE-3's default layers of its depth (the ones
    the export writes), finite bf16 states for every token of every merged row."""
    config, results = kimi_run
    store = config.run_dir / "hidden_states"
    meta = json.loads((store / "meta.json").read_text())
    exported = json.loads((config.run_dir / "draft" / "export" / "config.json").read_text())
    assert meta["backend"] == "vllm" and meta["hidden_size"] == 256 and meta["aux_layer_ids"] == [2, 4, 5]
    assert read_export_config(config.run_dir / "draft" / "export")[1] == meta["aux_layer_ids"]
    assert exported["draftsmith"]["target_num_layers"] == 8  # engines take EAGLE-3's default layers of that depth
    for shard in sorted(store.glob("shard-*.safetensors")):
        aux, final = read_shard(shard)[:2]
        assert aux.shape[1] == 3 * 256 and final.shape[1] == 256 and aux.dtype == torch.bfloat16
        assert bool(torch.isfinite(aux.float()).all() and torch.isfinite(final.float()).all())


def test_the_mla_draft_served_by_vllm_beside_the_target_agrees_with_draftsmiths_loop(mini, kimi_run, tmp_path):
    """The MLA draft (EAGLE-3.1, a 4096-token vocabulary with d2t) loads in vLLM unedited beside the MLA target:
    every output is greedy's, the trained draft beats the untrained one, and τ is draftsmith's own loop's (run on the
    text body in transformers, the same weights) within 0.05."""
    from tasks.evaluate.stage import evaluate_draft

    config, results = kimi_run
    exported = json.loads((config.run_dir / "draft" / "export" / "config.json").read_text())
    assert exported["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and exported["draft_vocab_size"] == 4096
    served = json.loads((config.run_dir / "eval" / "results.json").read_text())["summary"]
    assert served["engine"] == "vllm" and served["identical"] == served["prompts"]
    assert served["tau_gain"] >= config.evaluate.min_tau_gain
    local = config.model_copy(update={"evaluate": config.evaluate.model_copy(update={"engine": "transformers"})})
    own = evaluate_draft(local, target=text_body_model(mini, "bfloat16"), out=tmp_path / "eval")  # as vLLM serves it
    assert own["identical"] == own["prompts"] == served["prompts"]
    FIGURES["Kimi miniature: τ vLLM / draftsmith's loop (untrained)"] = (
        f"{served['acceptance_length']:.3f} / {own['acceptance_length']:.3f} "
        f"({served['untrained_acceptance_length']:.3f} / {own['untrained_acceptance_length']:.3f})"
    )
    assert abs(served["acceptance_length"] - own["acceptance_length"]) <= 0.05


def test_a_llama_style_draft_trains_on_the_same_states_and_exports_for_kimis_loaders(kimi_run, tmp_path):
    """The Llama-style draft (the other published Kimi-K2.5 shape) on the same extract: it trains and exports with
    d2t/t2d and the body's layer ids. vLLM's CPU build cannot serve it beside the MLA target: its MLA kernel takes
    only 16-token KV blocks and its attention kernel multiples of 32, and one cache needs one block size."""
    from flows.train import train_flow

    config, _ = kimi_run
    llama = config.model_copy(update={"name": "kimi-llama", "train": config.train.model_copy(update={"draft": DraftShape()})})
    for stage in ("merged", "hidden_states"):
        shutil.copytree(config.run_dir / stage, llama.run_dir / stage)
    trained = train_flow(llama)
    export = llama.run_dir / "draft" / "export"
    exported = json.loads((export / "config.json").read_text())
    assert exported["architectures"] == ["LlamaForCausalLMEagle3"] and trained["steps"] == config.train.max_steps
    assert read_export_config(export)[1] == [2, 4, 5] and exported["draft_vocab_size"] == 4096
    with pytest.raises(RuntimeError, match="vLLM exited"):
        with VllmServer(llama, tmp_path / "llama.log", speculative_options(export, 2), 4096):
            pass
    # Refused only after resolving the export's architecture and loading every tensor with vLLM's own loader.
    log = (tmp_path / "llama.log").read_text()
    drafter = log[log.index("Loading drafter model") :]
    assert "Resolved architecture: LlamaForCausalLMEagle3" in log
    assert drafter.index("Loading weights took") < drafter.index(BLOCK_SIZES)


def test_a_streamed_run_trains_the_mla_draft_without_shards_and_plans_kimis_own_width(kimi_run, tmp_path):
    """`train.hidden_states: stream` on the wrapper: training asks vLLM for each batch's states, keeps at most the
    prefetched batches' files, writes no shard, and trains the draft the offline shards trained. The plan for
    Kimi-K2.5's own width (7,168) on the same rows prints the bytes offline shards would take."""
    from tasks.draft.states import plan_hidden_states
    from tasks.draft.train import train_draft
    from tests.vllm.test_stream import largest_batch

    config, _ = kimi_run
    train = config.train.model_copy(update={"hidden_states": "stream"})
    streamed = config.model_copy(update={"name": "kimi-stream", "runs_dir": tmp_path, "train": train})
    shutil.copytree(config.run_dir / "merged", streamed.run_dir / "merged")
    summary = train_draft(streamed)
    assert summary["hidden_states"] == "stream" and summary["step"] == config.train.max_steps
    assert 1 <= summary["peak_files"] <= train.prefetch_batches * largest_batch(streamed, epochs=25)
    assert not (streamed.run_dir / "hidden_states").exists() and not list((streamed.run_dir / "draft" / "stream").glob("*"))
    offline, ours = (last_weights(c) for c in (config, streamed))
    gap = max(float((offline[k].float() - ours[k].float()).abs().max()) for k in offline)
    losses = [
        json.loads((c.run_dir / "draft" / "metrics.jsonl").read_text().splitlines()[-1])["loss"] for c in (config, streamed)
    ]
    FIGURES["Kimi miniature, streamed vs offline: last loss; largest weight gap"] = (
        f"{losses[1]:.4f} vs {losses[0]:.4f}; {gap:.2e}"
    )
    assert abs(losses[1] - losses[0]) <= 0.01 * losses[0]
    plan = plan_hidden_states(streamed, hidden_size=7168)
    assert plan.offline_bytes == plan.tokens * 57_344 and f"{plan.offline_bytes:,} B" in plan.line()
    FIGURES["Kimi-K2.5's width on the miniature's rows"] = plan.line()


def last_weights(config: RunConfig) -> dict:
    return torch.load(sorted((config.run_dir / "draft" / "checkpoints").glob("step-*.pt"))[-1], weights_only=False)["model"]
