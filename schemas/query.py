"""Search and answer: the query service's request and response contracts."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.rules import HAS_CONTENT, TENANT_PATTERN, Id, Integral, Time

STRATEGIES = (
    "zero-mem", "graph-only", "hierarchy-only", "no-closure", "no-calibration",
    "bm25", "dense", "hybrid-rrf", "raw-rag", "pyramid",
)
Strategy = Literal[
    "zero-mem", "graph-only", "hierarchy-only", "no-closure", "no-calibration",
    "bm25", "dense", "hybrid-rrf", "raw-rag", "pyramid",
]
MAX_K = 200
MAX_TURNS = 500
DEFAULT_MAX_TURNS = 25  # the one default of every surface (HTTP, MCP, the clients)
EvidenceRole = Literal["primary", "bridge", "neighbour", "fill"]


class SearchRequest(BaseModel):
    # strict: JSON types as they are (a number is no time, `true` no count); unknown fields refused
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    question: str = Field(min_length=1, max_length=4000, pattern=HAS_CONTENT, description="Not blank.")
    tenant_id: str = Field(pattern=TENANT_PATTERN)
    conversation_id: Id | None = None
    session_id: Id | None = None
    agent_id: Id | None = None
    since: Time | None = Field(default=None, description="Only turns that happened at or after this time.")
    until: Time | None = Field(default=None, description="Only turns that happened at or before this time (before `since`: "
                                                          "an empty range, no evidence).")
    as_of: Time | None = Field(default=None, description="The time relative expressions ('last week') refer to; default: the latest turn in the boundary.")
    strategy: Strategy = "zero-mem"
    k: Annotated[int, Integral] = Field(default=5, ge=1, le=MAX_K, description="How many of the best fused units seed the evidence as `primary` "
                   "(the method's M(q)) before closure and fill. It does not limit the results: `max_turns` does.")
    max_turns: Annotated[int, Integral] = Field(default=DEFAULT_MAX_TURNS, ge=1, le=MAX_TURNS,
                           description="The results' limit: evidence units are added in rank order until they hold this many "
                                       "distinct turns (the last unit may be cut).")



class TurnRef(BaseModel):
    turn_id: str
    text: str
    event_id: str
    source_ref: str | None
    speaker: str
    session_id: str
    occurred_at: datetime
    partition: int
    offset: int


class Evidence(BaseModel):
    rank: int
    unit_id: str
    kind: Literal["turn", "window", "episode", "span"]
    role: EvidenceRole = Field(description="Why the unit is in the evidence: `primary` (among the k best fused units), `bridge` "
                               "(added by closure: it shares entities with the primary units), `neighbour` (a turn next to one), "
                               "`fill` (the ranking's next units, filling the turn budget).")
    score: float = Field(description="The score the strategy ranked this unit by: higher ranks first. Comparable within one "
                         "response only (its scale depends on the strategy and the boundary); `scores` holds the signals.")
    text: str
    conversation_id: str
    session_id: str
    occurred_from: datetime
    occurred_to: datetime
    turns: list[TurnRef]
    scores: dict[str, float] = Field(default_factory=dict)


class SearchResponse(BaseModel):
    strategy: str
    route: str | None
    profile: dict[str, Any]
    evidence: list[Evidence]
    budget_turns: int
    backends: dict[str, str]
    timings_ms: dict[str, float]
    llm_tokens: int = 0
    notes: list[str] = Field(default_factory=list)


class AnswerResponse(SearchResponse):
    answer: str
    reader_answer: str
    calibration: dict[str, Any]
    reader_model: str
    reader_usage: dict[str, int]
