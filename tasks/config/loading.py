"""Loading a YAML run config (with `--set` overrides), its error lines, and the list of every key."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from tasks.config.base import ConfigError
from tasks.config.run import RunConfig


def config_fields(model: type[BaseModel] | None = None, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """Every config key as (dotted key, type, default, description), nested sections and list items included."""
    rows = []
    for name, field in (model or RunConfig).model_fields.items():
        key, annotation = prefix + name, field.annotation
        item = typing.get_args(annotation)[0] if typing.get_origin(annotation) is list else None
        section = next((t for t in (annotation, item) if isinstance(t, type) and issubclass(t, BaseModel)), None)
        if section is not None:
            rows += config_fields(section, f"{key}[]." if section is item else f"{key}.")
            continue
        default = "required" if field.is_required() else json.dumps(field.get_default(call_default_factory=True), default=str)
        shown = annotation.__name__ if isinstance(annotation, type) else str(annotation).replace("typing.", "")
        rows.append((key, shown.replace("pathlib.", ""), default, " ".join((field.description or "").split())))
    return rows


def format_validation_error(err: ValidationError, origin: str) -> str:
    """One line per problem: `origin: key.path: what was expected (got ...)`."""
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "<root>"
        got = e.get("input")
        shown = "" if e["type"] == "missing" else f" (got {got!r:.80})"
        lines.append(f"{origin}: {path}: {e['msg']}{shown}")
    return "\n".join(lines)


# Without a name a config would run as the default's, in the default's run directory.
NAME_NEEDED = "every run names itself: its outputs go to runs_dir/<name>/, and another name's run is never touched"
# The configs the project ships; --config's default is the first, read from the working directory like any path.
CONFIG_EXAMPLES = "configs/demo.yaml or configs/kimi-k2-openrouter.yaml (paths relative to the working directory)"


def require_sources(config: RunConfig, origin: str) -> None:
    """A run that generates needs prompt sources (else it would replace its generations with nothing)."""
    if not config.generate.sources:
        raise ConfigError(f"{origin}: generate.sources: missing or empty; a run that generates needs at least one source")


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Load a YAML run config; relative paths in it stay relative to the working directory."""
    path = Path(path)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise ConfigError(f"{path}: the config file {what}; --config names a run config YAML, e.g. {CONFIG_EXAMPLES}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.MarkedYAMLError as e:
        where = f", line {e.problem_mark.line + 1}, column {e.problem_mark.column + 1}" if e.problem_mark else ""
        opened = e.context_mark
        context = f" ({e.context} at line {opened.line + 1}, column {opened.column + 1})" if e.context and opened else ""
        raise ConfigError(f"{path}{where}: not valid YAML: {e.problem}{context}") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read YAML: {e}") from None
    if data is None:
        raise ConfigError(f"{path}: the file is empty; a run config needs at least `name` ({NAME_NEEDED})")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for depth, key in enumerate(parents, 1):
            if node.get(key) is None:
                node[key] = {}
            node = node[key]
            if not isinstance(node, dict):
                section = ".".join(parents[:depth])
                raise ConfigError(f"--set {dotted}: {section} is a {type(node).__name__} in {path}, not a section with keys")
        node[leaf] = value
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, str(path))) from None
    if "name" not in data:
        raise ConfigError(f"{path}: name: missing; {NAME_NEEDED}")
    return config
