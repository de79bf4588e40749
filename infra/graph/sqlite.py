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
from datetime import datetime
from dataclasses import dataclass, field
from itertools import repeat
from types import MappingProxyType
from typing import Callable, Mapping

import numpy as np
import scipy.sparse as sp

from infra.graph.scopes import GraphScope
from infra.sqlite_base import SqliteViewBase, _chunks, boundary_where, forget_where, utc_iso
from schemas.ports.graph import EntityMatch, GraphChangeSet, SentenceIncidence
from schemas.ports.views import Boundary, Forget, Positions, TurnRow
from schemas.sized_lru import SizedLRU
from schemas.versioned_cache import Lru, VersionedCache

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
CREATE INDEX IF NOT EXISTS adjacency_target ON adjacency (target);
CREATE INDEX IF NOT EXISTS mentions_entity_scope ON mentions (entity_id, tenant_id, conversation_id);
-- Kept by triggers in the writes' own transactions, for the bounded query path: how many contexts of
-- each conversation mention an entity as a graph node (hubs are left out of walks), and which
-- sentences mention it (eq. 9's incidence, read per entity instead of per boundary).
CREATE TABLE IF NOT EXISTS entity_degree (
    entity_id TEXT NOT NULL, tenant_id TEXT NOT NULL, conversation_id TEXT NOT NULL, contexts INTEGER NOT NULL,
    PRIMARY KEY (entity_id, tenant_id, conversation_id)) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS mentions_degree_in AFTER INSERT ON mentions WHEN NEW.kind IN ('ner', 'speaker', 'keyword') BEGIN
    INSERT INTO entity_degree VALUES (NEW.entity_id, NEW.tenant_id, NEW.conversation_id, 1)
        ON CONFLICT (entity_id, tenant_id, conversation_id) DO UPDATE SET contexts = contexts + 1;
END;
CREATE TRIGGER IF NOT EXISTS mentions_degree_out AFTER DELETE ON mentions WHEN OLD.kind IN ('ner', 'speaker', 'keyword') BEGIN
    UPDATE entity_degree SET contexts = contexts - 1
        WHERE entity_id = OLD.entity_id AND tenant_id = OLD.tenant_id AND conversation_id = OLD.conversation_id;
    DELETE FROM entity_degree WHERE entity_id = OLD.entity_id AND tenant_id = OLD.tenant_id
        AND conversation_id = OLD.conversation_id AND contexts <= 0;
END;
CREATE TABLE IF NOT EXISTS sentence_entities (
    entity_id TEXT NOT NULL, sentence_id TEXT NOT NULL, tenant_id TEXT NOT NULL, conversation_id TEXT NOT NULL,
    PRIMARY KEY (entity_id, sentence_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS sentence_entities_sentence ON sentence_entities (sentence_id);
CREATE INDEX IF NOT EXISTS sentence_entities_scope ON sentence_entities (entity_id, tenant_id, conversation_id);
CREATE TRIGGER IF NOT EXISTS sentences_entities_in AFTER INSERT ON sentences BEGIN
    INSERT OR IGNORE INTO sentence_entities SELECT value, NEW.sentence_id, NEW.tenant_id, NEW.conversation_id
        FROM json_each(NEW.entity_ids);
END;
CREATE TRIGGER IF NOT EXISTS sentences_entities_out AFTER DELETE ON sentences BEGIN
    DELETE FROM sentence_entities WHERE sentence_id = OLD.sentence_id;
END;
-- Contexts whose turn, node mentions or adjacency changed, in commit order, for the in-memory
-- scopes of infra/graph/scopes.py to follow. Pruned to the last CHANGES_KEPT rows.
CREATE TABLE IF NOT EXISTS graph_changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, context_id TEXT NOT NULL, tenant_id TEXT NOT NULL, conversation_id TEXT NOT NULL);
-- An entity forgotten (nobody mentions it) and named again may come back with another label: its
-- rows carry its id and no conversation.
CREATE TRIGGER IF NOT EXISTS graph_changes_entity_in AFTER INSERT ON entities BEGIN
    INSERT INTO graph_changes (context_id, tenant_id, conversation_id) VALUES (NEW.entity_id, NEW.tenant_id, '');
END;
CREATE TRIGGER IF NOT EXISTS graph_changes_turn_in AFTER INSERT ON turns BEGIN
    INSERT INTO graph_changes (context_id, tenant_id, conversation_id) VALUES (NEW.turn_id, NEW.tenant_id, NEW.conversation_id);
END;
CREATE TRIGGER IF NOT EXISTS graph_changes_turn_out AFTER DELETE ON turns BEGIN
    INSERT INTO graph_changes (context_id, tenant_id, conversation_id) VALUES (OLD.turn_id, OLD.tenant_id, OLD.conversation_id);
END;
CREATE TRIGGER IF NOT EXISTS graph_changes_mention_in AFTER INSERT ON mentions WHEN NEW.kind IN ('ner', 'speaker', 'keyword') BEGIN
    INSERT INTO graph_changes (context_id, tenant_id, conversation_id) VALUES (NEW.context_id, NEW.tenant_id, NEW.conversation_id);
END;
CREATE TRIGGER IF NOT EXISTS graph_changes_mention_out AFTER DELETE ON mentions WHEN OLD.kind IN ('ner', 'speaker', 'keyword') BEGIN
    INSERT INTO graph_changes (context_id, tenant_id, conversation_id) VALUES (OLD.context_id, OLD.tenant_id, OLD.conversation_id);
END;
CREATE TRIGGER IF NOT EXISTS graph_changes_edge_in AFTER INSERT ON adjacency BEGIN
    INSERT INTO graph_changes (context_id, tenant_id, conversation_id)
        VALUES (NEW.source, NEW.tenant_id, NEW.conversation_id), (NEW.target, NEW.tenant_id, NEW.conversation_id);
END;
CREATE TRIGGER IF NOT EXISTS graph_changes_edge_out AFTER DELETE ON adjacency BEGIN
    INSERT INTO graph_changes (context_id, tenant_id, conversation_id)
        VALUES (OLD.source, OLD.tenant_id, OLD.conversation_id), (OLD.target, OLD.tenant_id, OLD.conversation_id);
END;
"""

NODE_KINDS = ("ner", "speaker", "keyword")  # mention kinds that are graph edges (values are not)
ROWS_KEPT = 200_000  # contexts' mentions and sentences kept by id for the bounded path (each a few hundred bytes)
CHANGES_KEPT = 500_000



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
    # 3: entity_degree and sentence_entities (kept by triggers; filled from mentions and sentences on migration).
    format_version = 3

    def _migrate(self) -> None:
        super()._migrate()
        with self._tx() as c:
            c.execute("DELETE FROM entity_degree")
            c.execute("INSERT INTO entity_degree SELECT entity_id, tenant_id, conversation_id, COUNT(*) FROM mentions "
                      "WHERE kind IN ('ner', 'speaker', 'keyword') GROUP BY entity_id, tenant_id, conversation_id")
            c.execute("DELETE FROM sentence_entities")
            c.execute("INSERT OR IGNORE INTO sentence_entities SELECT j.value, s.sentence_id, s.tenant_id, s.conversation_id "
                      "FROM sentences s, json_each(s.entity_ids) j")

    def __init__(self, path, generation: int, cache_size: int = 64, *, max_contexts: int = 200_000):
        """`cache_size`: whole-boundary snapshots kept (conversations, as many as the corpus cache);
        `max_contexts`: contexts the in-memory scopes of bounded walks hold in all
        (MEMSTREAM_VIEWS_GRAPH_MAX_CONTEXTS; least recently used scope first out)."""
        super().__init__(path, generation)
        self._scopes: SizedLRU[GraphScope] = SizedLRU(max_contexts)
        self._seq = self._last_change()
        self._cache: VersionedCache[_Snapshot] = VersionedCache(cache_size)
        # The bounded path reads contexts' mentions and sentences by id, over and over for the
        # candidates of a conversation's questions: both are written once per turn and never
        # rewritten (a turn's analysis is its own; a forget deletes the turn's rows, after which no
        # read asks for that turn), so they are kept by id, least recently used first out.
        self._by_context = Lru(ROWS_KEPT)  # context id -> (its mentions, where it is, their (entity id, label) pairs)
        self._by_sentence = Lru(ROWS_KEPT)  # sentence id -> (context id, entity ids, agent, occurred_at, session)
        self._degrees = Lru(ROWS_KEPT)  # (entity id, (tenant, conversations)) -> (their versions, degree)

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
            c.execute("DELETE FROM graph_changes WHERE seq <= (SELECT MAX(seq) FROM graph_changes) - ?", (CHANGES_KEPT,))
            self._write_positions(c, positions)
            self._bump(c, touched)
        self._by_context.drop([t.turn_id for t in change.put_turns] + list(change.delete_turns))
        if change.forgets:
            self._by_context.clear()
            self._by_sentence.clear()

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

    def align_entities(self, boundary: Boundary, entity_ids: list[str], vectors: np.ndarray, k: int,
                       among: list[str] | None = None) -> list[list[EntityMatch]]:
        if among is not None:
            return self._align_among(boundary, entity_ids, vectors, k, among)
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

    def _align_among(self, boundary: Boundary, entity_ids: list[str], vectors: np.ndarray, k: int,
                     among: list[str]) -> list[list[EntityMatch]]:
        """align_entities with the cosine candidates limited to the named entities that the
        contexts `among` mention (the bounded path's candidates): exact matches are the
        boundary's, as always."""
        exact = self._mentioned(boundary, entity_ids, named_only=False)
        q = np.atleast_2d(np.asarray(vectors, dtype=np.float32)) if len(entity_ids) else np.zeros((0, 0), np.float32)
        pending = [i for i, e in enumerate(entity_ids) if e not in exact and q.shape[0] > i]
        candidates: list[tuple[str, str, np.ndarray]] = []
        if pending and among:
            ids: set[str] = set()
            for found in self._context_rows(boundary, among).values():
                ids.update(eid for eid, _, _, kind in found if kind in ("ner", "speaker"))
            for chunk in _chunks(sorted(ids), 400):
                candidates += [(eid, label, np.frombuffer(vec, dtype=np.float32)) for eid, label, vec in self._conn().execute(
                    f"SELECT entity_id, label, vector FROM entities WHERE entity_id IN ({','.join('?' * len(chunk))}) "
                    "AND length(vector) > 0 ORDER BY entity_id", chunk).fetchall()]
        matrix = np.stack([v for _, _, v in candidates]) if candidates else None
        out: list[list[EntityMatch]] = []
        for i, e in enumerate(entity_ids):
            if e in exact:
                out.append([EntityMatch(e, exact[e], 1.0)])
            elif matrix is None or q.shape[0] <= i:
                out.append([])
            else:
                scores = matrix @ q[i]
                top = np.argsort(-scores, kind="stable")[:k]  # ties: entity-id order
                out.append([EntityMatch(candidates[t][0], candidates[t][1], float(scores[t])) for t in top])
        return out

    def entity_labels(self, boundary: Boundary) -> Mapping[str, str]:
        snap = self._snapshot(boundary)
        if snap.named_labels is None:  # read on every query (the question's lexicon): built once per snapshot
            snap.named_labels = MappingProxyType({snap.entities[i]: snap.entity_labels[i] for i in snap.named})
        return snap.named_labels

    def present(self, boundary: Boundary, entity_ids: list[str]) -> set[str]:
        return set(self._mentioned(boundary, entity_ids, named_only=False))

    def labels_of(self, boundary: Boundary, entity_ids: list[str]) -> dict[str, str]:
        return self._mentioned(boundary, entity_ids, named_only=True)

    def _mentioned(self, b: Boundary, entity_ids: list[str], named_only: bool) -> dict[str, str]:
        """entity id -> label of the given entities that a context inside the boundary mentions as a
        graph node (values are not nodes; named ones only: those with a vector). Index seeks per
        entity, whatever the boundary's size."""
        out: dict[str, str] = {}
        scope, scope_args = _mention_scope(b)
        for chunk in _chunks(list(dict.fromkeys(entity_ids)), 400):
            named = " AND length(e.vector) > 0" if named_only else ""
            rows = self._conn().execute(
                f"SELECT e.entity_id, e.label FROM entities e WHERE e.entity_id IN ({','.join('?' * len(chunk))}){named} "
                f"AND EXISTS (SELECT 1 FROM mentions m{scope['join']} WHERE m.entity_id = e.entity_id "
                f"AND m.kind IN ('ner', 'speaker', 'keyword') AND {scope['where']})",
                (*chunk, *scope_args)).fetchall()
            out.update(dict(rows))
        return out

    def context_mentions(self, boundary: Boundary, context_ids: list[str] | None = None) -> dict[str, list[tuple[str, str]]]:
        if context_ids is None:
            return self._snapshot(boundary).context_mentions
        return {cid: pairs for cid, pairs in self._context_rows(boundary, context_ids, pairs=True).items() if pairs}

    def _context_rows(self, b: Boundary, context_ids: list[str], *, pairs: bool = False) -> dict[str, tuple]:
        """Each context's mentions (entity id, label, weight, kind) in entity-id order — or, with
        `pairs`, their (entity id, label) list, kept beside them because the bounded path asks for
        it every question — for the contexts inside the boundary; kept by id with where the context
        is (tenant, conversation, session, agent, time), against which every read's boundary is
        checked. What is kept is shared between reads: no caller changes it."""
        found, missing = self._by_context.get_many(dict.fromkeys(context_ids))
        if missing:
            fetched: dict[str, list] = {}
            where: dict[str, tuple] = {}
            for chunk in _chunks(missing, 400):
                marks = ",".join("?" * len(chunk))
                # By the primary keys: a tenant condition in SQL makes the planner walk the tenant's index.
                for cid, tenant, conv, session, agent, at in self._conn().execute(
                        f"SELECT turn_id, tenant_id, conversation_id, session_id, agent_id, occurred_at FROM turns "
                        f"WHERE turn_id IN ({marks})", chunk).fetchall():
                    where[cid] = (tenant, conv, session, agent, at)
                    fetched[cid] = []
                for cid, eid, label, weight, kind in self._conn().execute(
                        f"SELECT m.context_id, m.entity_id, e.label, m.weight, m.kind FROM mentions m "
                        f"JOIN entities e ON e.entity_id = m.entity_id WHERE m.context_id IN ({marks}) "
                        "ORDER BY m.context_id, m.entity_id", chunk).fetchall():
                    if cid in fetched:
                        fetched[cid].append((eid, label, weight, kind))
            rows = {cid: (tuple(v), where[cid], [(eid, label) for eid, label, _, _ in v]) for cid, v in fetched.items()}
            self._by_context.put_many(rows)
            found.update(rows)
        at = 2 if pairs else 0
        return {cid: row[at] for cid, row in found.items() if _inside_boundary(b, *row[1])}

    def sentence_incidence(self, boundary: Boundary, entity_ids: list[str] | None = None) -> SentenceIncidence:
        if entity_ids is None:
            return self._snapshot(boundary).sentences
        where, args = boundary_where(Boundary(boundary.tenant_id, boundary.conversation_ids), "se.")
        sentence_ids: set[str] = set()
        for chunk in _chunks(list(dict.fromkeys(entity_ids)), 400):
            sentence_ids.update(r[0] for r in self._conn().execute(
                f"SELECT se.sentence_id FROM sentence_entities se WHERE se.entity_id IN ({','.join('?' * len(chunk))}) AND {where}",
                (*chunk, *args)).fetchall())
        found, missing = self._by_sentence.get_many(sorted(sentence_ids))
        for chunk in _chunks(missing, 400):
            rows = self._conn().execute(
                f"SELECT s.sentence_id, s.context_id, s.entity_ids, t.agent_id, t.occurred_at, t.session_id FROM sentences s "
                f"JOIN turns t ON t.turn_id = s.context_id WHERE s.sentence_id IN ({','.join('?' * len(chunk))})", chunk).fetchall()
            fetched = {sid: (cid, tuple(json.loads(ents)), agent, at, session) for sid, cid, ents, agent, at, session in rows}
            self._by_sentence.put_many(fetched)
            found.update(fetched)
        return SentenceIncidence.build((sid, cid, ents) for sid, (cid, ents, agent, at, session) in found.items()
                                       if _row_admitted(b=boundary, agent=agent, at=at, session=session))

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
                              tolerance: float = 1e-7, contexts: list[str] | None = None, contexts_total: int | None = None,
                              hub_cap: int | None = None, per_entity: int = 200, reach: int = 32) -> dict[str, float]:
        if contexts is not None:
            snap = self._neighbourhood(boundary, reset, contexts, contexts_total, hub_cap, per_entity, reach, max_share, exclude_labels)
            max_share, exclude_labels = 1.0, ()  # applied to the neighbourhood itself, by each entity's degree in the boundary
        else:
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

    def _neighbourhood(self, b: Boundary, reset: dict[str, float], contexts: list[str], contexts_total: int | None,
                       hub_cap: int | None, per_entity: int, reach_entities: int, max_share: float,
                       exclude_labels: tuple[str, ...]) -> _Snapshot:
        """The part of the boundary's graph a bounded walk runs on: the given contexts and the reset
        vector's, the contexts that mention the `reach_entities` most activated reset entities (the
        `per_entity` strongest mentions of each), the entities those contexts mention and the
        session adjacency between them. An entity whose degree in the boundary passes `hub_cap` or
        the share `max_share` of `contexts_total` (speakers of long conversations) is left out, so no
        step of the walk touches a number of contexts that grows with the boundary. Read from the
        boundary's maintained scope (infra/graph/scopes.py) when one covers it."""
        limit = min(hub_cap if hub_cap is not None else float("inf"), (contexts_total or float("inf")) * max_share)
        with self._scopes.lock:
            scope = self._covering_scope(b)
            if scope is None:
                return self._neighbourhood_sql(b, reset, contexts, contexts_total, hub_cap, per_entity, reach_entities,
                                               max_share, exclude_labels)
            reset_contexts = [n for n in reset if n.startswith("t_")]
            reset_entities = [n for n in reset if not n.startswith("t_")]
            reach = sorted((e for e in reset_entities if 0 < scope.degree_of(e) <= limit),
                           key=lambda e: (-reset[e], e))[:reach_entities]
            found = dict.fromkeys([*contexts, *reset_contexts])
            admits = _place_filter(b, scope)
            for e in reach:
                found.update(dict.fromkeys(scope.strongest(e, per_entity, admits)))
            # Given ids outside the boundary are dropped.
            ctx = sorted(c for c in found if c in scope.contexts and (admits is None or admits(c)))
            held = [scope.contexts[c] for c in ctx]
            ents = np.concatenate([e for e, _ in held]) if held else np.zeros(0, np.int64)
            weights = np.concatenate([w for _, w in held]) if held else np.zeros(0)
            rows = np.repeat(np.arange(len(ctx)), [len(e) for e, _ in held]) if held else np.zeros(0, np.int64)
            keep = (weights > 0) & (scope.degree[ents] <= limit)
            if exclude_labels:
                labels, excluded = scope.labels, set(exclude_labels)
                keep &= np.fromiter((labels[p] not in excluded for p in ents.tolist()), bool, len(ents))
            ents, weights, rows = ents[keep], weights[keep], rows[keep]
            present = np.unique(ents)
            entities = sorted(scope.entity_ids[p] for p in present.tolist())  # entity-id order, as a fresh build's
            column = np.empty(len(present), np.int64)
            column[np.searchsorted(present, np.fromiter((scope.entity_pos[e] for e in entities), np.int64, len(entities)))] = \
                np.arange(len(entities))
            mm = sp.csr_matrix((weights, (rows, column[np.searchsorted(present, ents)])), shape=(len(ctx), len(entities)),
                               dtype=np.float64)
            pairs = set().union(*(scope.edges.get(c, ()) for c in ctx)) if ctx else set()
            entity_labels = [scope.labels[scope.entity_pos[e]] for e in entities]
        return _walk_snapshot(ctx, entities, entity_labels, mm, pairs)

    # -- the bounded path: maintained scopes --------------------------------------------------
    def _last_change(self) -> int:
        return int(self._conn().execute("SELECT MAX(seq) FROM graph_changes").fetchone()[0] or 0)

    def _covering_scope(self, b: Boundary) -> GraphScope | None:
        """The maintained scope holding the boundary's conversation (or the whole tenant's, with no
        conversation named), brought up to date; None for several conversations. Sessions, agents
        and times the boundary sets are the caller's to filter (`_place_filter`). Called under the
        scopes' lock."""
        if b.conversation_ids is not None and len(b.conversation_ids) != 1:
            return None
        self._sync()
        conv = b.conversation_ids[0] if b.conversation_ids is not None else None
        return self._scopes.get((b.tenant_id, conv), lambda: self._load_scope(b.tenant_id, conv))

    def scope_contents(self, fresh: bool = False) -> dict[tuple[str, str | None], dict]:
        """The content of every loaded scope, brought up to date (`fresh`: the same scopes loaded
        again from the tables instead) — what the contract suite holds equal."""
        with self._scopes.lock:
            self._sync()
            out = {}
            for (tenant, conv), scope in self._scopes.loaded():
                if fresh:
                    scope = self._load_scope(tenant, conv)
                out[(tenant, conv)] = scope.content()
            return out

    def _sync(self) -> None:
        """Apply to the loaded scopes what was written since the last read."""
        rows = self._conn().execute("SELECT seq, context_id, tenant_id, conversation_id FROM graph_changes WHERE seq > ? ORDER BY seq",
                                    (self._seq,)).fetchall()
        if not rows:
            return
        oldest = self._conn().execute("SELECT MIN(seq) FROM graph_changes").fetchone()[0]
        if oldest is not None and oldest > self._seq + 1:  # pruned past this reader: start the scopes again
            self._scopes.clear()
            self._seq = rows[-1][0]
            return
        loaded = dict(self._scopes.loaded())
        changed: dict[tuple[str, str | None], set[str]] = defaultdict(set)
        named: set[str] = set()
        for _, cid, tenant, conv in rows:
            if conv == "":  # an entity (re)named
                named.add(cid)
                continue
            for key in ((tenant, conv), (tenant, None)):
                if key in loaded:
                    changed[key].add(cid)
        if named and loaded:
            for chunk in _chunks(sorted(named), 400):
                labels = dict(self._conn().execute(
                    f"SELECT entity_id, label FROM entities WHERE entity_id IN ({','.join('?' * len(chunk))})", chunk).fetchall())
                for scope in loaded.values():
                    scope.relabel(labels)
        for (tenant, conv), ids in changed.items():
            self._refresh(loaded[(tenant, conv)], tenant, conv, sorted(ids))
        self._seq = rows[-1][0]

    def _refresh(self, scope: GraphScope, tenant: str, conv: str | None, context_ids: list[str]) -> None:
        """Re-read these contexts of the scope from the tables (a context no longer in the ledger leaves it)."""
        scope.drop(context_ids)
        for chunk in _chunks(context_ids, 400):
            marks = ",".join("?" * len(chunk))
            # By the primary key, the scope checked here: a tenant condition in SQL makes the planner walk the tenant's index.
            places = [(cid, session, agent, at) for cid, t, c, session, agent, at in self._conn().execute(
                f"SELECT turn_id, tenant_id, conversation_id, session_id, agent_id, occurred_at FROM turns WHERE turn_id IN ({marks})",
                chunk).fetchall() if t == tenant and (conv is None or c == conv)]
            if not places:
                continue
            present = [p[0] for p in places]
            marks = ",".join("?" * len(present))
            scope.put(places, self._conn().execute(
                f"SELECT m.context_id, m.entity_id, e.label, m.weight FROM mentions m JOIN entities e ON e.entity_id = m.entity_id "
                f"WHERE m.context_id IN ({marks}) AND m.kind IN ('ner', 'speaker', 'keyword')", present).fetchall(),
                self._conn().execute(f"SELECT source, target FROM adjacency WHERE source IN ({marks}) OR target IN ({marks})",
                                     (*present, *present)).fetchall())

    def _load_scope(self, tenant: str, conv: str | None) -> GraphScope:
        scope = GraphScope()
        where, args = "tenant_id=?", [tenant]
        if conv is not None:
            where, args = where + " AND conversation_id=?", [tenant, conv]
        conn = self._conn()
        scope.put(conn.execute(f"SELECT turn_id, session_id, agent_id, occurred_at FROM turns WHERE {where}", args).fetchall(),
                  conn.execute(f"SELECT m.context_id, m.entity_id, e.label, m.weight FROM mentions m JOIN entities e "
                               f"ON e.entity_id = m.entity_id WHERE m.{where.replace(' AND ', ' AND m.')} "
                               "AND m.kind IN ('ner', 'speaker', 'keyword')", args).fetchall(),
                  conn.execute(f"SELECT source, target FROM adjacency WHERE {where}", args).fetchall())
        return scope

    def _neighbourhood_sql(self, b: Boundary, reset: dict[str, float], contexts: list[str], contexts_total: int | None,
                       hub_cap: int | None, per_entity: int, reach_entities: int, max_share: float,
                       exclude_labels: tuple[str, ...]) -> _Snapshot:
        """_neighbourhood for a boundary no scope covers (several conversations, or sessions, agents
        or times set), from SQL: the part of the boundary's graph a bounded walk runs on: the given contexts and the reset
        vector's, the contexts that mention the `reach_entities` most activated reset entities (the
        `per_entity` strongest mentions of each), the entities those contexts mention and the
        session adjacency between them. An entity whose degree in the boundary passes `hub_cap` or
        the share `max_share` of `contexts_total` (speakers of long conversations) is left out, so no
        step of the walk touches a number of contexts that grows with the boundary."""
        conn = self._conn()
        reset_contexts = [n for n in reset if n.startswith("t_")]
        reset_entities = [n for n in reset if not n.startswith("t_")]
        degree = self.entity_degrees(b, reset_entities)
        limit = min(hub_cap if hub_cap is not None else float("inf"), (contexts_total or float("inf")) * max_share)
        # The walk reaches beyond the candidates through the strongest activated entities only: the
        # many weakly activated ones (propagation's) carry little of the reset mass.
        reach = sorted((e for e in reset_entities if 0 < degree.get(e, 0) <= limit), key=lambda e: (-reset[e], e))[:reach_entities]
        scope, scope_args = _mention_scope(b)
        found = dict.fromkeys([*contexts, *reset_contexts])
        for chunk in _chunks(reach, 100):
            found.update(dict.fromkeys(r[0] for r in conn.execute(
                f"SELECT context_id FROM (SELECT m.context_id, ROW_NUMBER() OVER (PARTITION BY m.entity_id ORDER BY m.weight DESC, "
                f"m.context_id) AS n FROM mentions m{scope['join']} WHERE m.entity_id IN ({','.join('?' * len(chunk))}) "
                f"AND {scope['where']}) WHERE n <= ?", (*chunk, *scope_args, per_entity)).fetchall()))
        rows = self._context_rows(b, list(found))  # the contexts inside the boundary (given ids outside it are dropped)
        ctx = sorted(rows)
        ctx_index = {c: i for i, c in enumerate(ctx)}
        # Mention edges in bulk: one flat list of (context row, entity, weight), node kinds only.
        flat = [(ctx_index[cid], eid, w, label) for cid, found_rows in rows.items()
                for eid, label, w, kind in found_rows if kind in NODE_KINDS and w > 0]
        labels = {eid: label for _, eid, _, label in flat}
        candidates = [e for e in labels if labels[e] not in exclude_labels]
        degree.update(self.entity_degrees(b, [e for e in candidates if e not in degree]))
        entities = sorted(e for e in candidates if degree.get(e, 0) <= limit)
        ent_index = {e: i for i, e in enumerate(entities)}
        keep = [(r, ent_index[e], w) for r, e, w, _ in flat if e in ent_index]
        mm = sp.csr_matrix(([w for _, _, w in keep], ([r for r, _, _ in keep], [c for _, c, _ in keep])),
                           shape=(len(ctx), len(entities)), dtype=np.float64)
        pairs = set()
        for chunk in _chunks(ctx, 400):
            marks = ",".join("?" * len(chunk))
            pairs.update(conn.execute(f"SELECT source, target FROM adjacency WHERE source IN ({marks}) OR target IN ({marks})",
                                      (*chunk, *chunk)).fetchall())
        return _walk_snapshot(ctx, entities, [labels[e] for e in entities], mm, pairs)

    def entity_degrees(self, b: Boundary, entity_ids: list[str]) -> dict[str, int]:
        """Contexts of the boundary's conversations that mention each entity as a graph node. Kept
        per entity and boundary until one of the boundary's conversations is written again (or read
        from the boundary's maintained scope when one covers its conversations)."""
        with self._scopes.lock:
            held = self._covering_scope(Boundary(b.tenant_id, b.conversation_ids))
            if held is not None:
                return {e: n for e in dict.fromkeys(entity_ids) if (n := held.degree_of(e))}
        version = tuple(self.conversation_version(b.tenant_id, c) for c in (b.conversation_ids or (None,)))
        scope = (b.tenant_id, b.conversation_ids)
        kept, missing = self._degrees.get_many([(e, scope) for e in dict.fromkeys(entity_ids)])
        out = {e: n for (e, _), (v, n) in kept.items() if v == version and n}
        ask = [e for (e, _), (v, _) in kept.items() if v != version] + [e for e, _ in missing]
        where, args = boundary_where(Boundary(b.tenant_id, b.conversation_ids), "d.")
        fetched: dict[str, int] = {}
        for chunk in _chunks(ask, 400):
            fetched.update(dict(self._conn().execute(
                f"SELECT d.entity_id, SUM(d.contexts) FROM entity_degree d WHERE d.entity_id IN ({','.join('?' * len(chunk))}) "
                f"AND {where} GROUP BY d.entity_id", (*chunk, *args)).fetchall()))
        self._degrees.put_many({(e, scope): (version, fetched.get(e, 0)) for e in ask})
        out.update({e: n for e, n in fetched.items() if n})
        return out

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


def _mention_scope(b: Boundary) -> tuple[dict[str, str], list]:
    """SQL (a join and a condition on `m`, the mentions) for mentions by contexts inside the
    boundary: tenant and conversations from the mentions themselves; sessions, agents and times
    through the ledger's turns when the boundary sets them."""
    where, args = boundary_where(Boundary(b.tenant_id, b.conversation_ids), "m.")
    if b.session_ids is None and b.agent_ids is None and b.since is None and b.until is None:
        return {"join": "", "where": where}, args
    cond, extra = [where], list(args)
    if b.session_ids is not None:
        cond.append(f"t.session_id IN ({','.join('?' * len(b.session_ids))})")
        extra += list(b.session_ids)
    if b.agent_ids is not None:
        cond.append(f"t.agent_id IN ({','.join('?' * len(b.agent_ids))})")
        extra += list(b.agent_ids)
    if b.since is not None:
        cond.append("t.occurred_at >= ?")
        extra.append(utc_iso(b.since))
    if b.until is not None:
        cond.append("t.occurred_at <= ?")
        extra.append(utc_iso(b.until))
    return {"join": " JOIN turns t ON t.turn_id = m.context_id", "where": " AND ".join(cond)}, extra


def _walk_snapshot(ctx: list[str], entities: list[str], labels: list[str], mm: sp.csr_matrix, pairs: set[tuple[str, str]]) -> _Snapshot:
    """A bounded walk's snapshot: the contexts (sorted), the entities (sorted) with their labels,
    the mention matrix between them and the session adjacency rows among the contexts."""
    ctx_index = {c: i for i, c in enumerate(ctx)}
    edges = [(ctx_index[s_], ctx_index[t_]) for s_, t_ in pairs if s_ in ctx_index and t_ in ctx_index]
    adj_rows = [i for s_, t_ in edges for i in (s_, t_)]
    adj_cols = [i for s_, t_ in edges for i in (t_, s_)]
    adj = sp.csr_matrix((np.ones(len(adj_rows)), (adj_rows, adj_cols)), shape=(len(ctx), len(ctx)), dtype=np.float64)
    index = {**ctx_index, **{e: len(ctx) + i for i, e in enumerate(entities)}}
    return _Snapshot(contexts=ctx, context_rows={}, entities=entities, entity_names=[""] * len(entities),
                     entity_labels=labels, named=[], named_vectors=np.zeros((0, 0), np.float32),
                     index=index, mention_matrix=mm, adjacency=adj, sentences=SentenceIncidence.build([]))


def _place_filter(b: Boundary, scope: GraphScope) -> Callable[[str], bool] | None:
    """Whether a context of the scope is inside the boundary's sessions, agents and times (None:
    the boundary sets none of them)."""
    if b.session_ids is None and b.agent_ids is None and b.since is None and b.until is None:
        return None
    places = scope.places
    return lambda c: (p := places.get(c)) is not None and _row_admitted(b=b, session=p[0], agent=p[1], at=p[2])


def _inside_boundary(b: Boundary, tenant: str, conversation: str, session: str, agent: str, at: str) -> bool:
    if tenant != b.tenant_id or (b.conversation_ids is not None and conversation not in b.conversation_ids):
        return False
    return _row_admitted(b=b, agent=agent, at=at, session=session)


def _row_admitted(*, b: Boundary, agent: str, at: str, session: str) -> bool:
    if b.session_ids is not None and session not in b.session_ids:
        return False
    if b.agent_ids is not None and agent not in b.agent_ids:
        return False
    when = datetime.fromisoformat(at)
    return (b.since is None or when >= b.since) and (b.until is None or when <= b.until)


def _admits(t: TurnRow, b: Boundary) -> bool:
    if b.agent_ids is not None and t.agent_id not in b.agent_ids:
        return False
    if b.since is not None and t.occurred_at < b.since:
        return False
    if b.until is not None and t.occurred_at > b.until:
        return False
    return True
