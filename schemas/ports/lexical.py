"""Lexical view port: BM25 over turns, windows and episodes.

`search` returns BM25 scores computed by the engine (tantivy embedded, OpenSearch at scale),
highest first, only for units inside the boundary. The statistics behind a score (document
count, term document frequencies, average length) are the boundary's tenant's own: no other
tenant's documents move it (the adapters keep an index per tenant). Query text is analysed by the engine
(English stemming); an empty or all-punctuation query returns []. Upserting a unit id replaces
its document.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

import numpy as np

from schemas.ports.views import Boundary, ChangeSet, Hit, Positions, ViewStore
from schemas.units import UnitKind


@dataclass(frozen=True)
class LexicalDoc:
    unit_id: str
    kind: UnitKind
    text: str
    tenant_id: str
    conversation_id: str
    session_id: str
    agent_ids: tuple[str, ...]
    occurred_from: datetime
    occurred_to: datetime


@dataclass
class LexicalChangeSet(ChangeSet):
    upsert_docs: list[LexicalDoc] = field(default_factory=list)
    delete_docs: list[str] = field(default_factory=list)

    def is_empty(self) -> bool:
        return super().is_empty() and not (self.upsert_docs or self.delete_docs)


class LexicalIndex(ViewStore, Protocol):
    def apply(self, change: LexicalChangeSet, positions: Positions) -> None: ...

    def search(self, kind: UnitKind, query: str, boundary: Boundary, k: int) -> list[Hit]: ...

    def score_units(self, kind: UnitKind | None, query: str, boundary: Boundary, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """The same ranking as `search`, as arrays: unit keys (schemas.units.unit_key, int64)
        and BM25 scores. The query side ranks whole boundaries with it. `kind=None` scores
        every unit kind in one search (term statistics are the tenant's, across kinds, so each
        unit's score is the one its own kind's search gives)."""
        ...

    def score_ids(self, kind: UnitKind | None, query: str, boundary: Boundary, unit_ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """`score_units` for the named units only: (keys, BM25 scores) of those of `unit_ids`
        (of `kind`, or of any kind for None) inside the boundary that match the query (the others
        score 0, and are absent). Each score is the one `score_units` gives the unit, whatever the
        kind asked: the bounded query path scores all its candidates with one call."""
        ...
