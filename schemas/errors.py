"""One exception hierarchy for the whole distribution.

Adapters translate driver errors into these. `TransientError` means "retry with back-off";
anything else raised while processing a record is permanent for that record and sends it to
the dead-letter topic. Messages say what the operator should do.
"""

from __future__ import annotations


class MemstreamError(Exception):
    """Root of every error memstream raises on purpose. `errors`: the details an API error body
    carries, per field ({"loc": [...], "msg": str, "type": str}) or per item of a batch."""

    code = "memstream_error"
    http_status = 500

    def __init__(self, message: str = "", errors: list[dict] | None = None):
        super().__init__(message)
        self.errors = errors or []


class ConfigurationError(MemstreamError):
    """Bad or missing configuration (unknown URL scheme, missing model files, …)."""

    code = "configuration_error"
    http_status = 500


class InvalidEvent(MemstreamError):
    """A record could not be decoded or validated as an event.

    `errors` holds pydantic-style field errors: [{"loc": [...], "msg": str, "type": str}].
    """

    code = "invalid_event"
    http_status = 422


class BadRequest(MemstreamError):
    code = "bad_request"
    http_status = 400


class NotFound(MemstreamError):
    code = "not_found"
    http_status = 404


class TransientError(MemstreamError):
    """The backend is temporarily unavailable; the caller should retry with back-off."""

    code = "transient_error"
    http_status = 503


class LogUnavailable(TransientError):
    """The event log took nothing of a publish: retry it (event ids make a retry harmless)."""

    code = "unavailable"


class LogError(MemstreamError):
    code = "event_log_error"


class StoreError(MemstreamError):
    code = "store_error"


class CredentialsRefused(StoreError):
    """A store refused memstream's credentials: the operator's to fix, so queries do not fall back
    past it as they do past an outage (a wrong password must not hide behind degraded answers)."""

    code = "credentials_refused"


class FormatTooNew(ConfigurationError):
    """A file written by a newer release (infra/formats.py): refused, never rewritten."""

    code = "format_too_new"


class FormatTooOld(StoreError):
    """A view generation in a format this release no longer reads: the pipeline rebuilds it from the log."""

    code = "format_too_old"


class ReaderError(MemstreamError):
    """The optional final-QA reader (an OpenAI-compatible endpoint) failed."""

    code = "reader_error"
    http_status = 502


class Unauthorized(MemstreamError):
    """No key, or a key memstream does not know (the same answer whatever the request names)."""

    code = "unauthorized"
    http_status = 401


class Forbidden(MemstreamError):
    """A known key whose role or tenant does not allow the request."""

    code = "forbidden"
    http_status = 403


class RateLimited(MemstreamError):
    code = "rate_limited"
    http_status = 429

    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = retry_after


class UnsupportedMediaType(MemstreamError):
    code = "unsupported_media_type"
    http_status = 415


class PayloadTooLarge(MemstreamError):
    code = "too_large"
    http_status = 413


class InvalidRequest(MemstreamError):
    """A well-formed request that names something that cannot be (e.g. a partition the topic lacks)."""

    code = "invalid_request"
    http_status = 422


class InvalidCursor(BadRequest):
    """A listing's cursor that this API did not give out (forged, truncated, from another listing)."""

    code = "invalid_cursor"


class Conflict(MemstreamError):
    """The request is well formed, but the thing it names is in a state that does not allow it
    (e.g. rotating a revoked key)."""

    code = "conflict"
    http_status = 409


class Forgotten(Conflict):
    """Every event of a publish was forgotten before: a forgotten event id is refused forever."""

    code = "forgotten"


class Timeout(MemstreamError):
    """What the request waits for did not happen within its timeout (POST /v1/wait)."""

    code = "timeout"
    http_status = 504


class Ambiguous(MemstreamError):
    """The request names something several things match (e.g. an event id used in two conversations)."""

    code = "ambiguous"
    http_status = 409


class ViewUnavailable(TransientError):
    """A view's store cannot be read right now (its server is down or refusing): queries fall back
    to a strategy without it where one exists, else answer 503 naming it."""

    code = "view_unavailable"
    http_status = 503

    def __init__(self, view: str, reason: str):
        super().__init__(f"the {view} view is unavailable: {reason}")
        self.view = view
        self.reason = reason
