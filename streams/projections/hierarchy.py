"""Hierarchy projection: turns, windows and episodes with provenance (the unit store)."""

from __future__ import annotations

from schemas.ports.unit_store import UnitChangeSet, UnitStore
from schemas.ports.views import TurnRow
from streams.projections.base import Projection, SessionKey
from schemas.units import HierarchyPolicy
from streams.segmentation import diff_units, session_units


class HierarchyProjection(Projection[UnitChangeSet]):
    name = "hierarchy"

    def __init__(self, store: UnitStore, policy: HierarchyPolicy):
        super().__init__(store)
        self.policy = policy

    def new_change(self) -> UnitChangeSet:
        return UnitChangeSet()

    def session_change(self, change: UnitChangeSet, key: SessionKey, before: list[TurnRow], after: list[TurnRow], added: list[TurnRow]) -> None:
        upserts, deletes = diff_units(session_units(before, self.policy), session_units(after, self.policy))
        change.upsert_units.extend(upserts)
        change.delete_units.extend(deletes)
