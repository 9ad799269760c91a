"""The embedded target server: the configured target behind an OpenAI-compatible chat endpoint.

Replies take OpenRouter's shape (content, reasoning split at the template's markers, tool_calls
parsed from its tool-call syntax, finish_reason, usage with cost 0) and, when asked, vLLM's
(`prompt_token_ids`, `choices[].token_ids` incl. the end-of-turn id, logprobs with true bytes).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
import uuid
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tasks.config import RunConfig
from tasks.generate.engine import BatchEngine, GenRequest, GenResult

log = logging.getLogger(__name__)
TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def byte_decoder() -> dict[str, int]:
    """Inverse of the GPT-2 byte-level alphabet: each printable stand-in char -> its byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class TokenBytes:
    """True UTF-8 bytes of each token id (a piece of a multi-byte character gets its partial bytes)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        decoder = json.loads(tokenizer.backend_tokenizer.to_str()).get("decoder") or {}
        kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", [])}
        self.byte_level = "ByteLevel" in kinds
        self.table = byte_decoder()
        self.special = {t.content for t in tokenizer.added_tokens_decoder.values()}
        self._cache: dict[int, bytes] = {}

    def __call__(self, token_id: int) -> bytes:
        if token_id in self._cache:
            return self._cache[token_id]
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if piece in self.special:
            raw = piece.encode("utf-8")
        elif self.byte_level:
            raw = bytes(self.table[c] for c in piece)
        elif re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", piece):
            raw = bytes([int(piece[3:5], 16)])
        else:
            raw = piece.replace("▁", " ").encode("utf-8")
        self._cache[token_id] = raw
        return raw


@dataclass
class TemplateMarkers:
    """Reasoning and tool-call syntax the chat template uses, found in its source."""

    think: tuple[str, str] | None
    tool_calls: bool

    @classmethod
    def of(cls, tokenizer) -> TemplateMarkers:
        template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
        think = ("<think>", "</think>") if "</think>" in template else None
        return cls(think, "<tool_call>" in template)


def shape_message(text: str, markers: TemplateMarkers) -> tuple[str | None, str, list[dict] | None]:
    """Split generated text into (reasoning, content, tool_calls) at the template's markers."""
    reasoning = None
    if markers.think and markers.think[1] in text:
        head, _, text = text.partition(markers.think[1])
        reasoning = head.replace(markers.think[0], "", 1).strip("\n")
        text = text.lstrip("\n")
    calls = None
    if markers.tool_calls and "<tool_call>" in text:
        calls = []
        for i, blob in enumerate(TOOL_CALL_RE.findall(text)):
            try:
                call = json.loads(blob)
                name, args = call["name"], call.get("arguments", {})
            except (ValueError, KeyError, TypeError):
                continue  # not a well-formed call: left in the content as the model wrote it
            calls.append(
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
                }
            )
        if calls:
            text = TOOL_CALL_RE.sub("", text).strip()
        calls = calls or None
    return reasoning, text, calls


def stop_strings(body: dict) -> list[str]:
    stop = body.get("stop") or []
    return [stop] if isinstance(stop, str) else [str(s) for s in stop]


def settle(future: asyncio.Future, result: GenResult) -> None:
    if not future.done():  # a batch that fails after answering a row must not answer it twice
        future.set_result(result)


class TargetServer:
    """Render, queue to the batch engine, and shape the reply."""

    def __init__(self, config: RunConfig, engine: BatchEngine, tokenizer):
        self.model_name = config.target.model
        self.engine = engine
        self.tokenizer = tokenizer
        self.markers = TemplateMarkers.of(tokenizer)
        self.token_bytes = TokenBytes(tokenizer)

    def render(self, body: dict) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            body["messages"],
            tools=body.get("tools") or None,
            add_generation_prompt=True,
            tokenize=False,
            **(body.get("chat_template_kwargs") or {}),
        )
        return self.tokenizer.encode(text, add_special_tokens=False)

    async def complete(self, body: dict) -> tuple[int, dict]:
        """(HTTP status, JSON body) for one chat-completions request."""
        try:
            prompt_ids = self.render(body)
        except Exception as e:  # a template that cannot render these messages is the caller's error
            return 400, {"error": {"code": 400, "message": f"cannot render messages: {type(e).__name__}: {e}"}}
        room = self.engine.max_context - len(prompt_ids)
        if room < 1:
            return 400, {
                "error": {"code": 400, "message": f"prompt has {len(prompt_ids)} tokens, context is {self.engine.max_context}"}
            }
        loop = asyncio.get_running_loop()
        future: asyncio.Future[GenResult] = loop.create_future()
        try:
            request = GenRequest(
                prompt_ids=prompt_ids,
                max_tokens=min(int(body.get("max_tokens") or body.get("max_completion_tokens") or 256), room),
                temperature=float(1.0 if body.get("temperature") is None else body["temperature"]),
                top_p=float(1.0 if body.get("top_p") is None else body["top_p"]),
                seed=None if body.get("seed") is None else int(body["seed"]),
                stop=stop_strings(body),
                logprobs=bool(body.get("logprobs")),
                top_logprobs=int(body.get("top_logprobs") or 0),
                on_done=lambda result: loop.call_soon_threadsafe(settle, future, result),
            )
        except (TypeError, ValueError) as e:
            return 400, {"error": {"code": 400, "message": f"bad sampling option: {e}"}}
        self.engine.submit(request)
        result = await future
        if result.error:
            return 500, {"error": {"code": 500, "message": result.error}}
        return 200, self.shape(body, prompt_ids, result)

    def shape(self, body: dict, prompt_ids: list[int], result: GenResult) -> dict:
        ids = result.token_ids
        ended = bool(ids) and ids[-1] in self.engine.stop_ids
        text = self.tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=True)
        for s in stop_strings(body):
            if s in text:  # as OpenAI: the stop string itself is not returned
                text = text[: text.index(s)]
        reasoning, content, calls = shape_message(text, self.markers)
        finish = "tool_calls" if calls and result.finish_reason == "stop" else result.finish_reason
        message = {"role": "assistant", "content": content, "reasoning": reasoning}
        if calls:
            message["tool_calls"] = calls
        choice = {"index": 0, "finish_reason": finish, "message": message}
        if body.get("return_token_ids"):
            choice["token_ids"] = ids
        if result.logprobs is not None:
            entries = zip(ids, result.logprobs, strict=True)
            choice["logprobs"] = {"content": [self.logprob_entry(t, lp, top) for t, (lp, top) in entries]}
        reply = {
            "id": f"gen-{uuid.uuid4().hex[:16]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "provider": "embedded",
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(ids),
                "total_tokens": len(prompt_ids) + len(ids),
                "cost": 0.0,
            },
        }
        if body.get("return_token_ids"):
            reply["prompt_token_ids"] = prompt_ids
        return reply

    def logprob_entry(self, token_id: int, logprob: float, top: list[tuple[int, float]]) -> dict:
        raw = self.token_bytes(token_id)
        entry = {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}
        entry["top_logprobs"] = [
            {"token": self.token_bytes(i).decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(self.token_bytes(i))}
            for i, lp in top
        ]
        return entry


def resolve_dtype(name: str) -> str:
    """`auto`: bf16 only where the CPU computes it natively (emulated bf16 is slower than fp32)."""
    if name != "auto":
        return name
    try:
        flags = open("/proc/cpuinfo", encoding="utf-8").read()
    except OSError:
        return "float32"
    return "bfloat16" if re.search(r"\b(avx512_bf16|amx_bf16)\b", flags) else "float32"


def build_app(config: RunConfig, threads: int = 1, max_batch: int = 16, dtype: str = "auto"):
    """Load the target and return the FastAPI app serving it."""
    import torch

    from tasks.target.loader import load_model, load_tokenizer

    torch.set_num_threads(threads)
    tokenizer = load_tokenizer(config.target)
    model = load_model(config.target, dtype=resolve_dtype(dtype), device="cpu")
    stop_ids = {tokenizer.eos_token_id}
    eos = getattr(model.generation_config, "eos_token_id", None)
    stop_ids |= set(eos if isinstance(eos, list) else [eos])
    if config.target.end_of_turn:
        stop_ids.add(tokenizer.convert_tokens_to_ids(config.target.end_of_turn))
    stop_ids.discard(None)
    server = TargetServer(config, BatchEngine(model, tokenizer, stop_ids, max_batch), tokenizer)
    app = FastAPI(title="draftsmith embedded target")

    @app.get("/health")
    async def health() -> dict:
        return {"ok": True, "pid": os.getpid(), "batches": server.engine.batches, "rows": server.engine.batched_rows}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": server.model_name, "object": "model", "owned_by": "draftsmith"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        try:
            body = await request.json()
            if not isinstance(body.get("messages"), list):
                raise ValueError("messages must be a list")
        except ValueError as e:
            return JSONResponse({"error": {"code": 400, "message": f"bad request body: {e}"}}, status_code=400)
        status, reply = await server.complete(body)
        return JSONResponse(reply, status_code=status)

    return app


def serve(config: RunConfig, port: int, threads: int = 1, max_batch: int = 16, dtype: str = "auto") -> None:
    """Serve on 127.0.0.1:`port` until SIGTERM."""
    import uvicorn

    app = build_app(config, threads, max_batch, dtype)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
