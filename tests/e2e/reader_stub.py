"""A stand-in for the one LLM call (the final-QA reader), for tests that need /v1/answer to run
end to end over HTTP without a model: an OpenAI-compatible chat-completions endpoint that answers
with the first evidence line it was given. Deterministic; no network beyond loopback.

Run it alone with `python -m tests.e2e.reader_stub PORT`."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - the stdlib's name
        length = int(self.headers.get("content-length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            prompt = str(body["messages"][-1]["content"])
        except (ValueError, KeyError, IndexError, TypeError):
            prompt = ""
        lines = [line for line in prompt.splitlines() if line.strip()]
        answer = (lines[1] if len(lines) > 1 else "unknown")[:200]
        data = json.dumps({"model": "reader-stub", "choices": [{"message": {"role": "assistant", "content": answer}}],
                           "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": len(answer.split())}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):  # quiet
        pass


class ReaderStub:
    """Serves on 127.0.0.1:`port` (0: a free one) in a daemon thread until `close()`."""

    def __init__(self, port: int = 0):
        self.server = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


if __name__ == "__main__":
    stub = ReaderStub(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    print(stub.url, flush=True)
    threading.Event().wait()
