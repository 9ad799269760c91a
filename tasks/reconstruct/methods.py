"""The three ways to get a row's training ids: server ids, logprob bytes, or one-pass re-encoding."""

from __future__ import annotations

from dataclasses import dataclass
from os.path import commonprefix

import numpy as np

from tasks.reconstruct.render import ChatTurn, RenderedTurn, RowError
from tasks.target_model.tokens import ByteVocab, EndOfTurn, codec


@dataclass
class Rebuilt:
    """Training ids of one conversation and how they were obtained."""

    input_ids: np.ndarray  # (T,) int32
    loss_mask: np.ndarray  # (T,) int8
    method: str
    round_trip: bool


def completion_ids(token_ids: list[int], end_of_turn: EndOfTurn, truncated: bool) -> list[int]:
    """Server completion ids closed by the end-of-turn token (some servers leave it out of the list)."""
    ids = list(token_ids)
    if not truncated and (not ids or ids[-1] not in end_of_turn.ids):
        ids.append(end_of_turn.id)
    return ids


def truth_ids(row: dict, end_of_turn: EndOfTurn) -> list[int] | None:
    """Ground-truth ids of a generations row (prompt + completion), or None when the server gave none."""
    if row.get("prompt_token_ids") is None or row.get("token_ids") is None:
        return None
    truncated = row.get("finish_reason") == "length"
    return list(row["prompt_token_ids"]) + completion_ids(row["token_ids"], end_of_turn, truncated)


def _check_decode(
    tokenizer, turn: ChatTurn, rendered: RenderedTurn, prompt: list[int], completion: list[int], field: str
) -> None:
    """Raise unless the prompt ids decode to the rendered prompt and the completion ids to the stored reply."""
    tokens = codec(tokenizer)
    got_prompt = tokens.decode(prompt)
    if got_prompt != rendered.text[: rendered.gen_start]:
        raise RowError(
            "ids_text_mismatch",
            "prompt_token_ids",
            f"row {turn.id!r}: prompt ids decode to text that differs from the rendered prompt "
            f"at char {len(commonprefix([got_prompt, rendered.text[: rendered.gen_start]]))}",
        )
    want = rendered.text[rendered.gen_start : rendered.gen_end]
    got = tokens.decode(completion, reply=not tokens.ends_in_special(prompt))
    if got != want:
        at = len(commonprefix([got, want]))
        raise RowError(
            "ids_text_mismatch",
            field,
            f"row {turn.id!r}: {field} decode to {got[max(0, at - 20) : at + 20]!r} where the stored reply "
            f"renders {want[max(0, at - 20) : at + 20]!r} (char {at})",
        )


def _assemble(prompt: list[int], completion: list[int], method: str) -> Rebuilt:
    ids = np.asarray(prompt + completion, dtype=np.int32)
    mask = np.zeros(len(ids), dtype=np.int8)
    mask[len(prompt) :] = 1
    return Rebuilt(ids, mask, method, True)


def from_server_ids(tokenizer, row: dict, turn: ChatTurn, rendered: RenderedTurn, end_of_turn: EndOfTurn) -> Rebuilt:
    """Use the server's prompt and completion ids as they are, once they decode to the stored text."""
    prompt = list(row["prompt_token_ids"])
    completion = completion_ids(row["token_ids"], end_of_turn, turn.truncated)
    _check_decode(tokenizer, turn, rendered, prompt, completion, "token_ids")
    return _assemble(prompt, completion, "server_ids")


def from_logprobs(
    tokenizer, vocab: ByteVocab, row: dict, turn: ChatTurn, rendered: RenderedTurn, end_of_turn: EndOfTurn
) -> Rebuilt:
    """Map each logprob entry's true bytes to its id; the prompt is the server's ids or the rendered prompt encoded."""
    completion = []
    for i, entry in enumerate(row["logprob_tokens"]):
        token_id = vocab.lookup(entry.get("token"), entry.get("bytes"))
        if token_id is None:
            raise RowError(
                "logprob_unmapped",
                "logprob_tokens",
                f"row {turn.id!r}: logprob_tokens[{i}] {entry.get('token')!r} has no id in the vocabulary",
            )
        completion.append(token_id)
    completion = completion_ids(completion, end_of_turn, turn.truncated)
    if row.get("prompt_token_ids") is not None:
        prompt = list(row["prompt_token_ids"])
    else:  # the server encodes the rendered prompt on its own, so one pass over it is what it saw
        prompt = codec(tokenizer).encode(rendered.text[: rendered.gen_start])
    _check_decode(tokenizer, turn, rendered, prompt, completion, "logprob_tokens")
    return _assemble(prompt, completion, "logprobs")


def reencode(tokenizer, rendered: list[RenderedTurn]) -> list[Rebuilt]:
    """Encode each prompt and each generated turn in one pass apiece, as a server sees them.

    A server encodes the rendered prompt and the model generates after its last id, so the seam between
    them is a token boundary; within the turn, one pass keeps BPE whole (gluing pieces would not).
    """
    if not rendered:
        return []
    tokens = codec(tokenizer)
    prompts = tokens.encode_batch([r.text[: r.gen_start] for r in rendered])
    if tokens.dummy_prefix:  # SentencePiece: the reply's first run continues the prompt's
        replies = [
            tokens.encode_reply(r.text[r.gen_start : r.gen_end], tokens.ends_in_special(p))
            for p, r in zip(prompts, rendered, strict=True)
        ]
    else:
        replies = tokens.encode_batch([r.text[r.gen_start : r.gen_end] for r in rendered])
    out = []
    for prompt, reply, r in zip(prompts, replies, rendered, strict=True):
        ids = np.asarray(prompt + reply, dtype=np.int32)
        mask = np.zeros(len(ids), dtype=np.int8)
        mask[len(prompt) :] = 1
        out.append(Rebuilt(ids, mask, "reencode", tokens.round_trips(ids, r.text[: r.gen_end])))
    return out
