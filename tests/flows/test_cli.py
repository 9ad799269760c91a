from pathlib import Path

from typer.testing import CliRunner

from flows.cli import app
from tests.pipeline_runs import tree_stats

COMMANDS = ["fetch-demo-model", "fetch-assets", "preflight", "run", "demo", "deploy", "worker", "serve-target"]


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


def test_a_one_stage_run_lists_only_what_it_wrote(capsys):
    from flows.cli import print_outputs
    from tasks.config import RunConfig

    print_outputs(RunConfig(name="x"), {"generate": {"rows": 3, "skipped_prompts": 2}})
    out = capsys.readouterr().out
    assert "generations" in out and "skipped_prompts=2" in out
    assert not any(word in out for word in ("draft", "validation report", "eval report"))
    print_outputs(RunConfig(name="x"), {"validate": {}, "train": {}, "evaluate": {}})
    out = capsys.readouterr().out
    assert all(word in out for word in ("draft", "validation report", "eval report"))
