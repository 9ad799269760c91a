"""The pieces of the vLLM engine paths that run without vLLM (the servers themselves: `make test-vllm`)."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from tasks.config import RunConfig


def test_the_final_norm_read_from_the_checkpoint_is_the_models(demo_target, demo_model):
    """vLLM saves the last layer's output un-normed; the norm applied to it must be the target's own."""
    from tasks.extract.vllm_backend import final_norm, rms_norm
    from tasks.target_model.loader import model_dir

    weight, eps = final_norm(model_dir(demo_target), "LlamaForCausalLM")
    x = torch.randn(5, demo_model.config.hidden_size) * 30
    torch.testing.assert_close(rms_norm(x, weight, eps), demo_model.model.norm(x).detach(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="1 \\+ weight"):
        final_norm(model_dir(demo_target), "Gemma3ForCausalLM")


# vLLM's /metrics lines for one request's spec-decode counters (label sets as vLLM 0.32 writes them).
METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="1"}} {p1}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="2"}} {p2}
"""


def test_rounds_are_rebuilt_from_the_counter_deltas():
    """10 rounds, 4 accepting ≥1, 2 accepting ≥2, 1 accepting all 3: accepted per round 0×6, 1×2, 2×1, 3×1."""
    from tasks.evaluate.speculative import acceptance_by_position
    from tasks.evaluate.vllm_engine import counted_rounds

    before = METRICS.format(drafts=5, accepted=3, p0=2, p1=1, p2=0)
    after = METRICS.format(drafts=15, accepted=10, p0=6, p1=3, p2=1)
    result = counted_rounds(before, after, 3, list(range(18)))  # the prefill's token and 17 from the rounds
    assert sorted(result.accepted) == [0] * 6 + [1] * 2 + [2, 3]
    assert result.acceptance_length == pytest.approx(1 + 7 / 10)  # as vLLM's 1 + accepted / drafts
    assert acceptance_by_position([result]) == pytest.approx([0.4, 0.2, 0.1])


def test_drafts_vllm_accepted_past_the_replys_end_are_not_counted():
    """10 rounds accepting 3 each yield 40 tokens after the prefill's, but the reply stopped at 38 (max_tokens): the
    round that ran past the end took only its first draft (as that round's one token, accepted 0, as draftsmith's loop
    counts it)."""
    from tasks.evaluate.vllm_engine import counted_rounds

    before = METRICS.format(drafts=0, accepted=0, p0=0, p1=0, p2=0)
    after = METRICS.format(drafts=10, accepted=30, p0=10, p1=10, p2=10)
    result = counted_rounds(before, after, 3, list(range(38)))
    assert sorted(result.accepted) == [0] + [3] * 9 and result.acceptance_length == pytest.approx(37 / 10)
    assert counted_rounds(before, after, 3, list(range(41))).accepted == [3] * 10  # a reply that took them all


def test_an_export_with_sglang_layer_ids_is_refused_for_vllm(tmp_path):
    from tasks.evaluate.vllm_engine import speculative_options

    (tmp_path / "config.json").write_text(json.dumps({"draftsmith": {"layer_id_convention": "sglang"}}))
    with pytest.raises(ValueError, match="written for SGLang"):
        speculative_options(tmp_path, 4)
    (tmp_path / "config.json").write_text(json.dumps({"draftsmith": {"layer_id_convention": "default (any engine)"}}))
    assert json.loads(speculative_options(tmp_path, 4)[1])["num_speculative_tokens"] == 4


def test_a_python_without_vllm_fails_at_once_with_the_servers_words(tmp_path, monkeypatch):
    from tasks.vllm_server import VllmServer

    monkeypatch.delenv("DRAFTSMITH_VLLM_PYTHON", raising=False)
    config = RunConfig.model_validate({"vllm": {"python": sys.executable, "startup_s": 120}})
    with pytest.raises(RuntimeError, match="No module named 'vllm'"):
        VllmServer(config, tmp_path / "server.log", [], 2048).start()
    with pytest.raises(ValueError, match="DRAFTSMITH_VLLM_PYTHON"):
        VllmServer(RunConfig.model_validate({"vllm": {"python": None}}), tmp_path / "x.log", [], 2048)


HEALTH_ONLY = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()


HTTPServer(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])), Health).serve_forever()
"""

STARTS_THEN_WAITS = """
import sys, time
from tasks.config import RunConfig
from tasks.vllm_server import VllmServer

server = VllmServer(RunConfig.model_validate({"vllm": {"python": sys.executable}}), sys.argv[1], [], 2048)
server.start()
print(server.process.pid, flush=True)
time.sleep(300)
"""


def test_a_sigterm_to_the_run_stops_its_server(tmp_path):
    """A killed run (a cancelled flow run, `kill`) takes its engine with it: the server runs in a session of its own,
    and atexit does not run on a signal. Only the process management is under test here, so the module started in
    vLLM's place answers /health and nothing else."""
    import contextlib
    import os
    import signal
    import subprocess

    from tasks.prefect_env import PROJECT_ROOT

    package = tmp_path / "stand-in" / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (package.parent.parent, package.parent, package):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(HEALTH_ONLY)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PROJECT_ROOT), str(tmp_path / "stand-in")]))
    script = [sys.executable, "-c", STARTS_THEN_WAITS, str(tmp_path / "server.log")]
    run = subprocess.Popen(script, stdout=subprocess.PIPE, text=True, env=env, cwd=PROJECT_ROOT)
    server = int(run.stdout.readline())
    try:
        os.kill(server, 0)  # up
        run.terminate()
        assert run.wait(60) == 128 + 15
        with pytest.raises(ProcessLookupError):
            os.kill(server, 0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server, signal.SIGKILL)
