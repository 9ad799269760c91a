"""Async chat-completions client: OpenAI wire format, retries that honour Retry-After, lean per request.

`complete(prompt)` returns one journal record: status "done" (a reply), "failed" (retryable or
permanent, with the error kind), or "stopped" (no credits: a 402, or a 403 that says so, as Moonshot's API answers an
empty balance; the run must stop).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import random
import re
import time
import zlib

import httpx

from tasks.config import ApiConfig, RequestConfig, TokenPrice

RETRYABLE_STATUS = {408, 409, 425, 429}
ERROR_BODY_CHARS = 500
# A 403 that is about money, not access: Moonshot's API answers an empty balance with 403, not 402.
CREDITS = re.compile(r"balance|credit|billing|insufficient funds|payment", re.IGNORECASE)
TOKEN_OPTIONS = ("vllm", "sglang", "embedded")
BEARER_RE = re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?(?:bearer\s+)?|bearer\s+)[^\s'\",}]+")


def redact(text: str, secret: str | None) -> str:
    """Remove the key and any Authorization value from text that may reach a file or log."""
    if secret:
        text = text.replace(secret, "***")
    return BEARER_RE.sub(r"\1***", text)


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta seconds or an HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def request_seed(seed: int | None, row_id: str) -> int | None:
    """A fixed seed per request id, so a rerun of one id samples the same way where servers honour it."""
    return None if seed is None else (seed + zlib.crc32(row_id.encode("utf-8"))) % (2**31)


def static_body(api: ApiConfig, request: RequestConfig, model: str) -> dict:
    """Body fields shared by every request; provider-specific options only where the server reads them."""
    body = {"model": model, "temperature": request.temperature, "top_p": request.top_p, "max_tokens": request.max_tokens}
    if request.stop:
        body["stop"] = request.stop
    if api.provider == "openrouter":
        body["usage"] = {"include": True}
        if request.reasoning is not None:
            body["reasoning"] = request.reasoning
        if request.provider_routing is not None:
            body["provider"] = request.provider_routing
    if api.provider in ("vllm", "sglang"):
        # Their detokenizers otherwise join a tokenizer's added tokens with spaces, so text after one (a reply's
        # first token after Kimi's <think>, the content after </think>) gains a space its ids do not hold
        # (vllm-project/vllm#33457).
        body["spaces_between_special_tokens"] = False
    if api.provider in TOKEN_OPTIONS:
        if request.return_token_ids:
            body["return_token_ids"] = True
        if request.chat_template_kwargs is not None:
            body["chat_template_kwargs"] = request.chat_template_kwargs
    if request.logprobs:
        body["logprobs"] = True
        if request.top_logprobs is not None:
            body["top_logprobs"] = request.top_logprobs
    body.update(request.extra_body)
    return body


def reply_reasoning(message: dict) -> tuple[str | None, str | None]:
    """(reasoning text, kind): only `reasoning.text` details are what the model generated.

    OpenRouter's `reasoning_details` may instead carry a summary or an encrypted blob; those are kept
    as their kind with no text, so reconstruct refuses the row rather than train on a paraphrase.
    """
    details = [d for d in message.get("reasoning_details") or [] if isinstance(d, dict)]
    texts = [d.get("text") or "" for d in details if d.get("type") == "reasoning.text"]
    if texts:
        return "".join(texts), "text"
    if details:
        kinds = {d.get("type") for d in details}
        return None, "encrypted" if "reasoning.encrypted" in kinds else "summary"
    reasoning = message.get("reasoning")
    if reasoning is None:
        reasoning = message.get("reasoning_content")
    return reasoning, "text" if reasoning is not None else None


def server_timing(data: dict) -> tuple[float | None, float | None]:
    """(seconds queued, seconds computing) as the server reports them in vLLM's per-request `metrics`
    (vLLM with `--enable-per-request-metrics`, the embedded server); (None, None) where it does not."""
    metrics = data.get("metrics")
    if not isinstance(metrics, dict):
        return None, None
    ms = [metrics.get(k) for k in ("queue_time_ms", "time_to_first_token_ms", "generation_time_ms")]
    queue, first, rest = (v / 1000 if isinstance(v, int | float) else None for v in ms)
    return queue, None if first is None or rest is None else first + rest


def message_fields(prompt: dict, message: dict) -> dict:
    """The prompt's and the assistant message's fields of a `generations` row."""
    reasoning, reasoning_kind = reply_reasoning(message)
    calls = message.get("tool_calls")
    return {
        "id": prompt["id"],
        "source": prompt["source"],
        "messages": prompt["messages"],
        "tools": prompt["tools"],
        "reasoning": reasoning,
        "reasoning_kind": reasoning_kind,
        "content": message.get("content"),
        "tool_calls": json.dumps(calls, ensure_ascii=False) if calls else None,
    }


def priced(usage: dict, price: TokenPrice | None) -> float | None:
    """The reply's cost: the provider's `usage.cost`, else its tokens at `price` (None without either)."""
    if usage.get("cost") is not None or price is None:
        return usage.get("cost")
    return ((usage.get("prompt_tokens") or 0) * price.input + (usage.get("completion_tokens") or 0) * price.output) / 1e6


def reply_record(
    prompt: dict,
    data: dict,
    latency_s: float,
    provider: str,
    template_kwargs: dict | None = None,
    price: TokenPrice | None = None,
) -> dict:
    """Journal record of a reply, in the `generations` contract's fields (bytes as int lists)."""
    choice = data["choices"][0]
    usage = data.get("usage") or {}
    logprobs = (choice.get("logprobs") or {}).get("content")
    finish = choice.get("finish_reason")
    queue_s, server_s = server_timing(data)
    return message_fields(prompt, choice.get("message") or {}) | {
        "status": "done",
        "finish_reason": finish,
        "truncated": finish == "length",
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "reasoning_tokens": (usage.get("completion_tokens_details") or {}).get("reasoning_tokens"),
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
        "cost": priced(usage, price),
        "latency_s": round(latency_s, 4),
        "server_queue_s": None if queue_s is None else round(queue_s, 4),
        "server_s": None if server_s is None else round(server_s, 4),
        "model": data.get("model"),
        "provider": data.get("provider") or provider,
        "prompt_token_ids": data.get("prompt_token_ids"),
        "token_ids": choice.get("token_ids"),
        "logprob_tokens": [{"token": e.get("token"), "bytes": e.get("bytes"), "logprob": e.get("logprob")} for e in logprobs]
        if logprobs
        else None,
        "template_kwargs": json.dumps(template_kwargs, sort_keys=True) if template_kwargs else None,
        "created": data["created"] if isinstance(data.get("created"), int) else None,
        "origin": "target",
    }


def dataset_record(prompt: dict) -> dict:
    """A `generations` row from a dataset's own reply (source `replies: dataset`): no request, origin dataset."""
    message = prompt["reply"]
    return message_fields(prompt, message) | {
        "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
        "truncated": False,
        "provider": "dataset",
        "origin": "dataset",
    }


class ChatClient:
    """One pooled HTTP client for a run; `complete` is safe to call from many coroutines."""

    def __init__(
        self,
        api: ApiConfig,
        request: RequestConfig,
        model: str,
        api_key: str | None,
        base_url: str,
        price: TokenPrice | None = None,
    ):
        self.api = api
        self.price = price  # what a reply costs where the server reports no usage.cost
        self.seed = request.seed
        # Recorded on every row: reconstruct renders the prompt with the same kwargs (thinking on/off).
        self.template_kwargs = request.chat_template_kwargs
        self.provider = api.provider
        self._secret = api_key
        self._url = base_url.rstrip("/") + "/chat/completions"
        # The shared fields are serialised once; each request splices in its own messages and tools.
        self._head = json.dumps(static_body(api, request, model), ensure_ascii=False)[:-1].encode("utf-8")
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = httpx.Timeout(api.timeout_s, connect=min(api.timeout_s, 30.0))
        self._ssl = httpx.create_ssl_context() if self._url.startswith("https") else False
        # One single-connection client per request in flight: httpx scans its whole pool for every
        # request, which at 64+ connections costs more CPU than the request itself.
        self._lanes: list[httpx.AsyncClient] = []
        self._free: list[httpx.AsyncClient] = []

    def _lane(self) -> httpx.AsyncClient:
        if self._free:
            return self._free.pop()
        lane = httpx.AsyncClient(
            headers=self._headers,
            timeout=self._timeout,
            verify=self._ssl,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        )
        self._lanes.append(lane)
        return lane

    def body(self, prompt: dict) -> bytes:
        parts = [self._head, b',"messages":', prompt["messages"].encode("utf-8")]
        if prompt.get("tools"):
            parts += [b',"tools":', prompt["tools"].encode("utf-8")]
        seed = request_seed(self.seed, prompt["id"])
        if seed is not None:
            parts.append(b',"seed":%d' % seed)
        parts.append(b"}")
        return b"".join(parts)

    def backoff(self, attempt: int, retry_after: float | None) -> float:
        """Full-jitter exponential backoff; a server's Retry-After wins, both capped."""
        if retry_after is not None:
            return min(self.api.backoff_max_s, retry_after + random.uniform(0, self.api.backoff_base_s / 10))
        return random.uniform(0, min(self.api.backoff_max_s, self.api.backoff_base_s * 2**attempt))

    def failure(self, prompt: dict, kind: str, detail: str, retryable: bool, attempts: int, status: int | None = None) -> dict:
        return {
            "status": "failed",
            "id": prompt["id"],
            "source": prompt["source"],
            "kind": kind,
            "retryable": retryable,
            "http_status": status,
            "attempts": attempts,
            "detail": redact(detail, self._secret)[:ERROR_BODY_CHARS],
        }

    async def post(self, body: bytes) -> tuple[httpx.Response | None, str, str]:
        """One attempt: the response, or None with the transport error's kind and detail."""
        lane = self._lane()
        try:
            return await lane.post(self._url, content=body), "", ""
        except httpx.TimeoutException as e:
            return None, "timeout", f"{type(e).__name__} after {self.api.timeout_s:g}s"
        except httpx.TransportError as e:
            return None, "connection", f"{type(e).__name__}: {e}"
        finally:
            self._free.append(lane)

    async def complete(self, prompt: dict) -> dict:
        # The loop is written out, not tenacity/stamina: an attempt's outcome is a reply (often inside a 200),
        # a stop (402), a permanent or a retryable failure, and the last one becomes the journal record.
        body = self.body(prompt)
        kind, detail, status = "", "", None
        for attempt in range(self.api.max_retries + 1):
            retry_after = None
            started = time.perf_counter()
            response, kind, detail = await self.post(body)
            status = None if response is None else response.status_code
            if status == 200:
                try:
                    data = json.loads(response.content)
                except ValueError as e:
                    data, kind, detail = None, "malformed_json", f"reply is not JSON: {e}"
                error = data.get("error") if isinstance(data, dict) else None
                choices = data.get("choices") if isinstance(data, dict) else None
                broken_off = bool(choices) and (
                    error is not None or any(c.get("finish_reason") == "error" for c in choices if isinstance(c, dict))
                )
                if choices and not broken_off:
                    seconds = time.perf_counter() - started
                    return reply_record(prompt, data, seconds, self.provider, self.template_kwargs, self.price)
                if broken_off:  # a generation cut by a provider error mid-stream: partial text, retry it
                    kind, detail = "midstream_error", f"reply broken off by an error: {response.text}"
                if isinstance(error, dict) and isinstance(error.get("code"), int) and not broken_off:
                    status = error["code"]  # OpenRouter reports some failures inside a 200
                elif data is not None and not broken_off:
                    kind, detail = "empty_choices", f"reply has no choices: {response.text}"
            if status == 402 or (status == 403 and CREDITS.search(response.text)):
                return {
                    "status": "stopped",
                    "id": prompt["id"],
                    "kind": "out_of_credits",
                    "detail": redact(response.text, self._secret)[:ERROR_BODY_CHARS],
                }
            if status is not None and status != 200:
                kind, detail = f"http_{status}", response.text
                if status not in RETRYABLE_STATUS and status < 500:
                    return self.failure(prompt, kind, detail, False, attempt + 1, status)
                retry_after = parse_retry_after(response.headers.get("retry-after"))
            if attempt < self.api.max_retries:
                await asyncio.sleep(self.backoff(attempt, retry_after))
        return self.failure(prompt, kind, detail, True, self.api.max_retries + 1, status)

    async def aclose(self) -> None:
        for lane in self._lanes:
            await lane.aclose()
        self._lanes.clear()
        self._free.clear()


def has_reply(record: dict) -> bool:
    """Content, tool calls, or reasoning text the model generated (a thinking reply cut by max_tokens has only
    that, and its tokens are the target's as much as any)."""
    reasoning = record.get("reasoning") if record.get("reasoning_kind") == "text" else None
    return bool((record.get("content") or "").strip() or record.get("tool_calls") or (reasoning or "").strip())
