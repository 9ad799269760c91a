"""Prompt sources: OpenAI messages, ShareGPT, BFCL function calling, instruction/response rows.

Files are read as a stream (JSON lines, a JSON array element by element, Parquet in batches), so a
large file is never loaded whole and a file cut off mid-record keeps every complete record.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.config import ConfigError, SourceConfig
from tasks.contracts import RowError, quarantine_row
from tasks.generate.turns import first_turn
from tasks.target_model.assets import AssetError, resolve_path

log = logging.getLogger(__name__)

STAGE = "generate"
CHUNK_CHARS = 1 << 20  # characters read per step when streaming a JSON array
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "assistant": "assistant",
    "system": "system",
    "tool": "tool",
    "function_response": "tool",
    "observation": "tool",
}
BFCL_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}
INSTRUCTION_KEYS = ("instruction", "problem", "prompt", "question")
RESPONSE_KEYS = ("output", "response", "answer", "solution", "completion")
JSON_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}


@dataclass(frozen=True)
class Unreadable:
    """A record that could not be parsed: `reason` is file_cut, malformed_json, not_utf8 or empty_file."""

    reason: str
    location: str
    detail: str


@dataclass
class LoadedPrompts:
    """Prompt rows (contract `prompts`) and the rows refused on the way, with reasons."""

    rows: list[dict] = field(default_factory=list)
    quarantine: list[dict] = field(default_factory=list)
    usable: int = 0  # rows that passed every check before reading stopped, those `offset` skipped included


def content_id(messages: list[dict], tools: list[dict] | None) -> str:
    """A stable id from the prompt's content (16 hex chars of sha256)."""
    blob = json.dumps([messages, tools], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def _open_text(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _first_char(path: Path) -> str:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        while ch := f.read(1):
            if not ch.isspace():
                return ch
    return ""


def iter_json_array(path: Path) -> Iterator[tuple[Any, str] | Unreadable]:
    """Yield (element, location) from a JSON array; a tail that never parses yields one Unreadable last."""
    decoder = json.JSONDecoder()
    with _open_text(path) as f:
        buf, eof, index, consumed = f.read(CHUNK_CHARS), False, 0, 0
        pos = buf.index("[") + 1
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                pos += 1
            if pos < len(buf) and buf[pos] == "]":
                return
            try:
                element, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError as e:
                if not eof:
                    chunk = f.read(CHUNK_CHARS)
                    eof = not chunk
                    consumed += pos
                    buf, pos = buf[pos:] + chunk, 0
                    continue
                # The element never completes before the end of the file: the file was cut there.
                yield Unreadable("file_cut", f"{path.name}:element {index} (char {consumed + pos})", e.msg)
                return
            yield element, f"{path.name}:element {index}"
            index += 1
            pos = end


def iter_records(path: Path) -> Iterator[tuple[Any, str] | Unreadable]:
    """Yield (record, location) per record, or an Unreadable where a record cannot be parsed."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        line = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            for record in batch.to_pylist():
                yield record, f"{path.name}:row {line}"
                line += 1
        return
    first = _first_char(path)
    if first == "":
        yield Unreadable("empty_file", path.name, "the file holds no records")
        return
    if first == "[":
        yield from iter_json_array(path)
        return
    # Lines are decoded one by one, so a line with bytes that are not UTF-8 costs only that line.
    with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield Unreadable("not_utf8", f"{path.name}:{number}", f"byte {e.start} is not UTF-8 ({e.reason})")
                continue
            if not text.strip():
                continue
            try:
                yield json.loads(text), f"{path.name}:{number}"
            except json.JSONDecodeError as e:
                reason = "malformed_json" if text.endswith("\n") else "file_cut"
                yield Unreadable(reason, f"{path.name}:{number}", e.msg)


def _check_messages(messages: Any) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise RowError("bad_row", "messages", "expected a non-empty list of chat messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise RowError("bad_row", f"messages[{i}].role", f"expected role system/user/assistant/tool, got {m!r:.80}")
        content = m.get("content")
        if not (isinstance(content, str) and content.strip()) and not m.get("tool_calls"):
            raise RowError("bad_row", f"messages[{i}].content", "empty content and no tool_calls")
    return messages


def cut_last_reply(messages: list[dict]) -> tuple[list[dict], dict | None]:
    """(the turns before the last assistant turn, that turn or None); the prompt must end with a user or tool turn."""
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    reply = None
    if last is not None and last == len(messages) - 1:
        messages, reply = messages[:last], messages[last]
    if not messages or messages[-1]["role"] not in ("user", "tool"):
        raise RowError("bad_row", "messages", "no user or tool turn before the reply to regenerate")
    return messages, reply


def _check_schema(node: Any, where: str) -> None:
    """The parts of JSON Schema a chat template reads: known types, `properties` of schemas, `required` names."""
    if not isinstance(node, dict):
        raise RowError("bad_row", where, f"expected a JSON schema object, got {type(node).__name__}")
    types = node.get("type", "object")
    for t in types if isinstance(types, list) else [types]:
        if t not in JSON_TYPES:
            raise RowError("bad_row", f"{where}.type", f"{t!r} is not a JSON schema type ({', '.join(sorted(JSON_TYPES))})")
    properties = node.get("properties", {})
    if not isinstance(properties, dict):
        raise RowError("bad_row", f"{where}.properties", "expected an object mapping names to schemas")
    for name, sub in properties.items():
        _check_schema(sub, f"{where}.properties.{name}")
    required = node.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise RowError("bad_row", f"{where}.required", "expected a list of property names")
    if "items" in node:
        _check_schema(node["items"], f"{where}.items")


def _check_tools(tools: Any) -> list[dict]:
    if not isinstance(tools, list):
        raise RowError("bad_row", "tools", "expected a list of tool definitions")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RowError("bad_row", f"tools[{i}].function.name", "expected {type: function, function: {name, parameters}}")
        _check_schema(fn.get("parameters", {"type": "object"}), f"tools[{i}].function.parameters")
    return tools


Parsed = tuple[list[dict], list[dict] | None, Any, dict | None]  # prompt messages, tools, the row's id, its reply


def from_openai(record: dict) -> Parsed:
    messages = _check_messages(record.get("messages"))
    tools = _check_tools(record["tools"]) if record.get("tools") else None
    prompt, reply = cut_last_reply(messages)
    return prompt, tools, record.get("id"), reply


def from_sharegpt(record: dict) -> Parsed:
    turns = record.get("conversations", record.get("conversation"))
    if not isinstance(turns, list) or not turns:
        raise RowError("bad_row", "conversations", "expected a non-empty list of {from, value} turns")
    messages = []
    for i, turn in enumerate(turns):
        role = SHAREGPT_ROLES.get(str(turn.get("from", "")).lower()) if isinstance(turn, dict) else None
        if role is None:
            raise RowError("bad_row", f"conversations[{i}].from", f"unknown speaker {turn!r:.60}")
        messages.append({"role": role, "content": turn.get("value")})
    prompt, reply = cut_last_reply(_check_messages(messages))
    return prompt, None, record.get("id"), reply


def _bfcl_schema(node: Any) -> Any:
    """BFCL parameter schemas use Python type names; JSON Schema wants object/number/array."""
    if isinstance(node, dict):
        out = {k: _bfcl_schema(v) for k, v in node.items()}
        if isinstance(out.get("type"), str):
            out["type"] = BFCL_TYPES.get(out["type"], out["type"])
        return out
    if isinstance(node, list):
        return [_bfcl_schema(v) for v in node]
    return node


def from_bfcl(record: dict) -> Parsed:
    question = record.get("question")
    if not isinstance(question, list) or not question:
        raise RowError("bad_row", "question", "expected a list of turns (each a list of chat messages)")
    turns = [m for turn in question for m in (turn if isinstance(turn, list) else [turn])]
    functions = record.get("function")
    if not isinstance(functions, list) or not functions:
        raise RowError("bad_row", "function", "expected a non-empty list of function definitions")
    tools = []
    for i, fn in enumerate(functions):
        if not isinstance(fn, dict) or not fn.get("name"):
            raise RowError("bad_row", f"function[{i}].name", "function definition without a name")
        spec = {"name": fn["name"], "description": fn.get("description", "")}
        spec["parameters"] = _bfcl_schema(fn.get("parameters") or {"type": "object", "properties": {}})
        tools.append({"type": "function", "function": spec})
    prompt, reply = cut_last_reply(_check_messages(turns))
    return prompt, tools, record.get("id"), reply


def from_instruction(record: dict) -> Parsed:
    key = next((k for k in INSTRUCTION_KEYS if isinstance(record.get(k), str) and record[k].strip()), None)
    if key is None:
        raise RowError("bad_row", "instruction", f"no non-empty field among {list(INSTRUCTION_KEYS)}")
    text = record[key].strip()
    extra = record.get("input")
    if isinstance(extra, str) and extra.strip():
        text = f"{text}\n\n{extra.strip()}"
    messages = [{"role": "system", "content": record["system"]}] if record.get("system") else []
    messages.append({"role": "user", "content": text})
    answer = next((record[k] for k in RESPONSE_KEYS if isinstance(record.get(k), str) and record[k].strip()), None)
    return messages, None, record.get("id"), {"role": "assistant", "content": answer} if answer else None


PARSERS = {"openai": from_openai, "sharegpt": from_sharegpt, "bfcl": from_bfcl, "instruction": from_instruction}


def load_source(cfg: SourceConfig, warn: bool = True) -> LoadedPrompts:
    """Read one source into prompt rows; unreadable rows and a cut file go to quarantine (and a warning if `warn`)."""
    out = LoadedPrompts()
    path = resolve_path(cfg.path)
    parse = PARSERS[cfg.format]
    seen: set[str] = set()
    readable = 0
    for item in iter_records(path):
        if cfg.limit is not None and len(out.rows) >= cfg.limit:
            break
        if isinstance(item, Unreadable):
            detail = f"{item.location}: {item.detail}; {readable} readable records before it"
            if warn:
                log.warning("source %s: %s: %s", cfg.name, item.reason, detail)
            out.quarantine.append(quarantine_row(STAGE, None, cfg.name, item.reason, detail, None, item.location))
            continue
        record, location = item
        try:
            if not isinstance(record, dict):
                raise RowError("bad_row", "<row>", f"expected an object, got {type(record).__name__}")
            messages, tools, given, reply = parse(record)
            if cfg.replies == "dataset" and reply is None:
                raise RowError("no_reply", "messages", "replies: dataset needs the row to end with an assistant turn")
            if cfg.max_prompt_chars is not None:  # each_turn: the first turn's prompt here, later ones as they come
                sent = first_turn(messages + [reply] if reply else messages) if cfg.regenerate == "each_turn" else messages
                chars = sum(len(m.get("content") or "") for m in sent)
                if chars > cfg.max_prompt_chars:
                    raise RowError(
                        "prompt_too_long", "messages", f"prompt has {chars} chars > max_prompt_chars {cfg.max_prompt_chars}"
                    )
        except RowError as e:
            row_id = f"{cfg.name}:{record.get('id')}" if isinstance(record, dict) and record.get("id") else None
            out.quarantine.append(quarantine_row(STAGE, row_id, cfg.name, e.reason, str(e), e.field, location))
            continue
        readable += 1
        out.usable = readable
        if readable <= cfg.offset:
            continue
        row_id = f"{cfg.name}:{given if given not in (None, '') else content_id(messages, tools)}"
        if row_id in seen:
            out.quarantine.append(
                quarantine_row(STAGE, row_id, cfg.name, "duplicate_id", "id already taken by an earlier row", "id", location)
            )
            continue
        seen.add(row_id)
        row = {
            "id": row_id,
            "source": cfg.name,
            "messages": json.dumps(messages, ensure_ascii=False),
            "tools": json.dumps(tools, ensure_ascii=False) if tools else None,
        }
        if cfg.replies == "dataset":
            row["reply"] = reply
        elif cfg.regenerate == "each_turn":  # the whole conversation; tasks/generate/turns.py asks it turn by turn
            row["conversation"] = messages + ([reply] if reply else [])
        out.rows.append(row)
    return out


def refusals(cfg: SourceConfig, quarantine: list[dict]) -> str:
    """How many rows each check refused, most first: "13368 prompt_too_long (max_prompt_chars 1500), 344 bad_row"."""
    settings = {"prompt_too_long": f"max_prompt_chars {cfg.max_prompt_chars}", "bad_row": f"format {cfg.format}"}
    counts = Counter(q["reason"] for q in quarantine).most_common()
    return ", ".join(f"{n} {reason}" + (f" ({settings[reason]})" if reason in settings else "") for reason, n in counts)


def check_source(cfg: SourceConfig, key: str) -> None:
    """ConfigError naming `key` when the source would give no prompt: its file missing, or every row refused or
    skipped by `offset`. Reads up to its first prompt; the whole file only when it has none (and then nothing runs)."""
    path = Path(cfg.path)
    if not cfg.path.startswith(("pypi:", "pypi-sdist:")) and not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise ConfigError(f"{key}.path: {path} {what}; expected a {cfg.format} file (JSON lines, a JSON array or Parquet)")
    try:
        first = load_source(cfg.model_copy(update={"limit": 1}), warn=False)  # its refusals are in the message
    except AssetError as e:
        raise ConfigError(f"{key}.path: {e}") from None
    if first.rows:
        return
    refused = refusals(cfg, first.quarantine)
    if first.usable:
        raise ConfigError(
            f"{key}.offset: {cfg.offset} skips all {first.usable} usable rows of source {cfg.name!r} ({cfg.path}), "
            f"of {first.usable + len(first.quarantine)} read"
            + (f"; refused: {refused}" if refused else "")
            + f"; set offset below {first.usable}"
        )
    raise ConfigError(
        f"{key}: source {cfg.name!r} ({cfg.path}) has no usable row: {refused or 'no records'}; "
        f"check that its rows are {cfg.format} rows and what its filters (max_prompt_chars, replies) let through"
    )


def check_sources(sources: list[SourceConfig], origin: str) -> None:
    """Every source gives at least one prompt (else ConfigError naming `origin` and the source's key)."""
    for i, cfg in enumerate(sources):
        check_source(cfg, f"{origin}: generate.sources[{i}]")


def load_sources(sources: list[SourceConfig]) -> LoadedPrompts:
    """All configured sources, in order."""
    total = LoadedPrompts()
    for cfg in sources:
        part = load_source(cfg)
        total.rows += part.rows
        total.quarantine += part.quarantine
        log.info("source %s: %d prompts, %d quarantined", cfg.name, len(part.rows), len(part.quarantine))
    return total
