"""The embedded target server: the configured target behind an OpenAI-compatible chat endpoint.

Replies take OpenRouter's shape (reasoning, content and tool_calls split by the target's chat format
as serving engines split them, finish_reason, usage with cost 0) and, when asked, vLLM's
(`prompt_token_ids`, `choices[].token_ids` incl. the end-of-turn id, logprobs with true bytes), and always
vLLM's per-request `metrics` (time queued for a batch slot, to first token, generating).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tasks.config import RunConfig
from tasks.target_model.chat import chat_format_of, template_messages
from tasks.target_model.serve.engine import BatchEngine, GenRequest, GenResult
from tasks.target_model.tokens import codec

log = logging.getLogger(__name__)


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
        self.chat_format = chat_format_of(tokenizer, config.target)
        self.tokens = codec(tokenizer)

    def render(self, body: dict) -> tuple[str, list[int]]:
        text = self.tokenizer.apply_chat_template(
            template_messages(body["messages"]),
            tools=body.get("tools") or None,
            add_generation_prompt=True,
            tokenize=False,
            **(body.get("chat_template_kwargs") or {}),
        )
        return text, self.tokens.encode(text)

    async def complete(self, body: dict) -> tuple[int, dict]:
        """(HTTP status, JSON body) for one chat-completions request."""
        try:
            prompt, prompt_ids = self.render(body)
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
        return 200, self.shape(body, prompt, prompt_ids, result)

    def shape(self, body: dict, prompt: str, prompt_ids: list[int], result: GenResult) -> dict:
        ids = result.token_ids
        ended = bool(ids) and ids[-1] in self.engine.stop_ids
        text = self.tokens.decode(ids[:-1] if ended else ids)
        for s in stop_strings(body):
            if s in text:  # as OpenAI: the stop string itself is not returned
                text = text[: text.index(s)]
        reply = self.chat_format.parse(text, prompt)
        calls = [{**c.as_openai(), "id": c.id or f"call_{i}"} for i, c in enumerate(reply.tool_calls)]
        finish = "tool_calls" if calls and result.finish_reason == "stop" else result.finish_reason
        message = {"role": "assistant", "content": reply.content, "reasoning": reply.reasoning}
        if calls:
            message["tool_calls"] = calls
        choice = {"index": 0, "finish_reason": finish, "message": message}
        if body.get("return_token_ids"):
            choice["token_ids"] = ids
        if result.logprobs is not None:
            entries = zip(ids, result.logprobs, strict=True)
            choice["logprobs"] = {"content": [self.logprob_entry(t, lp, top) for t, (lp, top) in entries]}
        data = {
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
            data["prompt_token_ids"] = prompt_ids
        if result.timing is not None:
            data["metrics"] = result.timing.metrics(len(ids))
        return data

    def bytes_entry(self, token_id: int, logprob: float) -> dict:
        raw = self.tokens.bytes_of(token_id)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}

    def logprob_entry(self, token_id: int, logprob: float, top: list[tuple[int, float]]) -> dict:
        entry = self.bytes_entry(token_id, logprob)
        entry["top_logprobs"] = [self.bytes_entry(i, lp) for i, lp in top]
        return entry


def build_app(config: RunConfig, threads: int = 1, max_batch: int = 16, dtype: str = "auto"):
    """Load the target and return the FastAPI app serving it."""
    import torch

    from tasks.target_model.chat import resolve_end_of_turn
    from tasks.target_model.loader import load_model, load_tokenizer, resolve_dtype

    torch.set_num_threads(threads)
    tokenizer = load_tokenizer(config.target)
    model = load_model(config.target, dtype=resolve_dtype(dtype), device="cpu")
    stop_ids = {tokenizer.eos_token_id}
    eos = getattr(model.generation_config, "eos_token_id", None)
    stop_ids |= set(eos if isinstance(eos, list) else [eos])
    stop_ids |= set(resolve_end_of_turn(tokenizer, config.target).ids)
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
