from typer.testing import CliRunner

from flows.cli import app

COMMANDS = ["fetch-demo-model", "fetch-assets", "preflight", "run", "demo", "deploy", "serve-target"]


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
