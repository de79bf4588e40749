"""What the API's answers look like in its OpenAPI document: the one error shape, and which
error statuses each operation can give.

services/api.py adds the statuses every operation of a kind can give (the edge guard's 400, 413
and 415 on a body; 401, 403 and 429 behind a key; 403 for a foreign origin on a state-changing
method; 422 for a request that does not match; 503 for a store that is away); a route declares
its own on top (`errors(404, 409)`). A status an operation can give and its document does not
name is a defect (tests/e2e/test_api_fuzz.py)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class ErrorInfo(BaseModel):
    code: str = Field(description="Stable, machine-readable: e.g. invalid_request, not_found, rate_limited.")
    message: str = Field(description="What went wrong and what to do, for a person.")
    details: list[dict[str, Any]] = Field(description="Per field (`loc`, `msg`, `type`) or, for a batch, per item.")
    request_id: str = Field(description="The request's X-Request-Id: the server log names it.")


class ErrorResponse(BaseModel):
    error: ErrorInfo


DESCRIPTIONS = {
    400: "The body is not valid UTF-8 JSON memstream accepts (depth, size of numbers), or a cursor this API did not give out",
    401: "Missing or unknown key",
    403: "The key may not do this (role, tenant), or a state-changing request from a foreign origin",
    404: "What the request names does not exist",
    409: "What the request names is in a state that does not allow it",
    413: "The body, or the batch, is larger than the limit",
    415: "The body is not JSON (application/json; JSON Lines where stated)",
    422: "The request does not match this document: `details` names each field and the rule",
    429: "Over the key's rate limit, or the views are too far behind to take more (Retry-After)",
    503: "A store or the event log is unavailable right now; retry (Retry-After)",
    504: "Not reached within the timeout",
}


def errors(*statuses: int, **descriptions: str) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries for error statuses, in the one error shape. `descriptions` override
    the default wording per status, keyed `_404` etc."""
    return {s: {"model": ErrorResponse, "description": descriptions.get(f"_{s}", DESCRIPTIONS[s])} for s in statuses}
