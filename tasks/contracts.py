"""Data contracts: the pyarrow schema of every hand-off table (tasks/storage.py reads and writes them).

A table is one Parquet file or a directory of `part-NNNNN.parquet` shards; side tables in the same
stage directory (quarantine, reports) use other names so they are never read as data.

Nested structures that vary by provider (messages, tools, tool calls) are stored as JSON text so
that every row of a table has the same physical schema; token ids are typed lists.
"""

from __future__ import annotations

import re

import pyarrow as pa


class ContractError(ValueError):
    """A table that does not fit its contract; the message names the table, column and problem."""


# `count_verdict` of a reconstructed row: the provider's token counts against the rebuilt ids.
COUNT_VERIFIED = "count_verified"
REPLY_COUNT_MISMATCH = "reply_count_mismatch"
PROMPT_COUNT_MISMATCH = "prompt_count_mismatch"
UNCOUNTED = "uncounted"
COUNT_VERDICTS = (COUNT_VERIFIED, REPLY_COUNT_MISMATCH, PROMPT_COUNT_MISMATCH, UNCOUNTED)

# A turn of a conversation regenerated turn by turn: `<conversation id>#t<k>` (tasks/generate/turns.py).
TURN_ID = re.compile(r"#t\d+$")

TOKEN_IDS = pa.list_(pa.int32())
MASK = pa.list_(pa.int8())

LOGPROB_TOKEN = pa.struct(
    [
        ("token", pa.string()),
        # True bytes of the token (a token may be part of a multi-byte character).
        ("bytes", pa.binary()),
        ("logprob", pa.float32()),
    ]
)

SCHEMAS: dict[str, pa.Schema] = {
    # Prompt rows as loaded from a source, before any request.
    "prompts": pa.schema(
        [
            ("id", pa.string()),
            ("source", pa.string()),
            ("messages", pa.string()),  # JSON: OpenAI chat messages ending with a user/tool turn
            ("tools", pa.string()),  # JSON: OpenAI tool definitions, or null
        ]
    ),
    # One row per finished request (generate stage output).
    "generations": pa.schema(
        [
            ("id", pa.string()),
            ("source", pa.string()),
            ("messages", pa.string()),  # JSON: the prompt turns sent
            ("tools", pa.string()),  # JSON or null
            ("reasoning", pa.string()),  # generated reasoning text, null when the reply has none
            # "text" (verbatim), "summary" or "encrypted" (not what the model wrote), null when none
            ("reasoning_kind", pa.string()),
            ("content", pa.string()),
            ("tool_calls", pa.string()),  # JSON list of OpenAI tool calls, or null
            ("finish_reason", pa.string()),
            ("truncated", pa.bool_()),  # finish_reason == "length"
            # The provider's own counts (usage), with the target's tokenizer: evidence about the rebuilt ids.
            ("prompt_tokens", pa.int64()),
            ("completion_tokens", pa.int64()),
            ("reasoning_tokens", pa.int64()),  # usage.completion_tokens_details.reasoning_tokens, or null
            ("cached_tokens", pa.int64()),  # usage.prompt_tokens_details.cached_tokens, or null
            ("cost", pa.float64()),  # USD from usage.cost, null when not reported
            ("latency_s", pa.float64()),  # request sent -> reply received, for the attempt that answered
            # Of that, what the server reports (vLLM's per-request metrics): seconds queued for a batch slot, and
            # seconds from scheduled to last token. Null when the server does not report them (OpenRouter).
            ("server_queue_s", pa.float64()),
            ("server_s", pa.float64()),
            ("model", pa.string()),
            ("provider", pa.string()),
            ("prompt_token_ids", TOKEN_IDS),  # server ids (vLLM/SGLang), or null
            ("token_ids", TOKEN_IDS),  # server completion ids, or null
            ("logprob_tokens", pa.list_(LOGPROB_TOKEN)),  # or null
            ("template_kwargs", pa.string()),  # JSON: chat-template kwargs the prompt was rendered with, or null
            # Unix seconds the API created the reply (its `created`): the date templates such as gpt-oss's write
            # into the prompt, so reconstruct renders the prompt the target saw. Null when not reported.
            ("created", pa.int64()),
            # "target" (the target's reply, bought over the API) or "dataset" (a dataset's own reply, source
            # `replies: dataset`); null in tables written before the column, read as target.
            ("origin", pa.string()),
        ]
    ),
    # Rows a stage refused, with why; never passed on.
    "quarantine": pa.schema(
        [
            ("stage", pa.string()),
            ("id", pa.string()),
            ("source", pa.string()),
            ("reason", pa.string()),  # short machine-readable kind, counted per reason
            ("field", pa.string()),  # the offending field, or null
            ("detail", pa.string()),  # human-readable explanation
            ("location", pa.string()),  # file:line or similar, or null
        ]
    ),
    # Exact training ids per conversation (reconstruct stage output).
    "reconstructed": pa.schema(
        [
            ("id", pa.string()),
            ("source", pa.string()),
            ("input_ids", TOKEN_IDS),
            ("loss_mask", MASK),  # 1 on tokens the model generated, incl. its end-of-turn token
            ("num_tokens", pa.int32()),
            ("num_trained", pa.int32()),
            ("last_trained_id", pa.int32()),
            ("method", pa.string()),  # server_ids | logprobs | reencode
            ("round_trip", pa.bool_()),  # decode(input_ids) == rendered text
            ("finish_reason", pa.string()),
            ("prompt_text", pa.string()),  # the prompt turns as plain text, for dedup
            ("origin", pa.string()),  # target | dataset, as in `generations`
            # Rebuilt lengths beside the provider's counts mapped by its count convention to what those lengths should
            # be (null: not reported), and the verdict (tasks/reconstruct/counts.py).
            ("prompt_count", pa.int32()),
            ("reply_count", pa.int32()),  # end-of-turn token included on a finished reply
            ("reasoning_count", pa.int32()),  # reply tokens over the reasoning; null unless the provider counts it apart
            ("provider_prompt_count", pa.int32()),
            ("provider_reply_count", pa.int32()),
            ("provider_reasoning_count", pa.int32()),
            ("count_verdict", pa.string()),  # count_verified | reply_count_mismatch | prompt_count_mismatch | uncounted
            # Whitespace a provider dropped at a parser join: restored (the count settled it) | unsettled | null (not
            # tried: the row was on its count, or its ids came from the server) (tasks/reconstruct/whitespace.py).
            ("whitespace", pa.string()),
        ]
    ),
    # Per-row trust in the ids (validate stage output).
    "validation": pa.schema(
        [
            ("id", pa.string()),
            ("source", pa.string()),
            ("method", pa.string()),
            ("mode", pa.string()),  # "check" (rebuilt vs truth) or "simulate" (text API played)
            ("klass", pa.string()),  # exact | bpe_only | semantic | unverified
            ("first_divergence", pa.int32()),  # token index, null when exact/unverified
            ("truth_context", pa.string()),  # token strings around the divergence
            ("rebuilt_context", pa.string()),
            ("round_trip", pa.bool_()),
            # The provider's counts against these ids (null: not counted): the verdict, and each side's agreement.
            ("count_verdict", pa.string()),
            ("prompt_count_ok", pa.bool_()),
            ("reply_count_ok", pa.bool_()),
        ]
    ),
    # Training and eval rows (merge stage output).
    "merged": pa.schema(
        [
            ("id", pa.string()),
            ("source", pa.string()),
            ("split", pa.string()),  # train | eval
            ("input_ids", TOKEN_IDS),
            ("loss_mask", MASK),
            ("num_tokens", pa.int32()),
            ("num_trained", pa.int32()),  # tokens under the loss mask
            ("origin", pa.string()),  # target | dataset, as in `generations`
        ]
    ),
    # Where each merged row's hidden states live (extract stage output).
    "hidden_index": pa.schema(
        [
            ("id", pa.string()),
            ("split", pa.string()),
            ("shard", pa.string()),  # file name of the safetensors shard
            ("offset", pa.int64()),  # first token row in the shard
            ("length", pa.int32()),  # tokens (no padding stored)
            ("input_ids", TOKEN_IDS),
            ("loss_mask", MASK),
        ]
    ),
}


# The `reconstructed` table's token counts: ours, the provider's, and the verdict between them.
COUNT_COLUMNS = [
    "prompt_count",
    "reply_count",
    "reasoning_count",
    "provider_prompt_count",
    "provider_reply_count",
    "provider_reasoning_count",
    "count_verdict",
]
# Columns added after a table's first version: a file written before them reads with nulls there.
LATER_COLUMNS: dict[str, set[str]] = {
    "generations": {"reasoning_kind", "template_kwargs", "created", "origin", "reasoning_tokens", "cached_tokens"},
    "reconstructed": {"origin", *COUNT_COLUMNS, "whitespace"},
    "merged": {"origin"},
    "validation": {"count_verdict", "prompt_count_ok", "reply_count_ok"},
}


def schema(name: str) -> pa.Schema:
    try:
        return SCHEMAS[name]
    except KeyError:
        raise ContractError(f"unknown table {name!r}; known: {sorted(SCHEMAS)}") from None


def conform(name: str, table: pa.Table) -> pa.Table:
    """Return `table` cast to contract `name`, or raise naming the column and the problem."""
    want = schema(name)
    for later in sorted(LATER_COLUMNS.get(name, set()) - set(table.column_names)):
        table = table.append_column(later, pa.nulls(table.num_rows, want.field(later).type))
    have = set(table.column_names)
    missing = [f.name for f in want if f.name not in have]
    if missing:
        raise ContractError(f"table {name!r}: missing column(s) {missing}")
    extra = sorted(have - set(want.names))
    if extra:
        raise ContractError(f"table {name!r}: unexpected column(s) {extra}")
    columns = []
    for field in want:
        col = table.column(field.name)
        if not col.type.equals(field.type):
            try:
                col = col.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise ContractError(
                    f"table {name!r}: column {field.name!r} has type {col.type}, expected {field.type}: {e}"
                ) from None
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=want)


def to_table(name: str, rows: list[dict]) -> pa.Table:
    """Build a contract table from row dicts (missing nullable keys become null)."""
    want = schema(name)
    try:
        return pa.Table.from_pylist(rows, schema=want)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        for i, row in enumerate(rows):
            for field in want:
                try:
                    pa.array([row.get(field.name)], type=field.type)
                except (pa.ArrowInvalid, pa.ArrowTypeError) as cell_error:
                    raise ContractError(
                        f"table {name!r}: row {i} (id={row.get('id')!r}) column {field.name!r}: "
                        f"expected {field.type}, got {row.get(field.name)!r:.80}: {cell_error}"
                    ) from None
        raise ContractError(f"table {name!r}: {e}") from None


class RowError(ValueError):
    """A row a stage refuses: `reason` is the short kind counted in quarantine, `field` the culprit."""

    def __init__(self, reason: str, field: str | None, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.field = field
        self.detail = detail


def quarantine_row(
    stage: str,
    row_id: str | None,
    source: str | None,
    reason: str,
    detail: str,
    field: str | None = None,
    location: str | None = None,
) -> dict:
    """A quarantine record; `reason` is a short kind counted in reports, `detail` says what was expected."""
    return {
        "stage": stage,
        "id": row_id,
        "source": source,
        "reason": reason,
        "field": field,
        "detail": detail,
        "location": location,
    }
