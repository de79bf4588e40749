"""Embedded dense view: vectors in SQLite; searches in memory.

Two read paths. `nearest` and `score_points` (the bounded query path) search the scopes of
infra/vectors/scopes.py — exact while a scope is small, HNSW beyond — which the store keeps
current from its change table (`point_changes`, written by triggers in the writes' own
transactions): each read first applies the points written or deleted since the last one, so a
search never rebuilds what one write changed. `score_units` (the whole-boundary path) scores every
point of a boundary from a float32 matrix cached until the conversation's version moves.
"""

from __future__ import annotations

import json
from datetime import datetime

import numpy as np

from infra.sqlite_base import SqliteViewBase, _chunks, forget_where
from infra.vectors.scopes import Scope
from schemas.ports.vectors import Collection, TurnPooling, VectorChangeSet
from schemas.ports.views import Boundary, Forget, Hit, Positions
from schemas.units import unit_key
from schemas.sized_lru import SizedLRU
from schemas.versioned_cache import Lru, VersionedCache

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pooling (turn_id TEXT PRIMARY KEY, mean BLOB NOT NULL, tokens INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS points (
    collection TEXT NOT NULL, point_id TEXT NOT NULL, tenant_id TEXT NOT NULL, conversation_id TEXT NOT NULL,
    session_id TEXT NOT NULL, agent_ids TEXT NOT NULL, occurred_from TEXT NOT NULL, occurred_to TEXT NOT NULL,
    owner_id TEXT NOT NULL, vector BLOB NOT NULL, PRIMARY KEY (collection, point_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS points_scope ON points (collection, tenant_id, conversation_id, session_id);
CREATE INDEX IF NOT EXISTS points_owner ON points (owner_id);
-- What changed, in commit order, for the in-memory scopes to follow (sentences are never searched
-- by nearness: they are scored by id). Pruned to the last CHANGES_KEPT rows.
CREATE TABLE IF NOT EXISTS point_changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, collection TEXT NOT NULL, point_id TEXT NOT NULL, tenant_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL, op TEXT NOT NULL);
CREATE TRIGGER IF NOT EXISTS points_changes_in AFTER INSERT ON points WHEN NEW.collection <> 'sentence' BEGIN
    INSERT INTO point_changes (collection, point_id, tenant_id, conversation_id, op)
        VALUES (NEW.collection, NEW.point_id, NEW.tenant_id, NEW.conversation_id, 'put');
END;
CREATE TRIGGER IF NOT EXISTS points_changes_out AFTER DELETE ON points WHEN OLD.collection <> 'sentence' BEGIN
    INSERT INTO point_changes (collection, point_id, tenant_id, conversation_id, op)
        VALUES (OLD.collection, OLD.point_id, OLD.tenant_id, OLD.conversation_id, 'del');
END;
"""
CHANGES_KEPT = 500_000
SENTENCES_KEPT = 100_000  # sentence vectors kept by id for the bounded path (~1.5 kB each at 384 dimensions)
_POINT_COLS = "point_id, session_id, agent_ids, occurred_from, occurred_to, vector"


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

    def __init__(self, path, generation: int, cache_size: int = 256, *, exact_limit: int = 20_000, max_points: int = 2_000_000):
        """`exact_limit`: points up to which a scope is searched exactly; `max_points`: points the
        in-memory scopes hold in all (MEMSTREAM_VIEWS_DENSE_MAX_POINTS; least recently used first out)."""
        super().__init__(path, generation)
        self._cache: VersionedCache[_Matrix] = VersionedCache(cache_size)
        self._exact_limit = exact_limit
        self._scopes: SizedLRU[Scope] = SizedLRU(max_points)
        self._seq = self._last_change()
        self._sentences = Lru(SENTENCES_KEPT)

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
            c.execute("DELETE FROM point_changes WHERE seq <= (SELECT MAX(seq) FROM point_changes) - ?", (CHANGES_KEPT,))
            self._write_positions(c, positions)
            self._bump(c, touched)
        if change.forgets or change.delete_points:
            self._sentences.clear()
        if change.forgets:  # a forget's points may belong to no turn of the ledger (whose versions it bumps)
            self._cache.clear()

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

    # -- the bounded path: maintained scopes --------------------------------------------------
    def _last_change(self) -> int:
        row = self._conn().execute("SELECT MAX(seq) FROM point_changes").fetchone()
        return int(row[0] or 0)

    def _sync(self) -> None:
        """Apply to the loaded scopes what was written since the last read (under the scopes' lock)."""
        rows = self._conn().execute(
            "SELECT seq, collection, point_id, tenant_id, conversation_id, op FROM point_changes WHERE seq > ? ORDER BY seq",
            (self._seq,)).fetchall()
        if not rows:
            return
        oldest = self._conn().execute("SELECT MIN(seq) FROM point_changes").fetchone()[0]
        if oldest is not None and oldest > self._seq + 1:  # pruned past this reader: start the scopes again
            self._scopes.clear()
            self._seq = rows[-1][0]
            return
        loaded = dict(self._scopes.loaded())
        if loaded:
            latest: dict[tuple[str, str], tuple] = {}  # (collection, point) -> its last change
            for r in rows:
                latest[(r[1], r[2])] = r
            puts = [(col, pid) for (col, pid), r in latest.items() if r[5] == "put"]
            fetched = self._rows_by_id(puts)
            for (col, pid), (_, _, _, tenant, conv, op) in latest.items():
                for key in ((col, tenant, conv), (col, tenant, None)):
                    scope = loaded.get(key)
                    if scope is None:
                        continue
                    row = fetched.get((col, pid)) if op == "put" else None
                    if row is None:
                        scope.delete([pid])
                    else:
                        scope.upsert([row])
        self._seq = rows[-1][0]

    def _rows_by_id(self, points: list[tuple[str, str]]) -> dict[tuple[str, str], tuple]:
        out = {}
        by_collection: dict[str, list[str]] = {}
        for col, pid in points:
            by_collection.setdefault(col, []).append(pid)
        for col, ids in by_collection.items():
            for chunk in _chunks(ids, 500):
                for row in self._conn().execute(
                        f"SELECT {_POINT_COLS} FROM points WHERE collection=? AND point_id IN ({','.join('?' * len(chunk))})",
                        (col, *chunk)).fetchall():
                    out[(col, row[0])] = row
        return out

    def _scope(self, collection: Collection, tenant_id: str, conversation_id: str | None):
        def make() -> Scope:
            where, args = "collection=? AND tenant_id=?", [collection, tenant_id]
            if conversation_id is not None:
                where += " AND conversation_id=?"
                args.append(conversation_id)
            scope = Scope(self.dim, self._exact_limit)
            scope.upsert(self._conn().execute(f"SELECT {_POINT_COLS} FROM points WHERE {where} ORDER BY point_id", args).fetchall())
            return scope

        return self._scopes.get((collection, tenant_id, conversation_id), make)

    def nearest(self, collection: Collection, vector: np.ndarray, boundary: Boundary, limit: int) -> tuple[np.ndarray, np.ndarray]:
        q = np.asarray(vector, dtype=np.float32).reshape(-1)
        if collection == "sentence":  # sentences are scored by id, not kept in scopes: the matrices' exact ranking
            keys, scores = self.score_units(collection, q, boundary)
            order = np.lexsort((keys, -scores))[:limit]
            return keys[order], scores[order]
        convs = boundary.conversation_ids if boundary.conversation_ids is not None else (None,)
        if not convs:
            return np.zeros(0, np.int64), np.zeros(0)
        with self._scopes.lock:
            self._sync()
            found = [self._scope(collection, boundary.tenant_id, c).nearest(q, boundary, limit) for c in convs]
        if len(found) == 1:
            return found[0]
        keys, scores = np.concatenate([k for k, _ in found]), np.concatenate([s for _, s in found])
        order = np.lexsort((keys, -scores))[:limit]
        return keys[order], scores[order]

    def score_points(self, collection: Collection, vector: np.ndarray, boundary: Boundary, point_ids: list[str]) -> dict[str, float]:
        q = np.asarray(vector, dtype=np.float32).reshape(-1)
        out: dict[str, float] = {}
        if collection != "sentence":  # sentences are not kept in scopes: read by id below
            with self._scopes.lock:
                self._sync()
                convs = boundary.conversation_ids if boundary.conversation_ids is not None else (None,)
                for c in convs:
                    out.update(self._scope(collection, boundary.tenant_id, c).scores(q, point_ids))
                if not convs:
                    return {}
        missing = [p for p in point_ids if p not in out]
        if missing and collection == "sentence":  # sentences are read by id, kept by id (a sentence's vector never changes)
            kept, missing = self._sentences.get_many(missing)
            if missing:
                fetched = self.vectors(collection, boundary.tenant_id, missing)
                self._sentences.put_many({pid: (v, boundary.tenant_id) for pid, v in fetched.items()})
                kept.update({pid: (v, boundary.tenant_id) for pid, v in fetched.items()})
            out.update({pid: float(v @ q) for pid, (v, tenant) in kept.items() if tenant == boundary.tenant_id})
        elif missing:
            vectors = self.vectors(collection, boundary.tenant_id, missing)
            out.update({pid: float(v @ q) for pid, v in vectors.items()})
        return out

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
