"""Run-time proof of "zero tokens outside the reader".

`CountingReader` is a local OpenAI-compatible chat-completions server that counts every request
and token it receives. With `upstream` set it forwards to a real endpoint (and counts the usage
that endpoint reports); without it, it answers deterministically with the first evidence line
(a stub for tests: it makes no claim about answer quality). The harness and the tests point
memstream's reader at it and read `llm_tokens` from its counter.

`refuse_outbound` makes every TCP connection from this process fail unless it goes to an
allowed (host, port) — the configured stores and the counting reader — so nothing can reach an
LLM (or anything else) behind the counter's back.
"""

from __future__ import annotations

import json
import socket
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator


@dataclass
class Counter:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {"requests": self.requests, "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                    "tokens": self.tokens}


def _approx_tokens(text: str) -> int:
    return max(1, len(text.split()))


class CountingReader:
    def __init__(self, upstream: str | None = None, upstream_key: str | None = None, host: str = "127.0.0.1", port: int = 0):
        self.counter = Counter()
        self.upstream = upstream.rstrip("/") if upstream else None
        self.upstream_key = upstream_key
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self.send_error(404)
                    return
                request = json.loads(body)
                answer, usage = outer._complete(request)
                with outer.counter.lock:
                    outer.counter.requests += 1
                    outer.counter.prompt_tokens += usage["prompt_tokens"]
                    outer.counter.completion_tokens += usage["completion_tokens"]
                payload = json.dumps({
                    "id": f"count-{outer.counter.requests}", "object": "chat.completion", "model": request.get("model", "counting"),
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
                    "usage": {**usage, "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]},
                }).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        return self._server.server_address[:2]

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}/v1"

    def _complete(self, request: dict) -> tuple[str, dict[str, int]]:
        prompt = "\n".join(str(m.get("content", "")) for m in request.get("messages", []))
        if self.upstream is None:
            evidence = [line for line in prompt.splitlines() if line.startswith("[") and "] " in line]
            answer = evidence[0].split("] ", 1)[1] if evidence else "unknown"
            return answer, {"prompt_tokens": _approx_tokens(prompt), "completion_tokens": _approx_tokens(answer)}
        import httpx  # the forwarding path: this process's only way to a real LLM

        headers = {"authorization": f"Bearer {self.upstream_key}"} if self.upstream_key else {}
        r = httpx.post(f"{self.upstream}/chat/completions", json=request, headers=headers, timeout=120)
        r.raise_for_status()
        data = r.json()
        usage = data.get("usage") or {}
        return data["choices"][0]["message"]["content"], {
            "prompt_tokens": int(usage.get("prompt_tokens", _approx_tokens(prompt))),
            "completion_tokens": int(usage.get("completion_tokens", 0)),
        }

    def start(self) -> "CountingReader":
        self._thread = threading.Thread(target=self._server.serve_forever, name="counting-reader", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class OutboundRefused(ConnectionRefusedError):
    pass


@contextmanager
def refuse_outbound(allowed: set[tuple[str, int]]) -> Iterator[list[tuple[str, int]]]:
    """Inside the block, TCP connections to anything but `allowed` raise OutboundRefused.
    Yields the list of refused attempts (so a test can assert there were none)."""
    refused: list[tuple[str, int]] = []
    original_connect, original_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def check(sock: socket.socket, address) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple):
            host, port = address[0], address[1]
            ok = (host, port) in allowed or (host in ("localhost", "127.0.0.1", "::1") and
                                             any(p == port and h in ("localhost", "127.0.0.1", "::1") for h, p in allowed))
            if not ok:
                refused.append((host, port))
                raise OutboundRefused(f"outbound connection to {host}:{port} refused: only the configured stores and the reader are allowed")

    def connect(self, address):
        check(self, address)
        return original_connect(self, address)

    def connect_ex(self, address):
        check(self, address)
        return original_connect_ex(self, address)

    socket.socket.connect, socket.socket.connect_ex = connect, connect_ex
    try:
        yield refused
    finally:
        socket.socket.connect, socket.socket.connect_ex = original_connect, original_connect_ex
