"""Derived trace units (turn, window, episode) and the ids every view agrees on.

A unit never replaces source text: its `text` is composed from the raw turns, and its
provenance names the events and log positions it came from. Ids are deterministic functions
of the log, so replaying the log reproduces them and upserts make reprocessing harmless.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

UnitKind = Literal["turn", "window", "episode"]
UNIT_KINDS: tuple[UnitKind, ...] = ("turn", "window", "episode")


@dataclass(frozen=True)
class HierarchyPolicy:
    """How a session is cut into windows and episodes (streams/segmentation.py)."""

    window_sizes: tuple[int, ...] = (3, 5)  # one window level per size
    window_stride: int = 1
    episode_block: int = 6
    episode_min_turns: int = 6
    episode_min_similarity: float = 0.08
    episode_max_gap: timedelta = timedelta(hours=2)


def _digest(*parts: str) -> str:
    h = hashlib.blake2b(digest_size=10)
    for p in parts:
        h.update(p.encode("utf-8"))
        h.update(b"\x1f")
    return h.hexdigest()


def turn_unit_id(tenant_id: str, conversation_id: str, event_id: str) -> str:
    return "t_" + _digest("turn", tenant_id, conversation_id, event_id)


def window_unit_id(tenant_id: str, conversation_id: str, session_id: str, size: int, start: int) -> str:
    """Windows are named by their level (size) and first turn's position, so an open window
    keeps its id as it grows."""
    return "w_" + _digest("window", tenant_id, conversation_id, session_id, str(size), str(start))


def episode_unit_id(tenant_id: str, conversation_id: str, session_id: str, index: int) -> str:
    return "e_" + _digest("episode", tenant_id, conversation_id, session_id, str(index))


def entity_id(tenant_id: str, normalized_name: str) -> str:
    """Entities are merged by exact normalised name across the tenant's conversations."""
    return "n_" + _digest("entity", tenant_id, normalized_name)


def sentence_id(turn_id: str, index: int) -> str:
    return f"{turn_id}.s{index}"


@functools.lru_cache(maxsize=1 << 18)
def unit_key(unit_id: str) -> int:
    """A non-negative 63-bit integer for a unit/sentence id. Search engines keep it as a numeric
    column so that ranking all of a boundary's units needs no stored-document fetches; callers
    map keys back to the ids they know (the boundary's units). Memoised: the query side hashes a
    conversation's ids again whenever its version moves (every batch while it is written)."""
    return int.from_bytes(hashlib.blake2b(unit_id.encode("utf-8"), digest_size=8).digest(), "big") >> 1


def tenant_digest(tenant_id: str) -> str:
    """The tenant's part of per-tenant index names (32 hex digits); changing it would orphan existing indexes."""
    return hashlib.sha256(tenant_id.encode()).hexdigest()[:32]


class LogPosition(BaseModel):
    model_config = ConfigDict(frozen=True)
    partition: int
    offset: int


class Provenance(BaseModel):
    """Where a unit comes from. `turn_start`/`turn_end` are positions in the session's turn order."""

    model_config = ConfigDict(frozen=True)
    tenant_id: str
    conversation_id: str
    session_id: str
    turn_start: int
    turn_end: int
    event_ids: tuple[str, ...]
    log_positions: tuple[LogPosition, ...]
    agent_ids: tuple[str, ...]
    speakers: tuple[str, ...]
    source_refs: tuple[str, ...] = ()
    occurred_from: datetime
    occurred_to: datetime


class TraceUnit(BaseModel):
    model_config = ConfigDict(frozen=True)
    unit_id: str
    kind: UnitKind
    level: int | None = Field(default=None, description="For windows: the window size (turns) of their level.")
    text: str = Field(description="Composed from the raw turns; windows and episodes prefix each turn with its speaker.")
    provenance: Provenance
    turn_ids: tuple[str, ...] = Field(description="Member turn unit ids in session order.")
