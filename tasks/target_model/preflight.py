"""Tokenizer preflight: resolve every special token the chat format uses and prove each by round trip.

A pipeline that pinned Kimi-K2's `<|im_end|>` to 163533 trained on "chas"; the right id was 163586.
Ids are therefore resolved from the tokenizer, checked with `decode([id]) == text` and
`encode(text) == [id]`, and any id a config pins must agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from prefect import task

from tasks.config import TargetConfig, UserError
from tasks.target_model.chat import chat_format_of
from tasks.target_model.formats import ChatFormat, FormatError
from tasks.target_model.formats.template import Probe, template_format
from tasks.target_model.loader import load_tokenizer
from tasks.target_model.tokens import codec

# A conversation that exercises every part of a chat format: system, user, reasoning, tool call,
# tool result and a final answer. Rendering it shows which special tokens the template emits.
PROBE_MESSAGES = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U"},
    {
        "role": "assistant",
        "content": "A",
        "reasoning_content": "R",
        "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}],
    },
    {"role": "tool", "tool_call_id": "call_0", "content": "T"},
    {"role": "assistant", "content": "B", "reasoning_content": "R"},
]
PROBE_TOOLS = [
    {
        "type": "function",
        "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {}}},
    }
]
# Template features a turn cannot be written without, where the template itself writes turns.
NEEDED = ("content", "end of turn")
# Marker texts that formats use without always registering them as special tokens.
COMMON_MARKERS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]


class PreflightError(UserError, RuntimeError):
    """A special token does not resolve or round-trip; the message names the token and the right id."""


@dataclass
class TokenCheck:
    text: str
    role: str
    token_id: int | None
    pinned: int | None
    decodes_to: str | None
    encodes_to: list[int]
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class PreflightReport:
    target: str
    chat_format: str
    tokenizer_class: str
    end_of_turn: str
    end_of_turn_id: int | None
    trust_remote_code: bool
    has_template: bool
    checks: list[TokenCheck]
    features: tuple[Probe, ...] = ()  # what the chat template renders of a turn, feature by feature

    @property
    def problems(self) -> list[str]:
        found = [p for c in self.checks for p in c.problems]
        if self.chat_format == "template":  # nothing can be rebuilt without these two
            found += [f"chat template: {f.feature}: {f.detail}" for f in self.features if f.feature in NEEDED and not f.ok]
        return found

    @property
    def ok(self) -> bool:
        return not self.problems


def classify_marker(text: str, end_of_turn: str, tokenizer) -> str:
    """A role for the table: what the chat format uses this token for."""
    lowered = text.lower()
    if text == end_of_turn:
        return "end of turn"
    if "think" in lowered:
        return "reasoning"
    if "tool" in lowered or "function" in lowered:
        return "tool call"
    if text == tokenizer.bos_token:
        return "bos"
    if text == tokenizer.eos_token:
        return "eos"
    if text == getattr(tokenizer, "pad_token", None):
        return "pad"
    return "role / header"


def render_probe(tokenizer) -> str:
    """The probe conversation rendered by the chat template ('' when the tokenizer has none, or it refuses every
    form of the probe: with tools, plain turns, one exchange)."""
    if not tokenizer.chat_template:
        return ""
    plain = [{"role": m["role"], "content": m["content"]} for m in PROBE_MESSAGES if m["role"] != "tool"]
    for messages, tools in ((PROBE_MESSAGES, PROBE_TOOLS), (plain, None), (plain[1:3], None)):
        try:
            return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
        except Exception:  # a template may reject tools, tool turns, a system turn or two replies in a row
            continue
    return ""


def added_tokens(tokenizer) -> dict[str, int]:
    """Special/added tokens by text."""
    return dict(tokenizer.get_added_vocab())


def resolve_format(tokenizer, cfg: TargetConfig) -> ChatFormat:
    """The chat format (configured or detected), or PreflightError saying what to set."""
    try:
        return chat_format_of(tokenizer, cfg)
    except FormatError as e:
        where = f"target.path {cfg.path}" if cfg.path is not None else f"target.source {cfg.source}"
        raise PreflightError(f"{where}: {e}") from None


def candidate_markers(tokenizer, cfg: TargetConfig, end_of_turn: str, chat_format: ChatFormat) -> list[str]:
    """Every token text the chat format uses: in the template or its render, the format's, pinned, or named."""
    template = tokenizer.chat_template or ""
    rendered = render_probe(tokenizer)
    added = added_tokens(tokenizer)
    used = [t for t in added if t and (t in template or t in rendered)]
    used += [m for m in COMMON_MARKERS if m in template or m in rendered]
    named = [tokenizer.bos_token, tokenizer.eos_token, getattr(tokenizer, "pad_token", None), end_of_turn]
    written = [m for m in chat_format.markers if m in added or m in template]
    ordered = [end_of_turn, *written, *used, *named, *cfg.special_tokens, *cfg.extra_markers]
    return list(dict.fromkeys(t for t in ordered if t))


def check_token(tokenizer, text: str, role: str, pinned: int | None) -> TokenCheck:
    tokens = codec(tokenizer)
    token_id = tokenizer.convert_tokens_to_ids(text)
    if token_id == tokenizer.unk_token_id and text != tokenizer.unk_token:
        token_id = None
    encoded = tokens.encode(text)
    if token_id is None and len(encoded) == 1:
        token_id = encoded[0]
    decoded = tokens.decode([token_id]) if token_id is not None else None
    check = TokenCheck(text, role, token_id, pinned, decoded, encoded)
    if token_id is None:
        check.problems.append(
            f"token {text!r}: not a single token in this tokenizer (encodes to {encoded})"
            + (f"; the config pins id {pinned}" if pinned is not None else "")
        )
    else:
        if decoded != text:
            check.problems.append(f"token {text!r}: id {token_id} decodes to {decoded!r}, not to the token text")
        if encoded != [token_id]:
            check.problems.append(f"token {text!r}: encodes to {encoded}, expected the single id [{token_id}]")
    if pinned is not None and token_id is not None and pinned != token_id:
        size = len(tokens.table)
        real = tokens.decode([pinned]) if 0 <= pinned < size else None
        shown = f"decodes to {real!r}" if real is not None else f"is outside the vocabulary (size {size})"
        check.problems.append(f"token {text!r}: the config pins id {pinned}, which {shown}; the right id is {token_id}")
    return check


def run_preflight(cfg: TargetConfig, tokenizer=None) -> PreflightReport:
    """Resolve and round-trip every special token of the target's chat format."""
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(cfg)
    chat_format = resolve_format(tokenizer, cfg)
    end_of_turn = cfg.end_of_turn or chat_format.end_of_turn
    checks = [
        check_token(tokenizer, text, classify_marker(text, end_of_turn, tokenizer), cfg.special_tokens.get(text))
        for text in candidate_markers(tokenizer, cfg, end_of_turn, chat_format)
    ]
    eot = next((c.token_id for c in checks if c.text == end_of_turn), None)
    return PreflightReport(
        target=cfg.model,
        chat_format=chat_format.name,
        tokenizer_class=type(tokenizer).__name__,
        end_of_turn=end_of_turn,
        end_of_turn_id=eot,
        trust_remote_code=cfg.trust_remote_code,
        has_template=bool(tokenizer.chat_template),
        checks=checks,
        features=template_format(tokenizer).probes if isinstance(tokenizer.chat_template, str) else (),
    )


def render_table(report: PreflightReport):
    """A rich table for the terminal."""
    from rich.table import Table

    title = (
        f"preflight: {report.target} ({report.tokenizer_class}, chat format {report.chat_format}, "
        f"end of turn {report.end_of_turn!r} = {report.end_of_turn_id})"
    )
    if report.trust_remote_code:
        title += " [trust_remote_code ON]"
    table = Table(title=title)
    for column in ("token", "role", "id", "pinned", "decode(id)", "encode(text)", "status"):
        table.add_column(column)
    for c in report.checks:
        table.add_row(
            repr(c.text),
            c.role,
            str(c.token_id),
            "-" if c.pinned is None else str(c.pinned),
            repr(c.decodes_to),
            json.dumps(c.encodes_to),
            "ok" if c.ok else "[red]FAIL[/red]",
        )
    return table


def render_features(report: PreflightReport):
    """What the chat template renders of a turn, as a rich table (the turns `template` writes)."""
    from rich.table import Table

    table = Table(title=f"chat template features (chat format {report.chat_format})")
    for column in ("feature", "status", "detail"):
        table.add_column(column)
    for f in report.features:
        table.add_row(f.feature, "ok" if f.ok else "[yellow]no[/yellow]", f.detail)
    return table


def report_markdown(report: PreflightReport) -> str:
    lines = [
        f"# Preflight: `{report.target}`",
        "",
        f"Tokenizer: `{report.tokenizer_class}`. Chat format: `{report.chat_format}`. "
        f"End of turn: `{report.end_of_turn}` = {report.end_of_turn_id}. "
        f"Chat template: {'yes' if report.has_template else 'none'}. "
        f"trust_remote_code: {'ON' if report.trust_remote_code else 'off'}.",
        "",
        "| token | role | id | pinned | decode(id) | encode(text) | status |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in report.checks:
        status = "ok" if c.ok else "FAIL: " + "; ".join(c.problems)
        pinned = "-" if c.pinned is None else c.pinned
        text = c.text.replace("|", "\\|")
        decoded = (c.decodes_to or "").replace("|", "\\|")
        lines.append(f"| `{text}` | {c.role} | {c.token_id} | {pinned} | `{decoded}` | {c.encodes_to} | {status} |")
    if report.features:
        lines += ["", "What the chat template renders of a turn:", "", "| feature | status | detail |", "|---|---|---|"]
        lines += [f"| {f.feature} | {'ok' if f.ok else 'no'} | {f.detail.replace('|', chr(92) + '|')} |" for f in report.features]
    return "\n".join(lines)


@task(name="preflight")
def preflight_task(cfg: TargetConfig) -> dict:
    """Run the preflight, publish its table, and fail the flow on any problem."""
    from prefect.artifacts import create_markdown_artifact
    from prefect.logging import get_run_logger

    report = run_preflight(cfg)
    create_markdown_artifact(key="preflight", markdown=report_markdown(report), description="Tokenizer preflight")
    logger = get_run_logger()
    if report.trust_remote_code:
        logger.warning("trust_remote_code is ON for %s: the tokenizer runs code from its repository", cfg.model)
    if not report.ok:
        raise PreflightError("preflight failed:\n" + "\n".join(f"  - {p}" for p in report.problems))
    logger.info("preflight ok: %d tokens, end of turn %r = %s", len(report.checks), report.end_of_turn, report.end_of_turn_id)
    return {
        "end_of_turn": report.end_of_turn,
        "end_of_turn_id": report.end_of_turn_id,
        "tokens": len(report.checks),
        "chat_format": report.chat_format,
    }


def stage_preflight(cfg: TargetConfig) -> dict | None:
    """The preflight for a stage flow run alone; inside `eagle3_pipeline` the parent ran it once already."""
    from prefect.runtime import flow_run

    if flow_run.parent_flow_run_id:
        return None
    return preflight_task(cfg)
