"""A tiny canned chat-completions server for tests and benchmarks: fixed latency, injected faults.

It speaks just enough HTTP/1.1 (keep-alive, Content-Length bodies) on raw asyncio transports to
cost well under a millisecond of CPU per request, so client measurements are not the server's.
A prompt can order faults for its first attempts: a last user turn containing `fault=429,500`
gets a 429, then a 500, then the canned reply. Requests are counted per last user turn.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections import Counter
from collections.abc import Callable

FAULT_RE = re.compile(r"fault=([a-z0-9_,]+)")
STATUS_TEXT = {
    200: "OK",
    400: "Bad Request",
    402: "Payment Required",
    404: "Not Found",
    408: "Request Timeout",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


def canned_reply(request: dict) -> dict:
    """An OpenRouter-shaped reply echoing a short answer, with its cost but no token counts: canned text is not the
    target's, so counts would be made up (rows are `uncounted`, as from a provider that reports none)."""
    return {
        "id": "gen-canned",
        "object": "chat.completion",
        "model": request.get("model", "canned"),
        "provider": "canned",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "A canned reply.", "reasoning": None},
            }
        ],
        "usage": {"cost": 0.0001},
    }


def _response(status: int, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    head = [
        f"HTTP/1.1 {status} {STATUS_TEXT.get(status, 'Error')}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    ]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class CannedProtocol(asyncio.Protocol):
    """One connection: parse requests, answer each after the server's latency (or fault)."""

    def __init__(self, server: CannedServer):
        self.server = server
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1")
            match = re.search(r"(?im)^content-length:\s*(\d+)", head)
            length = int(match.group(1)) if match else 0
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4 : head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length :]
            self.server.handle(self.transport, head, body)


class CannedServer:
    """Serve canned replies on 127.0.0.1 after `latency_s`; `reply` may be replaced per test."""

    def __init__(self, latency_s: float = 0.0, reply: Callable[[dict], dict] = canned_reply, hang_s: float = 30.0):
        self.latency_s = latency_s
        self.reply = reply
        self.hang_s = hang_s
        self.requests: Counter[str] = Counter()  # per last user turn
        self.headers_seen: list[str] = []
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def handle(self, transport: asyncio.Transport, head: str, body: bytes) -> None:
        loop = asyncio.get_running_loop()
        if not head.split(" ", 2)[1].endswith("/chat/completions"):
            transport.write(_response(200, b'{"object":"list","data":[{"id":"canned"}]}'))
            return
        request = json.loads(body)
        last = request["messages"][-1].get("content") or ""
        self.requests[last] += 1
        match = FAULT_RE.search(last)
        plan = match.group(1).split(",") if match else []
        attempt = self.requests[last]
        fault = plan[attempt - 1] if attempt <= len(plan) else None
        auth = re.search(r"(?im)^authorization:\s*(.*)$", head)
        self.headers_seen.append(auth.group(1).strip() if auth else "")
        if fault == "echo401":  # a careless server that echoes the caller's credentials
            body = json.dumps({"error": {"code": 401, "message": f"bad key; you sent {head}"}}).encode()
            transport.write(_response(401, body))
            return
        if fault == "timeout":
            loop.call_later(self.hang_s, transport.close)
            return
        loop.call_later(self.latency_s, self._answer, transport, fault, request)

    def _answer(self, transport: asyncio.Transport, fault: str | None, request: dict) -> None:
        if transport.is_closing():
            return
        if fault is None:
            transport.write(_response(200, json.dumps(self.reply(request)).encode()))
        elif fault == "reset":
            transport.abort()
        elif fault == "malformed":
            transport.write(_response(200, b'{"choices": [{"message": '))
        elif fault == "truncated":
            body = json.dumps(self.reply(request)).encode()
            transport.write(_response(200, body)[: -len(body) // 2])
            transport.close()
        elif fault == "empty":
            transport.write(_response(200, json.dumps({"choices": [], "usage": {}}).encode()))
        elif fault == "error200":  # OpenRouter: the provider failed after the 200 status was sent
            body = {"error": {"code": 502, "message": "provider returned error"}, "choices": []}
            transport.write(_response(200, json.dumps(body).encode()))
        elif fault == "midstream":  # the generation broke off: partial text, finish_reason "error"
            reply = self.reply(request)
            reply["choices"][0]["finish_reason"] = "error"
            reply["choices"][0]["message"]["content"] = "A can"
            reply["error"] = {"code": 502, "message": "upstream disconnected mid-generation"}
            transport.write(_response(200, json.dumps(reply).encode()))
        elif fault == "403balance":  # Moonshot's API: an empty balance is a 403, not a 402
            body = {"error": {"message": "Your account is suspended due to insufficient balance", "type": "exceeded"}}
            transport.write(_response(403, json.dumps(body).encode()))
        elif fault == "429ra":
            transport.write(_response(429, b'{"error":{"message":"slow down"}}', {"Retry-After": "1"}))
        elif fault.isdigit():
            body = json.dumps({"error": {"code": int(fault), "message": f"injected {fault}"}}).encode()
            transport.write(_response(int(fault), body))
        else:
            raise ValueError(f"unknown fault {fault!r}")

    async def start_async(self, port: int = 0) -> None:
        self._loop = asyncio.get_running_loop()
        self._server = await self._loop.create_server(lambda: CannedProtocol(self), "127.0.0.1", port, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]

    def start(self) -> CannedServer:
        """Run on a background thread (tests); returns once listening."""
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            loop.run_until_complete(self.start_async())
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None and self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
            self._loop.call_soon_threadsafe(self._loop.stop)


def serve_forever(port: int, latency_s: float) -> None:
    """Run a canned server in this process until killed (the benchmark's server process)."""

    async def main() -> None:
        server = CannedServer(latency_s)
        await server.start_async(port)
        print(server.port, flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
