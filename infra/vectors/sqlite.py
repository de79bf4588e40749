"""Embedded dense view: vectors in SQLite, searched by exact cosine with numpy.

Why exact search: a conversation holds hundreds to a few thousand points, where a brute-force
matrix product (~µs) beats any ANN index and is exactly reproducible. Points of one
(collection, tenant, conversation) are loaded once into a float32 matrix and cached until that
conversation's version changes (bumped in the same transaction as the writes).
"""

from __future__ import annotations

import json
from datetime import datetime

import numpy as np

from infra.sqlite_base import SqliteViewBase, _chunks, forget_where
from schemas.ports.vectors import Collection, TurnPooling, VectorChangeSet
from schemas.ports.views import Boundary, Forget, Hit, Positions
from schemas.units import unit_key
from schemas.versioned_cache import VersionedCache

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pooling (turn_id TEXT PRIMARY KEY, mean BLOB NOT NULL, tokens INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS points (
    collection TEXT NOT NULL, point_id TEXT NOT NULL, tenant_id TEXT NOT NULL, conversation_id TEXT NOT NULL,
    session_id TEXT NOT NULL, agent_ids TEXT NOT NULL, occurred_from TEXT NOT NULL, occurred_to TEXT NOT NULL,
    owner_id TEXT NOT NULL, vector BLOB NOT NULL, PRIMARY KEY (collection, point_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS points_scope ON points (collection, tenant_id, conversation_id, session_id);
CREATE INDEX IF NOT EXISTS points_owner ON points (owner_id);
"""


class _Matrix:
    """One scope's points. Rebuilt whenever its conversation's version moves (every batch while it
    is being written), so only what every search needs is made up front; the filter columns
    (agents, times: parsing them was most of a rebuild) are made the first time a filter asks."""

    __slots__ = ("ids", "keys", "vectors", "sessions", "_rows", "_agents", "_t_from", "_t_to")

    def __init__(self, rows: list[tuple]):
        self.ids = [r[0] for r in rows]
        self.keys = np.array([unit_key(i) for i in self.ids], dtype=np.int64)
        self.keys.flags.writeable = False  # handed to callers as is (score_units): a KeyIndex memoises read-only key arrays
        # One buffer for the whole matrix (every vector of a collection has the collection's dimension).
        self.vectors = np.frombuffer(b"".join(r[5] for r in rows), dtype=np.float32).reshape(len(rows), -1) if rows \
            else np.zeros((0, 0), np.float32)
        self.sessions = np.array([r[1] for r in rows], dtype=object)
        self._rows = [r[2:5] for r in rows]  # agents JSON, from, to (not the vector blobs: those are in `vectors`)
        self._agents = self._t_from = self._t_to = None

    @property
    def agents(self) -> list[set[str]]:
        if self._agents is None:
            self._agents = [set(json.loads(r[0])) for r in self._rows]
        return self._agents

    @property
    def t_from(self) -> list[datetime]:
        if self._t_from is None:
            self._t_from = [datetime.fromisoformat(r[1]) for r in self._rows]
        return self._t_from

    @property
    def t_to(self) -> list[datetime]:
        if self._t_to is None:
            self._t_to = [datetime.fromisoformat(r[2]) for r in self._rows]
        return self._t_to


class SqliteVectorStore(SqliteViewBase):
    view = "dense"
    extra_schema = _SCHEMA

    def __init__(self, path, generation: int, cache_size: int = 256):  # 64 conversations (the corpus cache's) x 4 collections
        super().__init__(path, generation)
        self._cache: VersionedCache[_Matrix] = VersionedCache(cache_size)

    @property
    def dim(self) -> int:
        row = self._conn().execute("SELECT vector FROM points LIMIT 1").fetchone()
        return len(row[0]) // 4 if row else 0

    # -- writes --------------------------------------------------------------------------
    def apply(self, change: VectorChangeSet, positions: Positions) -> None:
        with self._change_tx(change) as c:
            touched = self._apply_ledger(c, change)
            if change.delete_turns:
                for chunk in _chunks(change.delete_turns, 500):
                    c.execute(f"DELETE FROM pooling WHERE turn_id IN ({','.join('?' * len(chunk))})", chunk)
            for collection, pid in change.delete_points:
                touched.update(c.execute("SELECT tenant_id, conversation_id FROM points WHERE collection=? AND point_id=?", (collection, pid)).fetchall())
            c.executemany("DELETE FROM points WHERE collection=? AND point_id=?", change.delete_points)
            c.executemany(
                "INSERT OR REPLACE INTO pooling VALUES (?,?,?)",
                [(p.turn_id, np.asarray(p.mean, np.float32).tobytes(), p.tokens) for p in change.pooling],
            )
            c.executemany(
                "INSERT OR REPLACE INTO points VALUES (?,?,?,?,?,?,?,?,?,?)",
                [
                    (p.collection, p.point_id, p.tenant_id, p.conversation_id, p.session_id, json.dumps(list(p.agent_ids)),
                     p.occurred_from.isoformat(), p.occurred_to.isoformat(), p.owner_id, np.asarray(p.vector, np.float32).tobytes())
                    for p in change.upsert_points
                ],
            )
            touched.update((p.tenant_id, p.conversation_id) for p in change.upsert_points)
            self._write_positions(c, positions)
            self._bump(c, touched)

    def _forget(self, c, forget: Forget):
        turns = self.turns_in_scope(forget)
        touched = super()._forget(c, forget)
        if forget.scope.partial:
            # The turns' own points; the projection recomputes their sessions' windows/episodes.
            for chunk in _chunks([t.turn_id for t in turns], 500):
                marks = ",".join("?" * len(chunk))
                c.execute(f"DELETE FROM pooling WHERE turn_id IN ({marks})", chunk)
                c.execute(f"DELETE FROM points WHERE owner_id IN ({marks}) AND collection IN ('turn','sentence')", chunk)
        else:
            where, args = forget_where(forget)
            c.execute("DELETE FROM pooling WHERE turn_id IN (SELECT turn_id FROM pooling EXCEPT SELECT turn_id FROM turns)")
            c.execute(f"DELETE FROM points WHERE {where}", args)
        return touched

    # -- reads ---------------------------------------------------------------------------
    def pooling(self, turn_ids: list[str]) -> dict[str, TurnPooling]:
        out = {}
        for chunk in _chunks(turn_ids, 500):
            rows = self._conn().execute(f"SELECT turn_id, mean, tokens FROM pooling WHERE turn_id IN ({','.join('?' * len(chunk))})", chunk).fetchall()
            out.update({tid: TurnPooling(tid, np.frombuffer(m, dtype=np.float32).copy(), n) for tid, m, n in rows})
        return out

    def _matrix(self, collection: Collection, tenant_id: str, conversation_id: str | None) -> _Matrix:
        version = self.conversation_version(tenant_id, conversation_id)
        return self._cache.get((collection, tenant_id, conversation_id), version,
                               lambda: self._load_matrix(collection, tenant_id, conversation_id))

    def _load_matrix(self, collection: Collection, tenant_id: str, conversation_id: str | None) -> _Matrix:
        where, args = "collection=? AND tenant_id=?", [collection, tenant_id]
        if conversation_id is not None:
            where += " AND conversation_id=?"
            args.append(conversation_id)
        rows = self._conn().execute(
            f"SELECT point_id, session_id, agent_ids, occurred_from, occurred_to, vector FROM points WHERE {where} ORDER BY point_id", args
        ).fetchall()
        return _Matrix(rows)

    def _matrices(self, collection: Collection, boundary: Boundary) -> list[_Matrix]:
        convs = boundary.conversation_ids
        if convs is None:
            return [self._matrix(collection, boundary.tenant_id, None)]
        return [self._matrix(collection, boundary.tenant_id, c) for c in convs]

    def search(self, collection: Collection, vector: np.ndarray, boundary: Boundary, k: int) -> list[Hit]:
        q = np.asarray(vector, dtype=np.float32).reshape(-1)
        hits: list[Hit] = []
        for m in self._matrices(collection, boundary):
            if not m.ids:
                continue
            scores = m.vectors @ q
            mask = _mask(m, boundary)
            idx = np.arange(len(m.ids)) if mask is None else np.nonzero(mask)[0]
            if len(idx) > k:
                part = idx[np.argpartition(-scores[idx], k - 1)[:k]]
            else:
                part = idx
            hits.extend(Hit(m.ids[i], float(scores[i])) for i in part)
        hits.sort(key=lambda h: (-h.score, h.unit_id))
        return hits[:k]

    def score_units_many(self, requests: list[tuple[Collection, np.ndarray]], boundary: Boundary) -> list[tuple[np.ndarray, np.ndarray]]:
        return [self.score_units(collection, vector, boundary) for collection, vector in requests]  # in memory: nothing to overlap

    def score_units(self, collection: Collection, vector: np.ndarray, boundary: Boundary) -> tuple[np.ndarray, np.ndarray]:
        q = np.asarray(vector, dtype=np.float32).reshape(-1)
        parts = [(m, _mask(m, boundary)) for m in self._matrices(collection, boundary) if m.ids]
        if len(parts) == 1 and parts[0][1] is None:  # one whole cached matrix: its own key array, the same every query
            m = parts[0][0]
            return m.keys, (m.vectors @ q).astype(float)
        keys = [m.keys if mask is None else m.keys[mask] for m, mask in parts]
        scores = [m.vectors @ q if mask is None else (m.vectors @ q)[mask] for m, mask in parts]
        if not keys:
            return np.zeros(0, np.int64), np.zeros(0)
        return np.concatenate(keys), np.concatenate(scores).astype(float)

    def vectors(self, collection: Collection, tenant_id: str, point_ids: list[str]) -> dict[str, np.ndarray]:
        out = {}
        for chunk in _chunks(list(dict.fromkeys(point_ids)), 500):
            rows = self._conn().execute(
                f"SELECT point_id, vector FROM points WHERE collection=? AND tenant_id=? AND point_id IN ({','.join('?' * len(chunk))})",
                (collection, tenant_id, *chunk),
            ).fetchall()
            out.update({pid: np.frombuffer(v, dtype=np.float32).copy() for pid, v in rows})
        return out

    def session_point_ids(self, collection: Collection, tenant_id: str, conversation_id: str, session_id: str) -> set[str]:
        rows = self._conn().execute(
            "SELECT point_id FROM points WHERE collection=? AND tenant_id=? AND conversation_id=? AND session_id=?",
            (collection, tenant_id, conversation_id, session_id),
        ).fetchall()
        return {r[0] for r in rows}

    def canonical_dump(self) -> dict:
        rows = self._conn().execute(
            "SELECT collection, point_id, tenant_id, conversation_id, session_id, agent_ids, occurred_from, occurred_to, owner_id, vector"
            " FROM points ORDER BY collection, point_id"
        ).fetchall()
        return {
            "view": self.view,
            "turns": self.ledger_dump(),
            "points": [
                {"collection": r[0], "id": r[1], "tenant": r[2], "conversation": r[3], "session": r[4], "agents": json.loads(r[5]),
                 "from": r[6], "to": r[7], "owner": r[8], "vector": np.frombuffer(r[9], dtype=np.float32).tolist()}
                for r in rows
            ],
        }


def _mask(m: _Matrix, b: Boundary) -> np.ndarray | None:
    """Rows of `m` inside the boundary's session/agent/time filters; None when it sets none."""
    if b.session_ids is None and b.agent_ids is None and b.since is None and b.until is None:
        return None
    mask = np.ones(len(m.ids), dtype=bool)
    if b.session_ids is not None:
        mask &= np.isin(m.sessions, list(b.session_ids))
    if b.agent_ids is not None:
        allowed = set(b.agent_ids)
        mask &= np.array([bool(a & allowed) for a in m.agents])
    if b.since is not None:
        mask &= np.array([t >= b.since for t in m.t_to])
    if b.until is not None:
        mask &= np.array([t <= b.until for t in m.t_from])
    return mask
