"""One exception hierarchy for the whole distribution.

Adapters translate driver errors into these. `TransientError` means "retry with back-off";
anything else raised while processing a record is permanent for that record and sends it to
the dead-letter topic. Messages say what the operator should do.
"""

from __future__ import annotations


class MemstreamError(Exception):
    """Root of every error memstream raises on purpose."""

    code = "memstream_error"
    http_status = 500


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

    def __init__(self, message: str, errors: list[dict] | None = None):
        super().__init__(message)
        self.errors = errors or []


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


class LogError(MemstreamError):
    code = "event_log_error"


class StoreError(MemstreamError):
    code = "store_error"


class ReaderError(MemstreamError):
    """The optional final-QA reader (an OpenAI-compatible endpoint) failed."""

    code = "reader_error"
    http_status = 502
