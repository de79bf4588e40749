"""Embedded graph view: the entity–context graph in SQLite, PageRank with scipy.

No embeddable graph database offers personalised PageRank offline (infra notes), and on a
boundary-limited graph of a few thousand nodes a scipy sparse power iteration takes well under
a millisecond. For each (tenant, conversations) boundary the store builds a snapshot — node
index, row-normalised transition matrix, entity vectors, sentence index — and caches it until
one of those conversations' versions changes.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import repeat
from types import MappingProxyType
from typing import Mapping

import numpy as np
import scipy.sparse as sp

from infra.sqlite_base import SqliteViewBase, _chunks, boundary_where, forget_where
from schemas.ports.graph import EntityMatch, GraphChangeSet, SentenceIncidence
from schemas.ports.views import Boundary, Forget, Positions, TurnRow
from schemas.versioned_cache import VersionedCache

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entities (
    entity_id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, name TEXT NOT NULL, label TEXT NOT NULL, vector BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS mentions (
    context_id TEXT NOT NULL, entity_id TEXT NOT NULL, tenant_id TEXT NOT NULL, conversation_id TEXT NOT NULL,
    session_id TEXT NOT NULL, count INTEGER NOT NULL, weight REAL NOT NULL, kind TEXT NOT NULL,
    PRIMARY KEY (context_id, entity_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS mentions_scope ON mentions (tenant_id, conversation_id);
CREATE INDEX IF NOT EXISTS mentions_entity ON mentions (entity_id);
CREATE TABLE IF NOT EXISTS sentences (
    sentence_id TEXT PRIMARY KEY, context_id TEXT NOT NULL, tenant_id TEXT NOT NULL, conversation_id TEXT NOT NULL,
    session_id TEXT NOT NULL, idx INTEGER NOT NULL, start INTEGER NOT NULL, end INTEGER NOT NULL, entity_ids TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS sentences_scope ON sentences (tenant_id, conversation_id);
CREATE INDEX IF NOT EXISTS sentences_context ON sentences (context_id);
CREATE TABLE IF NOT EXISTS adjacency (
    source TEXT NOT NULL, target TEXT NOT NULL, tenant_id TEXT NOT NULL, conversation_id TEXT NOT NULL,
    session_id TEXT NOT NULL, PRIMARY KEY (source, target)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS adjacency_scope ON adjacency (tenant_id, conversation_id, session_id);
"""

NODE_KINDS = ("ner", "speaker", "keyword")  # mention kinds that are graph edges (values are not)


@dataclass
class _Snapshot:
    contexts: list[str]
    context_rows: dict[str, TurnRow]
    entities: list[str]
    entity_names: list[str]
    entity_labels: list[str]
    named: list[int]  # positions (in `entities`) of entities that carry a vector (not keywords)
    named_vectors: np.ndarray
    index: dict[str, int]
    mention_matrix: sp.csr_matrix  # contexts x entities, eq. 4 weights
    adjacency: sp.csr_matrix  # contexts x contexts, symmetric 0/1
    sentences: SentenceIncidence
    context_entities: dict[str, set[str]] = field(default_factory=dict)
    context_mentions: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # (entity id, label)
    transitions: dict[tuple, tuple[sp.csr_matrix, np.ndarray]] = field(default_factory=dict)
    named_labels: Mapping[str, str] | None = None  # read-only: shared by every query of the snapshot


class SqliteGraphStore(SqliteViewBase):
    view = "graph"
    extra_schema = _SCHEMA

    def __init__(self, path, generation: int, cache_size: int = 64):  # conversations, as many as the corpus cache
        super().__init__(path, generation)
        self._cache: VersionedCache[_Snapshot] = VersionedCache(cache_size)

    # -- writes --------------------------------------------------------------------------
    def apply(self, change: GraphChangeSet, positions: Positions) -> None:
        with self._change_tx(change) as c:
            touched = self._apply_ledger(c, change)
            c.executemany(
                "INSERT OR IGNORE INTO entities VALUES (?,?,?,?,?)",
                [(e.entity_id, e.tenant_id, e.name, e.label, np.asarray(e.vector, np.float32).tobytes()) for e in change.entities],
            )
            turns = {t.turn_id: t for t in change.put_turns}
            c.executemany(
                "INSERT OR REPLACE INTO mentions VALUES (?,?,?,?,?,?,?,?)",
                [(m.context_id, m.entity_id, turns[m.context_id].tenant_id, turns[m.context_id].conversation_id,
                  turns[m.context_id].session_id, m.count, m.weight, m.kind) for m in change.mentions],
            )
            c.executemany(
                "INSERT OR REPLACE INTO sentences VALUES (?,?,?,?,?,?,?,?,?)",
                [(s.sentence_id, s.context_id, turns[s.context_id].tenant_id, turns[s.context_id].conversation_id,
                  turns[s.context_id].session_id, s.index, s.start, s.end, json.dumps(list(s.entity_ids))) for s in change.sentences],
            )
            for (tenant, conv, session), edges in change.adjacency.items():
                c.execute("DELETE FROM adjacency WHERE tenant_id=? AND conversation_id=? AND session_id=?", (tenant, conv, session))
                c.executemany("INSERT OR REPLACE INTO adjacency VALUES (?,?,?,?,?)", [(e.source, e.target, tenant, conv, session) for e in edges])
                touched.add((tenant, conv))
            self._write_positions(c, positions)
            self._bump(c, touched)

    def _forget(self, c, forget: Forget):
        if forget.scope.partial:  # the turns' own rows; the projection recomputes their sessions' adjacency
            for chunk in _chunks([t.turn_id for t in self.turns_in_scope(forget)], 400):
                marks = ",".join("?" * len(chunk))
                c.execute(f"DELETE FROM mentions WHERE context_id IN ({marks})", chunk)
                c.execute(f"DELETE FROM sentences WHERE context_id IN ({marks})", chunk)
                c.execute(f"DELETE FROM adjacency WHERE source IN ({marks}) OR target IN ({marks})", chunk + chunk)
        else:
            where, args = forget_where(forget)
            for table in ("mentions", "sentences", "adjacency"):
                c.execute(f"DELETE FROM {table} WHERE {where}", args)
        touched = super()._forget(c, forget)
        # Entities nobody mentions any more are forgotten too (their name is tenant data).
        c.execute("DELETE FROM entities WHERE tenant_id=? AND entity_id NOT IN (SELECT entity_id FROM mentions WHERE tenant_id=?)",
                  (forget.tenant_id, forget.tenant_id))
        return touched

    # -- reads ---------------------------------------------------------------------------
    def known_entities(self, tenant_id: str, entity_ids: list[str]) -> set[str]:
        out: set[str] = set()
        for chunk in _chunks(entity_ids, 500):
            rows = self._conn().execute(
                f"SELECT entity_id FROM entities WHERE tenant_id=? AND entity_id IN ({','.join('?' * len(chunk))})", (tenant_id, *chunk)
            ).fetchall()
            out.update(r[0] for r in rows)
        return out

    def _snapshot(self, boundary: Boundary) -> _Snapshot:
        tenant = boundary.tenant_id
        convs = tuple(sorted(boundary.conversation_ids)) if boundary.conversation_ids is not None else None
        key = (tenant, convs, boundary.session_ids, boundary.agent_ids, boundary.since, boundary.until)
        version = tuple(self.conversation_version(tenant, c) for c in (convs or (None,)))
        return self._cache.get(key, version, lambda: self._build(boundary))

    def _build(self, b: Boundary) -> _Snapshot:
        conn = self._conn()
        turns = [t for t in self.turns_in_boundary(b) if _admits(t, b)]
        turns.sort(key=lambda t: t.turn_id)
        contexts = [t.turn_id for t in turns]
        ctx_index = {cid: i for i, cid in enumerate(contexts)}
        where, args = boundary_where(b)
        mentions = [
            r for r in conn.execute(f"SELECT context_id, entity_id, weight, kind FROM mentions WHERE {where}", args).fetchall()
            if r[0] in ctx_index
        ]
        node_mentions = [m for m in mentions if m[3] in NODE_KINDS]
        entity_ids = sorted({m[1] for m in mentions})
        ent_rows = {}
        for chunk in _chunks(entity_ids, 500):
            for eid, name, label, vec in conn.execute(
                f"SELECT entity_id, name, label, vector FROM entities WHERE entity_id IN ({','.join('?' * len(chunk))})", chunk
            ).fetchall():
                ent_rows[eid] = (name, label, np.frombuffer(vec, dtype=np.float32))
        labels: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for cid, eid, _, _ in sorted(mentions):
            if eid in ent_rows:
                labels[cid].append((eid, ent_rows[eid][1]))
        entity_ids = sorted({m[1] for m in node_mentions if m[1] in ent_rows})
        ent_index = {eid: i for i, eid in enumerate(entity_ids)}
        rows, cols, vals = [], [], []
        for cid, eid, w, kind in node_mentions:
            if eid in ent_index and w > 0:
                rows.append(ctx_index[cid])
                cols.append(ent_index[eid])
                vals.append(w)
        mm = sp.csr_matrix((vals, (rows, cols)), shape=(len(contexts), len(entity_ids)), dtype=np.float64)
        adj_rows, adj_cols = [], []
        for s, t in conn.execute(f"SELECT source, target FROM adjacency WHERE {where}", args).fetchall():
            if s in ctx_index and t in ctx_index:
                adj_rows += [ctx_index[s], ctx_index[t]]
                adj_cols += [ctx_index[t], ctx_index[s]]
        adj = sp.csr_matrix((np.ones(len(adj_rows)), (adj_rows, adj_cols)), shape=(len(contexts), len(contexts)), dtype=np.float64)
        sentences = SentenceIncidence.build(
            (sid, cid, json.loads(ents))
            for sid, cid, ents in conn.execute(f"SELECT sentence_id, context_id, entity_ids FROM sentences WHERE {where}", args).fetchall()
            if cid in ctx_index)
        ctx_entities: dict[str, set[str]] = defaultdict(set)
        for cid, eid, _, _ in node_mentions:
            ctx_entities[cid].add(eid)
        index = {**ctx_index, **{eid: len(contexts) + i for i, eid in enumerate(entity_ids)}}
        named = [i for i, e in enumerate(entity_ids) if len(ent_rows[e][2])]
        vectors = np.stack([ent_rows[entity_ids[i]][2] for i in named]) if named else np.zeros((0, 0), np.float32)
        return _Snapshot(
            contexts=contexts, context_rows={t.turn_id: t for t in turns}, entities=entity_ids,
            entity_names=[ent_rows[e][0] for e in entity_ids], entity_labels=[ent_rows[e][1] for e in entity_ids],
            named=named, named_vectors=vectors, index=index, mention_matrix=mm, adjacency=adj, sentences=sentences,
            context_entities=dict(ctx_entities), context_mentions=dict(labels),
        )

    def align_entities(self, boundary: Boundary, entity_ids: list[str], vectors: np.ndarray, k: int) -> list[list[EntityMatch]]:
        snap = self._snapshot(boundary)
        q = np.atleast_2d(np.asarray(vectors, dtype=np.float32)) if len(entity_ids) else np.zeros((0, 0), np.float32)
        out: list[list[EntityMatch]] = []
        for i, exact in enumerate(entity_ids):
            j = snap.index.get(exact)
            if j is not None and j >= len(snap.contexts):
                out.append([EntityMatch(exact, snap.entity_labels[j - len(snap.contexts)], 1.0)])
                continue
            if not snap.named or q.shape[0] <= i:
                out.append([])
                continue
            scores = snap.named_vectors @ q[i]
            top = np.argsort(-scores, kind="stable")[:k]  # ties: entity-id order (`named` is sorted)
            out.append([EntityMatch(snap.entities[snap.named[t]], snap.entity_labels[snap.named[t]], float(scores[t])) for t in top])
        return out

    def entity_labels(self, boundary: Boundary) -> Mapping[str, str]:
        snap = self._snapshot(boundary)
        if snap.named_labels is None:  # read on every query (the question's lexicon): built once per snapshot
            snap.named_labels = MappingProxyType({snap.entities[i]: snap.entity_labels[i] for i in snap.named})
        return snap.named_labels

    def present(self, boundary: Boundary, entity_ids: list[str]) -> set[str]:
        snap = self._snapshot(boundary)
        return {e for e in entity_ids if e in snap.index and snap.index[e] >= len(snap.contexts)}

    def context_mentions(self, boundary: Boundary) -> dict[str, list[tuple[str, str]]]:
        return self._snapshot(boundary).context_mentions

    def sentence_incidence(self, boundary: Boundary) -> SentenceIncidence:
        return self._snapshot(boundary).sentences

    def context_entities(self, tenant_id: str, context_ids: list[str]) -> dict[str, set[str]]:
        out: dict[str, set[str]] = defaultdict(set)
        for chunk in _chunks(list(dict.fromkeys(context_ids)), 500):
            q = ",".join("?" * len(chunk))
            for cid, eid in self._conn().execute(
                f"SELECT context_id, entity_id FROM mentions WHERE tenant_id=? AND context_id IN ({q}) AND kind IN ('ner','speaker','keyword')",
                (tenant_id, *chunk),
            ).fetchall():
                out[cid].add(eid)
        return dict(out)

    def personalized_pagerank(self, boundary: Boundary, reset: dict[str, float], damping: float, *, adjacency_weight: float = 1.0,
                              exclude_labels: tuple[str, ...] = (), max_share: float = 1.0, max_iterations: int = 50,
                              tolerance: float = 1e-7) -> dict[str, float]:
        snap = self._snapshot(boundary)
        n = len(snap.index)
        r = np.zeros(n)
        if reset:  # hundreds of activated entities per query: index them in one pass
            idx = np.fromiter(map(snap.index.get, reset, repeat(-1)), dtype=np.int64, count=len(reset))
            mass = np.fromiter(reset.values(), dtype=float, count=len(reset))
            keep = (idx >= 0) & (mass > 0)
            np.add.at(r, idx[keep], mass[keep])
        if n == 0 or r.sum() <= 0:
            return {}
        r /= r.sum()
        PT, dangling = self._transitions(snap, adjacency_weight, tuple(sorted(exclude_labels)), max_share)
        base = (1 - damping) * r
        pi = r.copy()
        for it in range(max_iterations):  # pi <- (1-d) r + d (P^T pi + mass of dangling nodes * r), in place
            nxt = PT @ pi
            if len(dangling):
                nxt += pi[dangling].sum() * r
            nxt *= damping
            nxt += base
            # The convergence test (two array passes) every 5th step: the query's walks take 20 and 10.
            done = it % 5 == 4 and np.abs(nxt - pi).sum() < tolerance
            pi = nxt
            if done:
                break
        return dict(zip(snap.contexts, pi[: len(snap.contexts)].tolist()))

    @staticmethod
    def _transitions(snap: _Snapshot, adjacency_weight: float, exclude_labels: tuple[str, ...],
                     max_share: float = 1.0) -> tuple[sp.csr_matrix, np.ndarray]:
        """(P^T, positions of dangling rows) of the row-normalised transition matrix, cached on the snapshot."""
        key = (adjacency_weight, exclude_labels, max_share)
        cached = snap.transitions.get(key)
        if cached is None:
            nc = len(snap.contexts)
            mm = snap.mention_matrix
            if exclude_labels or max_share < 1.0:
                degree = np.asarray((mm > 0).sum(axis=0)).ravel()
                keep = np.array([lab not in exclude_labels for lab in snap.entity_labels], dtype=float)
                keep *= degree <= max_share * max(nc, 1)
                mm = mm @ sp.diags(keep)
            if not nc:
                A = sp.csr_matrix((0, 0))
            elif mm.shape[1] == 0:
                A = (adjacency_weight * snap.adjacency).tocsr()
            else:
                A = sp.bmat([[adjacency_weight * snap.adjacency, mm], [mm.T, None]], format="csr", dtype=np.float64)
            deg = np.asarray(A.sum(axis=1)).ravel()
            inv = np.divide(1.0, deg, out=np.zeros_like(deg), where=deg > 0)
            P = (sp.diags(inv) @ A).tocsr()
            cached = snap.transitions[key] = (P.T.tocsr(), np.flatnonzero(deg == 0))
        return cached

    def canonical_dump(self) -> dict:
        conn = self._conn()
        return {
            "view": self.view,
            "turns": self.ledger_dump(),
            "entities": [  # no names: a graph store that cannot erase keeps none (the id is a digest of it)
                {"id": e, "tenant": t, "label": l, "vector": np.frombuffer(v, dtype=np.float32).tolist()}
                for e, t, l, v in conn.execute("SELECT entity_id, tenant_id, label, vector FROM entities ORDER BY entity_id")
            ],
            "mentions": [list(r) for r in conn.execute(
                "SELECT context_id, entity_id, count, round(weight, 9), kind FROM mentions ORDER BY context_id, entity_id")],
            "sentences": [list(r) for r in conn.execute(
                "SELECT sentence_id, context_id, idx, start, end, entity_ids FROM sentences ORDER BY sentence_id")],
            "adjacency": [list(r) for r in conn.execute("SELECT source, target, session_id FROM adjacency ORDER BY source, target")],
        }


def _admits(t: TurnRow, b: Boundary) -> bool:
    if b.agent_ids is not None and t.agent_id not in b.agent_ids:
        return False
    if b.since is not None and t.occurred_at < b.since:
        return False
    if b.until is not None and t.occurred_at > b.until:
        return False
    return True
