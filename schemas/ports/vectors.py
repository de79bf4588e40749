"""Dense view port: vectors for turns, windows, episodes and sentences.

Vectors are L2-normalised float32; `search` scores are cosine similarities computed by the
engine (numpy embedded, Qdrant at scale), highest first, only inside the boundary. Point ids
are the unit/sentence ids, so upserts replace.

Turns also keep their *pooling state* (unnormalised mean token embedding and token count),
from which window and episode vectors are derived without re-encoding (see
streams/projections/dense.py for why).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol

import numpy as np

from schemas.ports.views import Boundary, ChangeSet, Hit, Positions, ViewStore

Collection = Literal["turn", "window", "episode", "sentence"]
COLLECTIONS: tuple[Collection, ...] = ("turn", "window", "episode", "sentence")


@dataclass(frozen=True)
class VectorPoint:
    collection: Collection
    point_id: str
    vector: np.ndarray
    tenant_id: str
    conversation_id: str
    session_id: str
    agent_ids: tuple[str, ...]
    occurred_from: datetime
    occurred_to: datetime
    owner_id: str  # the unit itself, or for a sentence the turn it belongs to


@dataclass(frozen=True)
class TurnPooling:
    turn_id: str
    mean: np.ndarray  # unnormalised mean of the turn's token embeddings
    tokens: int


@dataclass
class VectorChangeSet(ChangeSet):
    pooling: list[TurnPooling] = field(default_factory=list)
    upsert_points: list[VectorPoint] = field(default_factory=list)
    delete_points: list[tuple[Collection, str]] = field(default_factory=list)

    def is_empty(self) -> bool:
        return super().is_empty() and not (self.pooling or self.upsert_points or self.delete_points)


class VectorStore(ViewStore, Protocol):
    dim: int

    def apply(self, change: VectorChangeSet, positions: Positions) -> None: ...

    def pooling(self, turn_ids: list[str]) -> dict[str, TurnPooling]: ...

    def search(self, collection: Collection, vector: np.ndarray, boundary: Boundary, k: int) -> list[Hit]: ...

    def score_units(self, collection: Collection, vector: np.ndarray, boundary: Boundary) -> tuple[np.ndarray, np.ndarray]:
        """Cosine of every point inside the boundary, as arrays: point keys
        (schemas.units.unit_key, int64) and scores."""
        ...

    def score_units_many(self, requests: list[tuple[Collection, np.ndarray]], boundary: Boundary) -> list[tuple[np.ndarray, np.ndarray]]:
        """score_units for each (collection, vector), in order: one query's several reads, which
        a server adapter may have in flight together."""
        ...

    def nearest(self, collection: Collection, vector: np.ndarray, boundary: Boundary, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """The `limit` points inside the boundary nearest to `vector`, best first: point keys
        (schemas.units.unit_key, int64) and cosines. Exact while a scope is small, an ANN index
        beyond (so possibly missing a true neighbour: the bounded query path's candidates, not a
        ranking). Sees every write and forget applied before the call."""
        ...

    def score_points(self, collection: Collection, vector: np.ndarray, boundary: Boundary, point_ids: list[str]) -> dict[str, float]:
        """Exact cosine of `vector` with each named point of the boundary's tenant (absent points
        are left out): the bounded query path scores its candidates with it."""
        ...

    def vectors(self, collection: Collection, tenant_id: str, point_ids: list[str]) -> dict[str, np.ndarray]: ...

    def session_point_ids(self, collection: Collection, tenant_id: str, conversation_id: str, session_id: str) -> set[str]: ...
