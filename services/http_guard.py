"""The HTTP edge: what every request goes through before a handler sees it.

One ASGI middleware, because each check needs the raw request and must answer in the API's one
error shape before any handler (or FastAPI's own body parsing) runs:

- **Request ids.** Every response carries `X-Request-Id` (the caller's, when it sends a sane
  one; else a new one); error bodies name it, so a 500 can be found in the log without the
  body carrying internals.
- **Body size, while reading.** The body is read in chunks and refused with 413 as soon as it
  passes the route's limit (`MEMSTREAM_API_MAX_BODY_BYTES` for /v1/events, the smaller
  `MEMSTREAM_API_MAX_REQUEST_BYTES` elsewhere): a large chunked body costs at most the limit.
- **Content types.** A body must be JSON (`application/json`, `…+json`) or, on /v1/events,
  JSON Lines (`application/x-ndjson`, `application/jsonl`): 415 otherwise. A page in another
  origin cannot send a JSON body without a CORS preflight, so this alone stops cross-site
  "simple" POSTs (`text/plain`, forms) from publishing or forgetting anything.
- **Origins.** A state-changing request whose `Origin` is neither the server's own nor one of
  `MEMSTREAM_API_CORS_ORIGINS` gets 403. CORS stays closed unless origins are configured.
- **JSON that parses safely.** Valid UTF-8 and the JSON rules of schemas/safejson.py (depth at
  most 64, integers at most 40 digits, finite numbers, no lone surrogates), the same rules the
  projections apply to records on the log: 400 with the reason otherwise. Handlers then parse
  bodies known to be safe.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from typing import Any, Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from schemas.safejson import MAX_DEPTH, MAX_INT_DIGITS, UnsafeJSON, loads  # noqa: F401 - the edge's JSON rules are the log's

log = logging.getLogger(__name__)

JSON_TYPES = ("application/json",)
NDJSON_TYPES = ("application/x-ndjson", "application/jsonl", "application/json-lines")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_UNSAFE = {"POST", "PUT", "PATCH", "DELETE"}


def parse_body(raw: bytes, ndjson: bool) -> Any:
    """The body as JSON (a list of values for JSON Lines). Raises UnsafeJSON with the reason."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnsafeJSON(f"request body is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    if not ndjson:
        try:
            return loads(text)
        except json.JSONDecodeError as exc:
            raise UnsafeJSON(f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
                             " (send JSON Lines as application/x-ndjson)") from None
    items = []
    # JSON Lines are separated by "\n" alone: str.splitlines() would also split inside strings
    # that hold U+2028, U+0085 and the like, which JSON leaves unescaped.
    for n, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            try:
                items.append(loads(line))
            except json.JSONDecodeError as exc:
                raise UnsafeJSON(f"line {n} is not valid JSON: {exc.msg} at column {exc.colno}") from None
            except UnsafeJSON as exc:
                raise UnsafeJSON(f"line {n}: {exc}") from None
    return items


def media_type(headers: dict[str, str]) -> str:
    return headers.get("content-type", "").split(";")[0].strip().lower()


def is_json(media: str) -> bool:
    return media in JSON_TYPES or (media.startswith("application/") and media.endswith("+json"))


def error_body(code: str, message: str, details: list | None = None, request_id: str | None = None) -> dict:
    body: dict[str, Any] = {"error": {"code": code, "message": message, "details": details or []}}
    if request_id:
        body["error"]["request_id"] = request_id
    return body


class EdgeGuard:
    """ASGI middleware; see the module docstring. `body_limit(path)` gives a route's byte limit."""

    def __init__(self, app: ASGIApp, *, body_limit, ndjson_paths: Iterable[str], allowed_origins: Iterable[str] = ()):
        self.app = app
        self.body_limit = body_limit
        self.ndjson_paths = set(ndjson_paths)
        self.allowed_origins = {o.rstrip("/") for o in allowed_origins}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        given = headers.get("x-request-id", "")
        request_id = given if _REQUEST_ID.fullmatch(given) else secrets.token_hex(8)
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", request_id.encode())]}
            await send(message)

        async def refuse(status: int, code: str, message: str) -> None:
            body = json.dumps(error_body(code, message, request_id=request_id)).encode()
            await send_with_id({"type": "http.response.start", "status": status,
                                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
            await send_with_id({"type": "http.response.body", "body": body})

        method, path = scope["method"], scope["path"]
        origin = headers.get("origin")
        if method in _UNSAFE and origin and not self._origin_allowed(origin, scope, headers):
            await refuse(403, "forbidden", f"requests from origin {origin[:200]!r} are not accepted "
                                           "(set MEMSTREAM_API_CORS_ORIGINS to allow a web application's origin)")
            return
        limit = self.body_limit(path)
        declared = headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > limit:  # "²".isdigit() is True, int("²") fails
            await refuse(413, "too_large", f"request body is {declared} bytes; the limit for {path} is {limit}")
            return
        chunks, size = [], 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await refuse(413, "too_large", f"request body is larger than the limit for {path} ({limit} bytes)")
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        if raw:
            media = media_type(headers)
            ndjson = path in self.ndjson_paths and media in NDJSON_TYPES
            if not (is_json(media) or ndjson):
                accepted = "application/json" + (" or application/x-ndjson" if path in self.ndjson_paths else "")
                await refuse(415, "unsupported_media_type", f"Content-Type {media or '(none)'!r} is not accepted here; send {accepted}")
                return
            try:
                scope["state"]["json"] = parse_body(raw, ndjson)
            except UnsafeJSON as exc:
                await refuse(400, "bad_request", str(exc))
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        await self.app(scope, replay, send_with_id)

    def _origin_allowed(self, origin: str, scope: Scope, headers: dict[str, str]) -> bool:
        origin = origin.rstrip("/")
        if origin in self.allowed_origins or "*" in self.allowed_origins:
            return True
        scheme = "https" if scope.get("scheme") == "https" else "http"
        return origin == f"{scheme}://{headers.get('host', '')}"
