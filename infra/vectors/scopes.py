"""The embedded dense view's search structures, kept in memory and maintained point by point.

One structure per scope — (collection, tenant, conversation), or (collection, tenant) for a
search across the tenant's conversations — made on the first search of the scope and then
updated with each point written or deleted (SqliteVectorStore reads them from its change table),
never rebuilt because the conversation moved on:

- exact while a scope is small (up to `exact_limit` points): a float32 matrix and one product
  per search, which beats any index there and is exactly reproducible;
- beyond that, an HNSW graph (usearch; not home-made), updated in place: an upsert replaces the
  point, a delete removes it (the tombstone is in memory only; nothing here is ever written to a
  file, so a forgotten vector is gone from every file when the store's own transaction erases it).

The store keeps its scopes in a schemas/sized_lru.py SizedLRU bounded by `max_points` points in
all (least recently searched dropped first, made again on their next search): memory is bounded
by that setting.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Iterable

import numpy as np

from schemas.ports.views import Boundary
from schemas.units import unit_key

Row = tuple  # (point_id, session_id, agent_ids JSON, occurred_from, occurred_to, vector blob)


class Scope:
    """The points of one scope: their ids, filter columns and vectors (a matrix, or an HNSW index
    holding the vectors once the scope passes `exact_limit`)."""

    def __init__(self, dim: int, exact_limit: int):
        self.dim, self.exact_limit = dim, exact_limit
        self.ids: list[str | None] = []      # by row; None: a deleted row (reused by the next insert)
        self.row: dict[str, int] = {}
        self.free: list[int] = []
        self.keys = np.zeros(0, np.int64)
        self.alive = np.zeros(0, bool)
        self.sessions: list[str] = []
        self.agents: list[frozenset[str]] = []
        self.t_from: list[datetime] = []
        self.t_to: list[datetime] = []
        self.matrix = np.zeros((0, dim), np.float32)
        self.ann = None  # usearch Index keyed by row, once the scope is large

    def __len__(self) -> int:
        return len(self.row)

    # -- writes ----------------------------------------------------------------------------
    def upsert(self, rows: Iterable[Row]) -> None:
        rows = list(rows)
        if not rows:
            return
        vectors = np.frombuffer(b"".join(r[5] for r in rows), dtype=np.float32).reshape(len(rows), -1)
        if not self.dim:  # a scope made before the store held any vector learns its dimension from the first
            self.dim = vectors.shape[1]
            self.matrix = np.zeros((0, self.dim), np.float32)
        placed = []
        for r in rows:
            pid = r[0]
            i = self.row.get(pid)
            if i is None:
                i = self.free.pop() if self.free else len(self.ids)
                if i == len(self.ids):
                    self.ids.append(pid)
                    self.sessions.append("")
                    self.agents.append(frozenset())
                    self.t_from.append(None)
                    self.t_to.append(None)
                else:
                    self.ids[i] = pid
                self.row[pid] = i
            elif self.ann is not None:
                self.ann.remove(i)
            self.sessions[i] = r[1]
            self.agents[i] = frozenset(json.loads(r[2]))
            self.t_from[i] = datetime.fromisoformat(r[3])
            self.t_to[i] = datetime.fromisoformat(r[4])
            placed.append(i)
        placed_rows = np.array(placed, dtype=np.int64)
        size = len(self.ids)
        if len(self.keys) < size:
            self.keys = np.concatenate([self.keys, np.zeros(size - len(self.keys), np.int64)])
            self.alive = np.concatenate([self.alive, np.zeros(size - len(self.alive), bool)])
        self.keys[placed_rows] = [unit_key(self.ids[i]) for i in placed]
        self.alive[placed_rows] = True
        if self.ann is None:
            if len(self.matrix) < size:
                grown = np.zeros((max(size, 2 * len(self.matrix)), self.dim), np.float32)
                grown[: len(self.matrix)] = self.matrix
                self.matrix = grown
            self.matrix[placed_rows] = vectors
            if len(self.row) > self.exact_limit:
                self._to_ann()
        else:
            self.ann.add(placed_rows, vectors, threads=1)

    def delete(self, point_ids: Iterable[str]) -> None:
        for pid in point_ids:
            i = self.row.pop(pid, None)
            if i is None:
                continue
            self.ids[i] = None
            self.alive[i] = False
            self.free.append(i)
            if self.ann is not None:
                self.ann.remove(i)
            else:
                self.matrix[i] = 0.0

    def _to_ann(self) -> None:
        from usearch.index import Index

        live = np.flatnonzero(self.alive)
        # Inner product on L2-normalised vectors is the cosine; f32 keeps the scores exact.
        self.ann = Index(ndim=self.dim, metric="ip", dtype="f32", connectivity=16, expansion_add=40, expansion_search=128)
        self.ann.add(live, self.matrix[live], threads=0)  # the one bulk build: every core (later adds: one point, one thread)
        self.matrix = np.zeros((0, self.dim), np.float32)

    # -- reads -----------------------------------------------------------------------------
    def _admitted(self, rows: np.ndarray, b: Boundary) -> np.ndarray:
        """The rows (of `rows`) inside the boundary's session, agent and time filters."""
        keep = self.alive[rows].copy()
        if b.session_ids is not None:
            keep &= np.array([self.sessions[i] in b.session_ids for i in rows], dtype=bool)
        if b.agent_ids is not None:
            allowed = set(b.agent_ids)
            keep &= np.array([bool(self.agents[i] & allowed) for i in rows], dtype=bool)
        if b.since is not None:
            keep &= np.array([self.t_to[i] >= b.since for i in rows], dtype=bool)
        if b.until is not None:
            keep &= np.array([self.t_from[i] <= b.until for i in rows], dtype=bool)
        return rows[keep]

    def nearest(self, q: np.ndarray, boundary: Boundary, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """(keys, cosines) of the `limit` nearest points inside the boundary, best first."""
        if not self.row or limit <= 0:
            return np.zeros(0, np.int64), np.zeros(0)
        filtered = any(x is not None for x in (boundary.session_ids, boundary.agent_ids, boundary.since, boundary.until))
        if self.ann is None:
            every = self.matrix[: len(self.ids)] @ q  # one product over the matrix, not a copy of its rows
            rows = np.flatnonzero(self.alive)
            if filtered:
                rows = self._admitted(rows, boundary)
            return self._top(rows, every[rows], limit)
        # A filter the index cannot apply: ask for more, keep the admitted; if too few pass, the
        # filtered rows exactly (a narrow filter leaves few rows).
        ask = limit if not filtered else min(len(self.row), 4 * limit)
        found = self.ann.search(q, ask, threads=1)
        rows = np.asarray(found.keys, dtype=np.int64)
        if filtered:
            rows = self._admitted(rows, boundary)
            if len(rows) < limit and ask < len(self.row):
                every = self._admitted(np.flatnonzero(self.alive), boundary)
                return self._top(every, self._vectors(every) @ q, limit)
        return self._top(rows, self._vectors(rows) @ q, limit)

    def scores(self, q: np.ndarray, point_ids: list[str]) -> dict[str, float]:
        """Cosine of each named point the scope holds."""
        rows = np.array([self.row[p] for p in point_ids if p in self.row], dtype=np.int64)
        if not len(rows):
            return {}
        return dict(zip((self.ids[i] for i in rows), (self._vectors(rows) @ q).tolist()))

    def _vectors(self, rows: np.ndarray) -> np.ndarray:
        if self.ann is None:
            return self.matrix[rows]
        return np.asarray(self.ann.get(rows), dtype=np.float32).reshape(len(rows), self.dim)

    def _top(self, rows: np.ndarray, scores: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
        if len(rows) > limit:
            part = np.argpartition(-scores, limit - 1)[:limit]
            rows, scores = rows[part], scores[part]
        order = np.lexsort((self.keys[rows], -scores))  # best first; ties by key: deterministic
        return self.keys[rows][order], scores[order].astype(float)
