"""Errors: one root (`MemstreamError`), one class per HTTP status the API answers with its error
shape `{"error": {"code", "message", "details", "request_id"}}`, and `InvalidRequest` for what the
client refuses before sending."""

from __future__ import annotations

from typing import Any, Iterable

_MAX_DETAILS = 5  # field errors named in str(exc); `details` keeps all of them
_MAX_DETAIL_CHARS = 400


class MemstreamError(Exception):
    """Anything the client reports. `status` is the HTTP status (None for a transport failure or
    a request refused before sending), `code` the API's error code, `details` its per-item or
    per-field details, `request_id` the id to quote when asking an operator (it is in the
    server's log). `str()` names the first few fields the details blame."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None,
                 details: list[Any] | None = None, request_id: str | None = None, body: Any = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.details = details or []
        self.request_id = request_id
        self.body = body

    def __str__(self) -> str:
        why = describe(self.details)
        where = f" [{self.status} {self.code}]" if self.status else ""
        rid = f" (request id {self.request_id})" if self.request_id else ""
        return f"{self.message}{': ' + why if why else ''}{where}{rid}"


class TransportError(MemstreamError):
    """The server could not be reached, or the connection broke (after the retries)."""


class BadRequest(MemstreamError):
    """400/422: the request or an event is invalid; `details` says which field and why."""


class InvalidRequest(BadRequest, ValueError):
    """Refused by the client before sending: an argument or a turn the API would refuse.
    `details` has the API's shape ({"loc", "msg", "type"}); `status` is None."""


class AuthenticationError(MemstreamError):
    """401: no key, or a key the server does not know (revoked, mistyped)."""


class PermissionDenied(MemstreamError):
    """403: the key may not do this (another tenant, a role too low)."""


class NotFound(MemstreamError):
    """404."""


class Conflict(MemstreamError):
    """409: e.g. a forgotten event id published again (refused forever)."""


class PayloadTooLarge(MemstreamError):
    """413: split the batch."""


class RateLimited(MemstreamError):
    """429 after the retries: the key's rate limit; `retry_after` seconds."""

    retry_after: float | None = None


class Unavailable(MemstreamError):
    """503 after the retries: a store or the log is down; `retry_after` seconds."""

    retry_after: float | None = None


class WaitTimeout(MemstreamError):
    """`wait`: the views did not reach the positions within its timeout (the server answers
    `caught_up: false`; servers before 0.2 answered 504)."""


_BY_STATUS: dict[int, type[MemstreamError]] = {
    400: BadRequest, 401: AuthenticationError, 403: PermissionDenied, 404: NotFound, 409: Conflict,
    413: PayloadTooLarge, 422: BadRequest, 429: RateLimited, 503: Unavailable, 504: WaitTimeout}


def from_response(status: int, body: Any, retry_after: float | None = None) -> MemstreamError:
    """The error for an HTTP error response (any body: the API's error shape, or something a
    proxy in between answered)."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        message, code = str(error.get("message") or f"HTTP {status}"), error.get("code")
        details, request_id = error.get("details") or [], error.get("request_id")
    else:
        message, code, details, request_id = f"HTTP {status}: {str(body)[:300]}", None, [], None
    cls = _BY_STATUS.get(status, MemstreamError)
    exc = cls(message, status=status, code=code, details=details if isinstance(details, list) else [details],
              request_id=request_id, body=body)
    if isinstance(exc, (RateLimited, Unavailable)):
        exc.retry_after = retry_after
    return exc


def location(loc: Iterable[Any]) -> str:
    """`["body", "turns", 0, "text"]` as `body.turns[0].text`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def describe(details: list[Any]) -> str:
    """The first few field errors of `details`, bounded: `body.max_turns: Input should be …`.
    Details are field errors ({"loc", "msg"}) or a publish's items ({"index", "errors": […]})."""
    parts: list[str] = []
    for d in details:
        if not isinstance(d, dict):
            continue
        if isinstance(d.get("errors"), list) and "index" in d:  # one item of a publish
            parts += [f"item {d['index']}: {_field(e)}" for e in d["errors"] if isinstance(e, dict)]
        elif "msg" in d:
            parts.append(_field(d))
    if not parts:
        return ""
    more = len(parts) - _MAX_DETAILS
    text = "; ".join(parts[:_MAX_DETAILS]) + (f" (and {more} more)" if more > 0 else "")
    return text if len(text) <= _MAX_DETAIL_CHARS else text[: _MAX_DETAIL_CHARS - 1] + "…"


def _field(error: dict[str, Any]) -> str:
    where = location(error.get("loc") or [])
    return f"{where}: {error.get('msg')}" if where else str(error.get("msg"))
