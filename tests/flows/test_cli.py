from typer.testing import CliRunner

from flows.cli import app

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
