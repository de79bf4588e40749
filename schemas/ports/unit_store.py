"""Hierarchy view port: the trace units (turns, windows, episodes) with text and provenance.

The query service hydrates every piece of evidence from here, so this is where "every piece
of evidence points back to the raw event" is kept true.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from schemas.ports.views import Boundary, ChangeSet, Positions, ViewStore
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
