"""Hierarchy view port: the trace units (turns, windows, episodes) with text and provenance.

The query service hydrates every piece of evidence from here, so this is where "every piece
of evidence points back to the raw event" is kept true.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from schemas.ports.views import Boundary, ChangeSet, Positions, TurnRow, ViewStore
from schemas.units import TraceUnit, UnitKind


@dataclass
class UnitChangeSet(ChangeSet):
    upsert_units: list[TraceUnit] = field(default_factory=list)
    delete_units: list[str] = field(default_factory=list)

    def is_empty(self) -> bool:
        return super().is_empty() and not (self.upsert_units or self.delete_units)


class UnitStore(ViewStore, Protocol):
    def apply(self, change: UnitChangeSet, positions: Positions) -> None:
        """Apply atomically with the positions. A forget removes every unit of the scope."""
        ...

    def get_units(self, tenant_id: str, unit_ids: list[str]) -> dict[str, TraceUnit]:
        """Units by id; ids of another tenant or unknown ids are simply absent."""
        ...

    def list_units(self, boundary: Boundary, kind: UnitKind) -> list[TraceUnit]:
        """All units of a kind inside the boundary, in (session order, turn order)."""
        ...

    def session_unit_ids(self, tenant_id: str, conversation_id: str, session_id: str) -> set[str]: ...

    # The bounded query path's reads (services/query/candidates.py): each costs in proportion to
    # what it is asked for, never to the boundary's size.
    def units_by_keys(self, tenant_id: str, keys: list[int]) -> dict[int, TraceUnit]:
        """Units by their key (schemas.units.unit_key, what the lexical and dense views answer
        with); keys of another tenant or unknown keys are absent."""
        ...

    def containing(self, tenant_id: str, turn_ids: list[str]) -> dict[str, list[str]]:
        """Per turn id: the ids of the windows and episodes that hold it (sorted)."""
        ...

    def speakers(self, boundary: Boundary) -> list[str]:
        """The distinct speakers of the boundary's conversations (tenant and conversations only), sorted."""
        ...

    def size(self, boundary: Boundary) -> int:
        """How many turns the boundary's conversations hold (tenant and conversations only)."""
        ...

    def latest(self, boundary: Boundary) -> datetime | None:
        """The latest `occurred_at` of a turn in the boundary's conversations and sessions (None: no turn)."""
        ...

    def session_starts(self, tenant_id: str, sessions: list[tuple[str, str]]) -> dict[tuple[str, str], datetime]:
        """(conversation, session) -> the earliest `occurred_at` of its turns (the session order of schemas/ordering.py)."""
        ...

    # Turns as the API lists them (GET /v1/turns…). A turn is *superseded* when another turn of
    # its conversation names its event id in `supersedes` (a correction): searches leave it out,
    # its history keeps it.
    def superseded(self, boundary: Boundary) -> set[str]:
        """Turn ids of the boundary's turns (tenant, conversations, sessions) that a correction supersedes."""
        ...

    def page_turns(self, boundary: Boundary, after: tuple[int, str] | None, limit: int, *,
                   include_superseded: bool = False) -> list[TurnRow]:
        """Up to `limit` of the boundary's turns (tenant, conversations, sessions, agents) ordered by
        (occurred_at, turn_id), strictly after `after` = (occurred_at in microseconds since the
        epoch, turn_id): a stable cursor while turns are added."""
        ...

    def turns_by_event(self, tenant_id: str, event_id: str, conversation_id: str | None = None) -> list[TurnRow]:
        """The tenant's turns with this event id (one per conversation that used it)."""
        ...

    def corrections(self, tenant_id: str, conversation_id: str, event_id: str) -> list[TurnRow]:
        """The turns that supersede `event_id` in its conversation, in turn order."""
        ...
