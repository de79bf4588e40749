"""The shapes of the API's successful answers, as the OpenAPI document states them (requests are
declared beside their routes). Models here describe what the handlers return; they do not
validate it again on the way out (`response_model` does that in FastAPI)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from schemas.events import Attachment
from schemas.security import Role


class Healthy(BaseModel):
    ok: Literal[True]


class SignedIn(BaseModel):
    signed_in: Literal[True]
    expires_in_seconds: int


class SignedOut(BaseModel):
    signed_in: Literal[False]


# -- keys -------------------------------------------------------------------------------------------
class KeyInfo(BaseModel):
    key_id: str
    tenant_id: str | None
    role: Role
    name: str
    created_at: str
    created_by: str
    rotated_at: str | None
    revoked_at: str | None
    previous_secret_valid_until: str | None
    active: bool


class KeyList(BaseModel):
    keys: list[KeyInfo]
    next_cursor: str | None


class KeyChange(KeyInfo):
    control_offset: int = Field(description="POST /v1/wait with it returns once every process enforces the change.")


class NewSecret(KeyChange):
    key: str = Field(description="The secret key: shown here once, stored nowhere.")


# -- turns ------------------------------------------------------------------------------------------
class StoredTurn(BaseModel):
    """A turn as it was published, where it is on the log, and the corrections of it."""

    event_id: str
    tenant_id: str
    agent_id: str
    conversation_id: str
    session_id: str
    turn_index: int
    speaker: str
    role: str
    text: str
    attachments: list[Attachment]
    occurred_at: datetime
    metadata: dict[str, str | int | float | bool | None]
    source_ref: str | None
    supersedes: str | None
    superseded_by: list[str]
    partition: int
    offset: int
    turn_id: str


class TurnPage(BaseModel):
    turns: list[StoredTurn]
    next_cursor: str | None


class TurnHistory(BaseModel):
    event_id: str
    versions: list[StoredTurn] = Field(description="The turn the corrections start from, then each correction, oldest first.")


# -- operations -------------------------------------------------------------------------------------
class ViewStatus(BaseModel):
    view: str
    backend: str
    lag_events: int
    lag_seconds: float
    paused: bool
    caught_up: bool | None = Field(None, description="Tenant keys: whether the view has processed everything.")
    generation: int | None = Field(None, description="Admin keys: the live generation.")
    positions: dict[int, int] | None = Field(None, description="Admin keys: partition -> the view's position.")
    end_offsets: dict[int, int] | None = Field(None, description="Admin keys: partition -> the log's end.")
    rebuilding: list[Any] | None = None
    partition_lag_seconds: dict[int, float] | None = None
    unavailable: str | None = None


class AuthInfo(BaseModel):
    mode: Literal["api-keys", "insecure-no-auth"]
    key_id: str
    role: Role
    tenant_id: str | None = Field(None, description="The key's tenant (none for an admin key).")


class Status(BaseModel):
    views: list[ViewStatus]
    auth: AuthInfo


class Projection(BaseModel):
    """One projection as the ops snapshot shows it."""

    name: str
    backend: str
    generation: int | None
    paused: bool
    status: str
    lag_events: int
    lag_seconds: float
    rate: float
    errors: int
    last_error: str | None
    rebuilding: list[Any]
    partitions: list[dict[str, Any]]


class Snapshot(BaseModel):
    time: float
    mode: str
    log_backend: str
    topic: str
    window_seconds: float
    projections: list[Projection]
    freshness: dict[str, Any]
    queries: dict[str, Any]
    dead_letters: dict[str, Any]
    forgetting: dict[str, Any]
    history: list[dict[str, Any]]
    auth_mode: Literal["api-keys", "insecure-no-auth"]


class DeadLetter(BaseModel):
    origin: str = Field(description="Where the record was: topic/partition/offset.")
    projections: list[str]
    reason: str
    errors: list[dict[str, Any]]
    replayed: bool
    truncated: bool
    value: str = Field(description="The record's bytes as text (invalid UTF-8 replaced).")


class DeadLetters(BaseModel):
    next_cursor: str | None
    dead_letters: list[DeadLetter]


class AuditPage(BaseModel):
    entries: list[dict[str, Any]] = Field(description="Oldest first; each names its `kind` (key, retention, projection, "
                                                      "export, forget), `control_offset` and `at`.")
    next_cursor: str | None


class WaitResult(BaseModel):
    caught_up: bool = Field(description="False: the timeout passed first (`reason` says what was missing); wait again.")
    reason: str | None = None
