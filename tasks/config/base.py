"""What every config model shares: strict validation, form labels from field names, the config error."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

# How words of a field name read in a label: units in brackets, acronyms in capitals.
LABEL_WORDS = {
    "s": "(s)",
    "mb": "(MB)",
    "gib": "(GiB)",
    "usd": "(USD)",
    "nats": "(nats)",
    "ttt": "TTT",
    "api": "API",
    "url": "URL",
    "cpu": "CPU",
    "lr": "learning rate",
    "id": "ID",
    "ids": "IDs",
    "bpe": "BPE",
    "dir": "directory",
    "kv": "KV",
    "acc": "accuracy",
    "tau": "τ",
    "kvcache": "KV cache",
    "lm": "LM",
    "eval": "eval",
}


def field_label(name: str, _info=None) -> str:
    """The form label of a config field: `timeout_s` -> "Timeout (s)", `ttt_steps` -> "TTT steps"."""
    words = [LABEL_WORDS.get(w, w) for w in name.split("_")]
    return " ".join([words[0][:1].upper() + words[0][1:], *words[1:]])


class StrictModel(BaseModel):
    """Base for every config model: unknown keys are errors, assignments are validated."""

    # Each field's docstring is its description, its name made readable its label: the Prefect form shows both.
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, use_attribute_docstrings=True, field_title_generator=field_label
    )


class UserError(Exception):
    """A mistake in what the user gave (config, files, target, environment), not a bug: the `draftsmith` command
    prints the message alone, with no traceback, and exits 2. The message names the file, key or row and the fix."""


class ConfigError(UserError, ValueError):
    """A config file that does not fit the schema; the message names each key path."""
