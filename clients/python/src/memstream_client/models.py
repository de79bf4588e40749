"""Typed results (pydantic), and the turn a caller adds.

Result models accept fields a newer server adds (`extra="allow"`), so an old client keeps
working against a new server."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Positions = dict[int, int]
"""partition -> offset: what `wait` takes. Keys are ints (JSON sends them as strings)."""


class _Result(BaseModel):
    model_config = ConfigDict(extra="allow")


# -- adding ------------------------------------------------------------------------------------
class Attachment(BaseModel):
    kind: str = "image_caption"
    text: str


class Turn(BaseModel):
    """One turn to add. Only `conversation_id`, `speaker` and `text` are needed: the event id is
    made here (a random UUID: the idempotency key of every retry), `occurred_at` is now, the
    session is `default`, the agent is the speaker, and `tenant_id` the key's tenant."""

    model_config = ConfigDict(extra="forbid")

    conversation_id: str
    text: str
    speaker: str = "user"
    session_id: str = "default"
    agent_id: str | None = None
    role: Literal["user", "assistant", "agent", "tool", "system"] = "user"
    event_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    turn_index: int = 0
    occurred_at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))
    tenant_id: str | None = None
    attachments: list[Attachment] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    source_ref: str | None = None
    supersedes: str | None = Field(None, description="Event id of a turn of the same session this one corrects.")

    def event(self) -> dict[str, Any]:
        """The TurnRecorded event the API takes."""
        out = self.model_dump(mode="json", exclude_none=True)
        out["type"] = "TurnRecorded"
        out.setdefault("agent_id", _agent_of(self.speaker))
        if not self.attachments:
            out.pop("attachments", None)
        if not self.metadata:
            out.pop("metadata", None)
        return out


def _agent_of(speaker: str) -> str:
    """An agent id from a speaker name (ids are letters, digits and `._:@-`)."""
    cleaned = "".join(c if c.isalnum() or c in "._:@-" else "-" for c in speaker.strip())[:200].strip("-")
    return cleaned or "agent"


class ItemResult(_Result):
    index: int
    status: Literal["accepted", "rejected", "failed"]
    code: int
    event_id: str | None = None
    partition: int | None = None
    offset: int | None = None
    errors: list[dict[str, Any]] = Field(default_factory=list)


class AddResult(_Result):
    """What a publish did: every item's fate and the positions to `wait` on."""

    accepted: int
    rejected: int
    positions: Positions
    items: list[ItemResult]


# -- searching ---------------------------------------------------------------------------------
class TurnRef(_Result):
    turn_id: str
    text: str
    event_id: str
    source_ref: str | None = None
    speaker: str
    session_id: str
    occurred_at: datetime
    partition: int
    offset: int


class Evidence(_Result):
    rank: int
    unit_id: str
    kind: str
    role: str = Field(description="Why the unit is in the evidence: primary (among the k best fused units), bridge "
                                  "(closure: shares entities with them), neighbour (a turn next to one) or fill (the "
                                  "ranking's next units, up to max_turns).")
    score: float = Field(0.0, description="The score the strategy ranked the unit by (higher first); comparable within "
                                          "one result only.")
    text: str
    conversation_id: str
    session_id: str
    occurred_from: datetime
    occurred_to: datetime
    turns: list[TurnRef]
    scores: dict[str, float] = Field(default_factory=dict)


class SearchResult(_Result):
    strategy: str
    route: str | None = None
    profile: dict[str, Any] = Field(default_factory=dict)
    evidence: list[Evidence]
    budget_turns: int
    backends: dict[str, str] = Field(default_factory=dict)
    timings_ms: dict[str, float] = Field(default_factory=dict)
    llm_tokens: int = 0
    notes: list[str] = Field(default_factory=list)


class AnswerResult(SearchResult):
    answer: str
    reader_answer: str
    calibration: dict[str, Any] = Field(default_factory=dict)
    reader_model: str
    reader_usage: dict[str, int] = Field(default_factory=dict)


# -- forgetting, status, turns -----------------------------------------------------------------
class ForgetResult(_Result):
    forget_id: str
    tenant_id: str
    scope: dict[str, Any]
    positions: Positions
    status: str


class ViewStatus(_Result):
    view: str
    backend: str
    lag_events: int
    lag_seconds: float
    paused: bool = False


class Status(_Result):
    views: list[ViewStatus]
    auth: dict[str, Any] = Field(default_factory=dict)

    @property
    def caught_up(self) -> bool:
        return all(v.lag_events == 0 for v in self.views)


class StoredTurn(_Result):
    """A turn as the log holds it (GET /v1/turns…): the event, where it is in the log, and the
    corrections that supersede it."""

    event_id: str
    tenant_id: str
    conversation_id: str
    session_id: str
    agent_id: str
    speaker: str
    role: str
    text: str
    occurred_at: datetime
    turn_index: int = 0
    attachments: list[dict[str, Any]] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    source_ref: str | None = None
    supersedes: str | None = None
    superseded_by: list[str] = Field(default_factory=list)
    partition: int
    offset: int


class TurnPage(_Result):
    turns: list[StoredTurn]
    next_cursor: str | None = None


class TurnHistory(_Result):
    """A turn and its corrections, oldest first."""

    event_id: str
    versions: list[StoredTurn]
