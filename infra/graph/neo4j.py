"""Graph view on Neo4j: the entity–context graph as a property graph, personalised PageRank
computed on the server by the Graph Data Science library (GDS >= 2.18 for weighted sources).

Data model (one Neo4j database; every memstream node carries the generation `gen`, so replay
builds generation N+1 beside N and every query filters on it):

    (:Context {gen, turn_id, tenant_id, conversation_id, session_id, event_id, agent_id,
               role, turn_index, occurred_at: DateTime, partition, offset, content_hash})
                                                          one per turn: graph node + turn ledger
    (:Entity {gen, entity_id, tenant_id, label, vector: [float]})
                                                          no `vector` on keyword entities
    (:Context)-[:MENTIONS {count, weight, kind}]->(:Entity)     eq. 4 weight; kind ner|speaker|keyword|value
    (:Context)-[:NEXT {session_id}]->(:Context)                 adjacency, replaced per session
    (:Context)-[:HAS_SENTENCE]->(:Sentence {gen, sentence_id, context_id, idx, start, end, entity_ids})
    (:MemstreamPosition {view: 'graph', gen, partition, next_offset})
    (:MemstreamVersion {view: 'graph', gen, tenant_id, conversation_id, version})

No plaintext. Neo4j keeps a deleted record's bytes in its store files (until the record is
reused) and in its transaction logs (until they rotate out), so nothing a forget must erase is
ever written here: a context carries no text, speaker or source_ref (the projection never reads
a stored turn's text: schemas/ports/graph.py) and an entity no name (its id is a digest of
tenant and normalised name, which is how the query side finds it: reads return ids). What is
left are ids, times, labels, eq. 4 weights, sentence spans and the entities' name vectors.

Uniqueness constraints on (gen, turn_id), (gen, entity_id), (gen, sentence_id) and on the
position/version keys back every MERGE; composite indexes on (gen, tenant_id[, conversation_id])
serve the boundary reads. Sentences hang off their context so that deleting a turn
(DETACH DELETE) takes its mentions, adjacency and sentences with it.

Writes: one explicit transaction per change set — forgets (with garbage collection of entities
nobody mentions any more), turn deletions, ledger puts, entities, mentions, sentences, adjacency,
then the positions and the conversation-version bumps — all batched with UNWIND and MERGE on
deterministic ids, so the view and its positions commit together and a replayed change set only
rewrites the same nodes.

Entity alignment: the exact entity first (the id of the normalised name), else cosine top-k over
the boundary's named entities computed by Neo4j (`vector.similarity.cosine`, which returns
(1 + cos) / 2: mapped back to cos). A vector index is not used: `db.index.vector.queryNodes`
searches the whole index approximately and can only be filtered afterwards, so the top-k of
*the boundary's* entities (those mentioned by its contexts, a relationship condition) could be
missing from its answer.

Personalised PageRank runs on the server:

1. Projection (Cypher aggregation `gds.graph.project`): the boundary's contexts, every entity
   they mention as a graph node (kinds ner/speaker/keyword), MENTIONS with weight > 0 as
   relationships weighted by eq. 4 and NEXT between two boundary contexts weighted by
   `adjacency_weight` (when > 0), all undirected (`undirectedRelationshipTypes: ['*']`, i.e.
   both directions). Excluded labels and hubs (mentioned by more than `max_share` of the
   contexts) stay in the projection as isolated nodes, exactly as they stay in the embedded
   twin's matrix with their edges zeroed: reset mass put on them must still count.
2. `gds.pageRank.stream` with dampingFactor = damping, relationshipWeightProperty 'w',
   maxIterations = max_iterations, weighted sourceNodes [[node id, r_i]] (r normalised to sum 1;
   node ids read once per projection from the projection itself, `_node_ids`, so a question
   sends ids and gets ids and scores back, mapped to turn ids here), concurrency 1 (GDS's threads
   cost more than they save on a boundary's ~10^3 nodes)
   and tolerance = tolerance / node count: GDS stops propagating a node's delta once it is
   <= its tolerance, while the port's tolerance bounds the L1 change of the whole vector;
   with the caller's value per node, the mass left behind added up to ~2e-4 on LoCoMo graphs.
3. Dangling nodes. GDS computes x = (1-d) r + d P^T x and drops the mass that reaches a node
   without relationships; the embedded definition sends that mass back to r:
   pi = (1-d) r + d (P^T pi + D(pi) r). Both are linear in r, so pi = c * x with one scalar c,
   and since pi sums to 1, pi = x / sum(x). The query divides by the sum of all streamed
   scores on the server. Converged, both agree to ~1e-8. Cut short by max_iterations they
   differ: GDS sums the series (1-d) sum_k (d P^T)^k r term by term (error ~ d^k), the embedded
   power iteration starts from r and its error shrinks faster, so few iterations (the query
   service's 30 at d = 0.8) leave GDS ~1e-4 away where the embedded store is ~1e-7 away.

The bounded query path (`contexts` given) does not project the boundary: it reads a
neighbourhood with Cypher — the given contexts and the reset's, the `per_entity` strongest
contexts of each reset entity, the entities they mention and the NEXT edges between them — and
runs the same power iteration as the embedded store on it in memory (scipy): a neighbourhood is
a few thousand nodes at most, which a GDS projection would cost more to build than to walk.
Hubs are found without counting a hub's every mention: a degree is counted up to the cap that
matters (`_degrees`), so no read of the walk grows with the boundary.

Projection caching and invalidation. A projection is named
`memstream-graph-g<gen>-<key>-<version>`: `key` hashes the boundary (tenant, conversations,
sessions, agents, since/until) and the walk parameters (adjacency_weight, excluded labels,
max_share), `version` hashes the boundary's conversation versions (bumped in the same
transaction as every write). A changed version therefore never hits a stale projection; the
first reader that builds the new one drops its older siblings (same key, other version). Names
are deterministic, so processes share projections; each store keeps an LRU of the names it
uses (`max_projections`, default 8), drops what falls out of it, and drops the rest on close().
A reader whose projection was dropped under it (by another process's LRU) rebuilds it once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
from collections import OrderedDict, defaultdict
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Iterator, Mapping

import numpy as np
import scipy.sparse as sp
from neo4j import exceptions as neo_exc

from infra.neo4j_base import connect, drop_generation_data, ensure_schema, projection_prefix, props_to_turn, translated, turn_props, utc
from infra.turn_docs import ledger_dump
from schemas import faults
from schemas.errors import MemstreamError, StoreError
from schemas.ordering import order_turns
from schemas.ports.graph import EntityMatch, GraphChangeSet, SentenceIncidence
from schemas.ports.views import Boundary, Forget, Positions, TurnRow, once_per_request

log = logging.getLogger(__name__)

VIEW = "graph"
NODE_KINDS = ["ner", "speaker", "keyword"]  # mention kinds that are graph edges (values are not)
# Activated entities through which a bounded walk reaches contexts beyond the candidates: the
# strongest ones (by reset mass, then id); the many weakly activated ones carry little of the mass.
# The embedded store's value (infra/graph/sqlite.py), so both walk the same neighbourhood.
REACH_ENTITIES = 32
_UNCAPPED = 2**62  # a LIMIT no count reaches
_PAST, _FUTURE = datetime(1, 1, 1, tzinfo=timezone.utc), datetime(9999, 12, 31, tzinfo=timezone.utc)
_BATCH = 2000  # UNWIND rows per statement

_SCHEMA = [
    "CREATE CONSTRAINT memstream_context_key IF NOT EXISTS FOR (n:Context) REQUIRE (n.gen, n.turn_id) IS UNIQUE",
    "CREATE CONSTRAINT memstream_entity_key IF NOT EXISTS FOR (n:Entity) REQUIRE (n.gen, n.entity_id) IS UNIQUE",
    "CREATE CONSTRAINT memstream_sentence_key IF NOT EXISTS FOR (n:Sentence) REQUIRE (n.gen, n.sentence_id) IS UNIQUE",
    "CREATE CONSTRAINT memstream_position_key IF NOT EXISTS FOR (n:MemstreamPosition) REQUIRE (n.view, n.gen, n.partition) IS UNIQUE",
    "CREATE CONSTRAINT memstream_version_key IF NOT EXISTS FOR (n:MemstreamVersion) "
    "REQUIRE (n.view, n.gen, n.tenant_id, n.conversation_id) IS UNIQUE",
    "CREATE INDEX memstream_context_tenant IF NOT EXISTS FOR (n:Context) ON (n.gen, n.tenant_id)",
    "CREATE INDEX memstream_context_scope IF NOT EXISTS FOR (n:Context) ON (n.gen, n.tenant_id, n.conversation_id)",
    "CREATE INDEX memstream_entity_tenant IF NOT EXISTS FOR (n:Entity) ON (n.gen, n.tenant_id)",
    "CREATE INDEX memstream_version_tenant IF NOT EXISTS FOR (n:MemstreamVersion) ON (n.view, n.gen, n.tenant_id)",
]


def _digest(*parts: object) -> str:
    return hashlib.blake2b(repr(parts).encode("utf-8"), digest_size=8).hexdigest()


def _chunks(items: list, size: int = _BATCH) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _scope(b: Boundary, var: str = "c") -> tuple[str, dict]:
    """Cypher condition on a Context variable for a boundary, with its parameters. Only the
    parts the boundary sets are emitted, so the planner can seek the composite indexes."""
    cond, params = [f"{var}.gen = $gen", f"{var}.tenant_id = $tenant"], {"tenant": b.tenant_id}
    if b.conversation_ids is not None:
        cond.append(f"{var}.conversation_id IN $convs")
        params["convs"] = list(b.conversation_ids)
    if b.session_ids is not None:
        cond.append(f"{var}.session_id IN $sessions")
        params["sessions"] = list(b.session_ids)
    if b.agent_ids is not None:
        cond.append(f"{var}.agent_id IN $agents")
        params["agents"] = list(b.agent_ids)
    if b.since is not None:
        cond.append(f"{var}.occurred_at >= $since")
        params["since"] = utc(b.since)
    if b.until is not None:
        cond.append(f"{var}.occurred_at <= $until")
        params["until"] = utc(b.until)
    return " AND ".join(cond), params


def _admits(b: Boundary, var: str = "c") -> tuple[str, dict]:
    """The boundary's condition on a Context variable as one query text, with parameters of the
    same types, whatever parts the boundary sets (an unset list is all-admitting by its flag, an
    unset time the far past or future), for reads that reach their contexts by id or by
    relationship and only filter them. Neo4j caches a plan per text and parameter types; a
    plan per boundary shape cost ~50-100 ms of planning the first time each was met."""
    cond = (f"{var}.gen = $gen AND {var}.tenant_id = $tenant AND ($any_conv OR {var}.conversation_id IN $convs) "
            f"AND ($any_session OR {var}.session_id IN $sessions) AND ($any_agent OR {var}.agent_id IN $agents) "
            f"AND {var}.occurred_at >= $since AND {var}.occurred_at <= $until")
    params: dict = {"tenant": b.tenant_id, "since": utc(b.since) if b.since is not None else _PAST,
                    "until": utc(b.until) if b.until is not None else _FUTURE}
    for name, flag, values in (("convs", "any_conv", b.conversation_ids), ("sessions", "any_session", b.session_ids),
                               ("agents", "any_agent", b.agent_ids)):
        # "\x00" is no id (schemas/events.py ID_PATTERN): a list of one string that admits nothing.
        params[flag], params[name] = values is None, list(values) if values else ["\x00"]
    return cond, params


def _forget_scope(forget: Forget) -> tuple[str, dict]:
    """Cypher condition on a Context `c` for the turns a forget covers (ForgetScope.covers)."""
    s = forget.scope
    cond, params = ["c.gen = $gen", "c.tenant_id = $tenant"], {"tenant": forget.tenant_id}
    if s.level in ("conversation", "session", "turn"):
        cond.append("c.conversation_id = $conv")
        params["conv"] = s.conversation_id
    if s.level == "session":
        cond.append("c.session_id = $session")
        params["session"] = s.session_id
    if s.level == "turn":
        cond.append("c.event_id = $event")
        params["event"] = s.event_id
    if s.level == "agent":
        cond.append("c.agent_id = $agent")
        params["agent"] = s.agent_id
    if s.occurred_before is not None:
        cond.append("c.occurred_at < $before")
        params["before"] = utc(s.occurred_before)
    return " AND ".join(cond), params


class Neo4jGraphStore:
    backend = "neo4j"
    remote = True
    view = VIEW
    erasure_deferred_seconds = 0.0  # nothing to erase: what a forget removes was never written (module docstring)

    def erase_pending(self) -> float | None:
        return None

    def erase_due(self) -> float | None:
        return None

    def __init__(self, uri: str, generation: int, *, auth: tuple[str, str] | None = None, database: str | None = None,
                 max_projections: int = 8, pagerank_concurrency: int = 1, **driver_config):
        self.uri = uri
        self.generation = generation
        self.database = database
        self.max_projections = max_projections
        # GDS's threads per PageRank call (its default is 4). A boundary is one conversation's
        # graph, ~10^3 nodes: handing it to 4 threads cost more than it saved (compute 51 vs 21 ms
        # p50 on conv-26, 2 cores); raise it for boundaries of 10^5+ nodes on a larger server.
        self.pagerank_concurrency = pagerank_concurrency
        self._driver = connect(uri, auth, **driver_config)  # lazy: no I/O until the first query
        self._ready = False
        self._ready_lock = threading.Lock()
        self._projections: OrderedDict[str, int] = OrderedDict()  # name -> node count, the ones this store uses, LRU order
        self._node_maps: OrderedDict[str, tuple[dict[str, int], dict[int, str]]] = OrderedDict()  # name -> _node_ids(name)
        self._proj_lock = threading.Lock()
        self._read_cache: OrderedDict[tuple, object] = OrderedDict()  # (read, boundary key, versions) -> value, LRU order
        self._gds_checked = False

    # -- plumbing --------------------------------------------------------------------------
    def _session(self):
        if not self._ready:
            with self._ready_lock, translated(self.uri, "creating the graph view's constraints and indexes"):
                if not self._ready:
                    with self._driver.session(database=self.database) as s:
                        ensure_schema(s, _SCHEMA)
                    self._ready = True
        return self._driver.session(database=self.database)

    def _query(self, what: str, query: str, **params) -> list:
        """One auto-commit query bound to this generation (`$gen`); `what` names it in errors."""
        with translated(self.uri, what), self._session() as s:
            return list(s.run(query, gen=self.generation, **params))

    def drop_generation(self) -> None:
        """Delete this generation's nodes and GDS projections (a retired generation's storage)."""
        with self._proj_lock:
            self._projections.clear()
            self._node_maps.clear()
            self._read_cache.clear()
        with translated(self.uri, f"dropping graph generation {self.generation}"), self._session() as s:
            drop_generation_data(s, VIEW, self.generation)

    def close(self) -> None:
        """Drop this store's GDS projections (they hold server heap), then the driver."""
        with self._proj_lock:
            names, self._projections = list(self._projections), OrderedDict()
        try:
            for name in names:
                self._drop_projection(name)
        except MemstreamError as exc:  # closing must not fail; the next reader of a newer version drops leftovers
            log.warning("gds projections left on the server count=%d reason=%s", len(names), exc)
        finally:
            self._driver.close()

    # -- writes --------------------------------------------------------------------------
    def apply(self, change: GraphChangeSet, positions: Positions) -> None:
        """The whole change set, the positions and the version bumps in one transaction."""
        with translated(self.uri, f"applying a change set to graph generation {self.generation}"), self._session() as s:
            with s.begin_transaction() as tx:
                self._apply(tx, change, positions)
                tx.commit()

    def _apply(self, tx, change: GraphChangeSet, positions: Positions) -> None:
        gen = self.generation
        touched: set[tuple[str, str]] = set()
        for forget in change.forgets:
            touched |= self._forget(tx, forget)
        for chunk in _chunks(change.delete_turns):
            touched |= self._delete_contexts(tx, "c.gen = $gen AND c.turn_id IN $ids", {"ids": chunk})
        for chunk in _chunks([turn_props(t) for t in change.put_turns]):
            tx.run("UNWIND $rows AS r MERGE (c:Context {gen: $gen, turn_id: r.turn_id}) SET c += r", rows=chunk, gen=gen).consume()
        touched |= {(t.tenant_id, t.conversation_id) for t in change.put_turns}
        # No name (module docstring): the id stands for it.
        entities = [{"entity_id": e.entity_id, "tenant_id": e.tenant_id, "label": e.label,
                     "vector": [float(x) for x in np.asarray(e.vector, np.float32).ravel()] or None} for e in change.entities]
        for chunk in _chunks(entities):
            # Existing entities are kept as they are (the embedded twin's INSERT OR IGNORE).
            tx.run("UNWIND $rows AS r MERGE (e:Entity {gen: $gen, entity_id: r.entity_id}) "
                   "ON CREATE SET e.tenant_id = r.tenant_id, e.label = r.label, e.vector = r.vector",
                   rows=chunk, gen=gen).consume()
        mentions = [{"c": m.context_id, "e": m.entity_id, "count": m.count, "weight": float(m.weight), "kind": m.kind} for m in change.mentions]
        written = 0
        for chunk in _chunks(mentions):
            written += tx.run(
                "UNWIND $rows AS r MATCH (c:Context {gen: $gen, turn_id: r.c}) MATCH (e:Entity {gen: $gen, entity_id: r.e}) "
                "MERGE (c)-[m:MENTIONS]->(e) SET m.count = r.count, m.weight = r.weight, m.kind = r.kind RETURN count(m) AS n",
                rows=chunk, gen=gen).single()["n"]
        if written != len(mentions):
            log.warning("graph mentions skipped=%d reason=unknown_context_or_entity generation=%d", len(mentions) - written, gen)
        sentences = [{"sentence_id": x.sentence_id, "context_id": x.context_id, "idx": x.index, "start": x.start, "end": x.end,
                      "entity_ids": list(x.entity_ids)} for x in change.sentences]
        for chunk in _chunks(sentences):
            tx.run("UNWIND $rows AS r MATCH (c:Context {gen: $gen, turn_id: r.context_id}) "
                   "MERGE (s:Sentence {gen: $gen, sentence_id: r.sentence_id}) SET s += r MERGE (c)-[:HAS_SENTENCE]->(s)",
                   rows=chunk, gen=gen).consume()
        # Each touched session's adjacency is replaced: its old NEXT edges go, its new ones come,
        # every session in one statement of each kind (per-session statements were two round
        # trips per session: 2.1 s of ~13 s of graph writes for the dev split).
        for chunk in _chunks([list(key) for key in change.adjacency]):
            tx.run("UNWIND $rows AS s MATCH (a:Context)-[r:NEXT]->() WHERE a.gen = $gen AND a.tenant_id = s[0] AND a.conversation_id = s[1] "
                   "AND r.session_id = s[2] DELETE r", rows=chunk, gen=gen).consume()
        for chunk in _chunks([[e.source, e.target, session] for (_, _, session), edges in change.adjacency.items() for e in edges]):
            tx.run("UNWIND $rows AS r MATCH (a:Context {gen: $gen, turn_id: r[0]}) MATCH (b:Context {gen: $gen, turn_id: r[1]}) "
                   "MERGE (a)-[n:NEXT]->(b) SET n.session_id = r[2]", rows=chunk, gen=gen).consume()
        touched |= {(tenant, conv) for tenant, conv, _ in change.adjacency}
        faults.hit("view-written")  # crash tests (schemas/faults.py): the transaction holds the view's writes, not the positions
        tx.run("UNWIND $rows AS r MERGE (p:MemstreamPosition {view: $view, gen: $gen, partition: r[0]}) SET p.next_offset = r[1]",
               rows=[[int(p), int(o)] for p, o in positions.items()], view=VIEW, gen=gen).consume()
        tx.run("UNWIND $rows AS r MERGE (v:MemstreamVersion {view: $view, gen: $gen, tenant_id: r[0], conversation_id: r[1]}) "
               "SET v.version = coalesce(v.version, 0) + 1", rows=[list(k) for k in sorted(touched)], view=VIEW, gen=gen).consume()

    def _delete_contexts(self, tx, where: str, params: dict) -> set[tuple[str, str]]:
        """DETACH DELETE matching contexts (mentions, adjacency) and their sentences; returns
        the conversations they belonged to."""
        rec = tx.run(
            f"MATCH (c:Context) WHERE {where} "
            "WITH collect(c) AS cs, collect(DISTINCT [c.tenant_id, c.conversation_id]) AS touched "
            "CALL (cs) { UNWIND cs AS c MATCH (c)-[:HAS_SENTENCE]->(s:Sentence) DETACH DELETE s } "
            "CALL (cs) { UNWIND cs AS c DETACH DELETE c } "
            "RETURN touched", gen=self.generation, **params).single()
        return {(t, c) for t, c in rec["touched"]} if rec else set()

    def _forget(self, tx, forget: Forget) -> set[tuple[str, str]]:
        where, params = _forget_scope(forget)
        touched = self._delete_contexts(tx, where, params)
        # Entities nobody mentions any more are forgotten too (their name is tenant data).
        tx.run("MATCH (e:Entity) WHERE e.gen = $gen AND e.tenant_id = $tenant AND NOT EXISTS { (e)<-[:MENTIONS]-() } "
               "DETACH DELETE e", gen=self.generation, tenant=forget.tenant_id).consume()
        return touched

    # -- ledger, positions, versions -------------------------------------------------------
    def positions(self) -> Positions:
        rows = self._query("reading positions", "MATCH (p:MemstreamPosition {view: $view, gen: $gen}) RETURN p.partition AS p, p.next_offset AS o",
                           view=VIEW)
        return {r["p"]: r["o"] for r in rows}

    @once_per_request
    def conversation_version(self, tenant_id: str, conversation_id: str | None) -> int:
        cond = "" if conversation_id is None else " AND v.conversation_id = $conv"
        rows = self._query("reading conversation versions",
                           f"MATCH (v:MemstreamVersion) WHERE v.view = $view AND v.gen = $gen AND v.tenant_id = $tenant{cond} "
                           "RETURN coalesce(sum(v.version), 0) AS n", view=VIEW, tenant=tenant_id, conv=conversation_id)
        return int(rows[0]["n"]) if rows else 0

    def known_tenant(self, tenant_id: str) -> bool:
        return bool(self._query("looking up a tenant", "MATCH (c:Context) WHERE c.gen = $gen AND c.tenant_id = $tenant RETURN 1 LIMIT 1",
                                tenant=tenant_id))

    def _turns(self, what: str, where: str, **params) -> list[TurnRow]:
        rows = self._query(what, f"MATCH (c:Context) WHERE {where} RETURN properties(c) AS p", **params)
        return [props_to_turn(r["p"]) for r in rows]

    def find_turns(self, tenant_id: str, conversation_id: str, event_ids: list[str]) -> dict[str, TurnRow]:
        turns = self._turns("finding turns", "c.gen = $gen AND c.tenant_id = $tenant AND c.conversation_id = $conv AND c.event_id IN $ids",
                            tenant=tenant_id, conv=conversation_id, ids=list(event_ids))
        return {t.event_id: t for t in turns}

    def session_turns(self, tenant_id: str, conversation_id: str, session_id: str) -> list[TurnRow]:
        return order_turns(self._turns(
            "reading a session's turns", "c.gen = $gen AND c.tenant_id = $tenant AND c.conversation_id = $conv AND c.session_id = $session",
            tenant=tenant_id, conv=conversation_id, session=session_id))

    def turns_in_scope(self, forget: Forget) -> list[TurnRow]:
        where, params = _forget_scope(forget)
        return self._turns("reading the turns a forget covers", where, **params)

    # -- reads ---------------------------------------------------------------------------
    def known_entities(self, tenant_id: str, entity_ids: list[str]) -> set[str]:
        rows = self._query("looking up entities", "MATCH (e:Entity) WHERE e.gen = $gen AND e.entity_id IN $ids AND e.tenant_id = $tenant "
                           "RETURN e.entity_id AS e", tenant=tenant_id, ids=list(entity_ids))
        return {r["e"] for r in rows}

    def _entities(self, boundary: Boundary) -> tuple[Mapping[str, str], Mapping[str, str]]:
        """(every entity a context inside the boundary mentions as a graph node, the named ones
        among them: those with a vector), each id -> label. Read once per boundary and data
        version: a question asks for its keyword nodes and its names, which were a Cypher round
        trip each and are now dictionary lookups. A conversation holds hundreds to a few thousand
        such entities (the dev split: 2,619 keyword and under 300 named entities in its five conversations)."""
        def read() -> tuple[Mapping[str, str], Mapping[str, str]]:
            where, params = _scope(boundary)
            rows = self._query("reading a boundary's entities",
                               f"MATCH (c:Context) WHERE {where} MATCH (c)-[m:MENTIONS]->(e:Entity) WHERE m.kind IN $kinds "
                               "RETURN DISTINCT e.entity_id AS id, e.label AS label, e.vector IS NOT NULL AS named",
                               kinds=NODE_KINDS, **params)
            return (MappingProxyType({r["id"]: r["label"] for r in rows}),
                    MappingProxyType({r["id"]: r["label"] for r in rows if r["named"]}))

        return self._per_version("entities", boundary, read)

    def present(self, boundary: Boundary, entity_ids: list[str]) -> set[str]:
        if not entity_ids:
            return set()
        everyone = self._entities(boundary)[0]
        return {e for e in entity_ids if e in everyone}

    def align_entities(self, boundary: Boundary, entity_ids: list[str], vectors: np.ndarray, k: int,
                       among: list[str] | None = None) -> list[list[EntityMatch]]:
        if among is not None:
            return self._align_among(boundary, entity_ids, vectors, k, among)
        exact_ids = list(entity_ids)
        everyone = self._entities(boundary)[0] if exact_ids else {}
        out: list[list[EntityMatch]] = [[EntityMatch(e, everyone[e], 1.0)] if e in everyone else [] for e in exact_ids]
        q = np.atleast_2d(np.asarray(vectors, dtype=np.float32)) if len(exact_ids) else np.zeros((0, 0), np.float32)
        todo = [i for i, e in enumerate(exact_ids) if e not in everyone and i < q.shape[0]]
        if not todo or k <= 0:
            return out
        queries = [{"i": i, "v": [float(x) for x in q[i]], "zero": not np.any(q[i])} for i in todo]
        where, params = _scope(boundary)
        # The cosine is Neo4j's (mapped from its [0, 1] range back to [-1, 1]); a zero query
        # vector scores 0 everywhere, as a dot product would.
        rows = self._query(
            "aligning query entities by cosine",
            f"MATCH (c:Context) WHERE {where} MATCH (c)-[m:MENTIONS]->(e:Entity) WHERE m.kind IN $kinds AND e.vector IS NOT NULL "
            "WITH collect(DISTINCT e) AS ents UNWIND $queries AS q "
            "CALL (q, ents) { UNWIND ents AS e "
            "  WITH e, CASE WHEN q.zero THEN 0.0 ELSE 2.0 * vector.similarity.cosine(e.vector, q.v) - 1.0 END AS score "
            "  ORDER BY score DESC, e.entity_id ASC LIMIT $k RETURN e, score } "
            "RETURN q.i AS i, e.entity_id AS id, e.label AS label, score ORDER BY i, score DESC, id",
            kinds=NODE_KINDS, queries=queries, k=int(k), **params)
        for r in rows:
            out[r["i"]].append(EntityMatch(r["id"], r["label"], float(r["score"])))
        return out

    def _align_among(self, boundary: Boundary, entity_ids: list[str], vectors: np.ndarray, k: int,
                     among: list[str]) -> list[list[EntityMatch]]:
        """align_entities with the cosine candidates limited to the named entities the contexts
        `among` (of the boundary) mention; exact matches are the boundary's, looked up per entity."""
        exact = self._mentioned(boundary, list(entity_ids), named_only=False)
        out: list[list[EntityMatch]] = [[EntityMatch(e, exact[e], 1.0)] if e in exact else [] for e in entity_ids]
        q = np.atleast_2d(np.asarray(vectors, dtype=np.float32)) if len(entity_ids) else np.zeros((0, 0), np.float32)
        todo = [i for i, e in enumerate(entity_ids) if e not in exact and i < q.shape[0]]
        if not todo or k <= 0 or not among:
            return out
        where, params = _admits(boundary)
        rows = self._query(
            "reading the named entities of candidate contexts",
            f"MATCH (c:Context) USING INDEX c:Context(gen, turn_id) WHERE c.turn_id IN $among AND {where} "
            "MATCH (c)-[m:MENTIONS]->(e:Entity) WHERE m.kind IN $kinds AND e.vector IS NOT NULL "
            "RETURN DISTINCT e.entity_id AS id, e.label AS label, e.vector AS vector ORDER BY id",
            among=list(dict.fromkeys(among)), kinds=NODE_KINDS, **params)
        if not rows:
            return out
        matrix = np.asarray([r["vector"] for r in rows], dtype=np.float32)
        # Cosines (the entities' and the queries' norms divided out, as Neo4j's own similarity does
        # on the whole-boundary path); a zero query vector scores 0 everywhere.
        matrix /= np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
        for i in todo:
            norm = float(np.linalg.norm(q[i]))
            scores = matrix @ (q[i] / norm) if norm > 0 else np.zeros(len(rows), np.float32)
            top = np.argsort(-scores, kind="stable")[:k]  # ties: entity-id order (the rows are sorted)
            out[i] = [EntityMatch(rows[t]["id"], rows[t]["label"], float(scores[t])) for t in top]
        return out

    # The bounded reads below name their start (contexts or entities by id) with an index hint, and
    # leave the label off the nodes they reach by relationship: a labelled node with boundary
    # predicates lets the planner start from the boundary's index instead (a scan of the tenant or
    # conversation per call), which is what these reads exist to avoid. Their boundary condition is
    # `_admits`, one query text per read whatever the boundary's shape.
    def _mentioned(self, b: Boundary, entity_ids: list[str], *, named_only: bool) -> dict[str, str]:
        """entity id -> label of the given entities that a context inside the boundary mentions as
        a graph node (named only: those with a vector). Per entity, whatever the boundary's size:
        the existence test stops at the first mention inside the boundary."""
        if not entity_ids:
            return {}
        where, params = _admits(b)
        rows = self._query(
            "looking up entities inside a boundary",
            "MATCH (e:Entity) USING INDEX e:Entity(gen, entity_id) WHERE e.gen = $gen AND e.entity_id IN $ids "
            "AND e.tenant_id = $tenant AND (NOT $named OR e.vector IS NOT NULL) "
            f"AND EXISTS {{ MATCH (c)-[m:MENTIONS]->(e) WHERE m.kind IN $kinds AND {where} }} "
            "RETURN e.entity_id AS id, e.label AS label",
            ids=list(dict.fromkeys(entity_ids)), kinds=NODE_KINDS, named=named_only, **params)
        return {r["id"]: r["label"] for r in rows}

    def labels_of(self, boundary: Boundary, entity_ids: list[str]) -> dict[str, str]:
        return self._mentioned(boundary, entity_ids, named_only=True)

    def entity_degrees(self, boundary: Boundary, entity_ids: list[str]) -> dict[str, int]:
        return self._degrees(boundary, entity_ids)

    def _degrees(self, b: Boundary, entity_ids: list[str], cap: int | None = None) -> dict[str, int]:
        """Per entity, the contexts of the boundary's conversations that mention it as a graph
        node; with `cap`, counted up to cap + 1 only (enough to tell whether it passes the cap,
        without walking every mention of a hub). Entities mentioned by none are absent."""
        if not entity_ids:
            return {}
        where, params = _admits(Boundary(b.tenant_id, b.conversation_ids))
        rows = self._query(
            "counting entities' contexts",
            "MATCH (e:Entity) USING INDEX e:Entity(gen, entity_id) WHERE e.gen = $gen AND e.entity_id IN $ids "
            "AND e.tenant_id = $tenant "
            f"CALL (e) {{ MATCH (c)-[m:MENTIONS]->(e) WHERE m.kind IN $kinds AND {where} RETURN c LIMIT $cap }} "
            "RETURN e.entity_id AS id, count(c) AS n",
            ids=list(dict.fromkeys(entity_ids)), kinds=NODE_KINDS, cap=_UNCAPPED if cap is None else int(cap) + 1,
            **params)
        return {r["id"]: int(r["n"]) for r in rows if r["n"] > 0}

    def entity_labels(self, boundary: Boundary) -> Mapping[str, str]:
        return self._entities(boundary)[1]

    def context_mentions(self, boundary: Boundary,
                         context_ids: list[str] | None = None) -> dict[str, list[tuple[str, str]]]:
        if context_ids is None:
            where, params = _scope(boundary)
            start = f"MATCH (c:Context) WHERE {where}"
        else:  # those contexts (of the boundary) only: looked up by id
            where, params = _admits(boundary)
            start = f"MATCH (c:Context) USING INDEX c:Context(gen, turn_id) WHERE c.turn_id IN $ids AND {where}"
            params["ids"] = list(dict.fromkeys(context_ids))
        rows = self._query("reading a boundary's mentions",
                           f"{start} MATCH (c)-[:MENTIONS]->(e:Entity) "
                           "RETURN c.turn_id AS c, e.entity_id AS e, e.label AS label ORDER BY c, e", **params)
        out: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for r in rows:
            out[r["c"]].append((r["e"], r["label"]))
        return dict(out)

    def sentence_incidence(self, boundary: Boundary, entity_ids: list[str] | None = None) -> SentenceIncidence:
        if entity_ids is not None:
            return self._sentences_mentioning(boundary, entity_ids)

        def read() -> SentenceIncidence:
            where, params = _scope(boundary)
            rows = self._query("reading the boundary's sentences",
                               f"MATCH (c:Context) WHERE {where} MATCH (c)-[:HAS_SENTENCE]->(s:Sentence) WHERE size(s.entity_ids) > 0 "
                               "RETURN s.sentence_id AS id, s.context_id AS c, s.entity_ids AS ents", **params)
            return SentenceIncidence.build((r["id"], r["c"], r["ents"]) for r in rows)

        return self._per_version("sentence_incidence", boundary, read)

    def _sentences_mentioning(self, boundary: Boundary, entity_ids: list[str]) -> SentenceIncidence:
        """The boundary's sentences that mention one of `entity_ids`, found from the entities:
        a sentence's entities are mentions of its context (the projection writes them so), so
        the contexts mentioning an entity lead to every sentence that names it."""
        if not entity_ids:
            return SentenceIncidence.build([])
        where, params = _admits(boundary)
        rows = self._query(
            "reading the sentences that mention entities",
            "MATCH (e:Entity) USING INDEX e:Entity(gen, entity_id) WHERE e.gen = $gen AND e.entity_id IN $ids "
            "AND e.tenant_id = $tenant "
            f"MATCH (c)-[:MENTIONS]->(e) WHERE {where} "
            "MATCH (c)-[:HAS_SENTENCE]->(s) WHERE any(x IN s.entity_ids WHERE x IN $ids) "
            "RETURN DISTINCT s.sentence_id AS id, s.context_id AS c, s.entity_ids AS ents",
            ids=list(dict.fromkeys(entity_ids)), **params)
        return SentenceIncidence.build((r["id"], r["c"], r["ents"]) for r in rows)

    def _per_version(self, what: str, boundary: Boundary, read):
        """Boundary-wide reads that every query makes are read once per boundary and data
        version (the versions every write bumps) and then served from memory."""
        key = (what, self._boundary_key(boundary), self._versions(boundary))
        with self._proj_lock:
            hit = self._read_cache.get(key)
            if hit is not None:
                self._read_cache.move_to_end(key)
                return hit
        value = read()
        with self._proj_lock:
            for stale in [k for k in self._read_cache if k[:2] == key[:2]]:
                del self._read_cache[stale]
            self._read_cache[key] = value
            while len(self._read_cache) > 4 * self.max_projections:
                self._read_cache.popitem(last=False)
        return value

    def context_entities(self, tenant_id: str, context_ids: list[str]) -> dict[str, set[str]]:
        rows = self._query("reading contexts' entities",
                           "MATCH (c:Context) WHERE c.gen = $gen AND c.turn_id IN $ids AND c.tenant_id = $tenant "
                           "MATCH (c)-[m:MENTIONS]->(e:Entity) WHERE m.kind IN $kinds RETURN c.turn_id AS c, e.entity_id AS e",
                           tenant=tenant_id, ids=list(dict.fromkeys(context_ids)), kinds=NODE_KINDS)
        out: dict[str, set[str]] = defaultdict(set)
        for r in rows:
            out[r["c"]].add(r["e"])
        return dict(out)

    # -- personalised PageRank (GDS) -----------------------------------------------------------
    def personalized_pagerank(self, boundary: Boundary, reset: dict[str, float], damping: float, *, adjacency_weight: float = 1.0,
                              exclude_labels: tuple[str, ...] = (), max_share: float = 1.0, max_iterations: int = 50,
                              tolerance: float = 1e-7, contexts: list[str] | None = None,
                              contexts_total: int | None = None, hub_cap: int | None = None,
                              per_entity: int = 200, reach: int = REACH_ENTITIES) -> dict[str, float]:
        sources = [[node, float(mass)] for node, mass in sorted(reset.items()) if mass > 0]
        if not sources:
            return {}
        if contexts is not None:
            graph = self._neighbourhood(boundary, reset, contexts, contexts_total, hub_cap, per_entity, reach, max_share,
                                        tuple(exclude_labels))
            return graph.walk(dict(sources), damping, adjacency_weight, max_iterations, tolerance)
        self._require_weighted_sources()
        walk = (float(adjacency_weight), tuple(sorted(set(exclude_labels))), float(max_share))
        for attempt in (0, 1):
            projection = self._projection(boundary, *walk)
            if projection is None:
                return {}  # no context inside the boundary
            name, nodes = projection
            try:
                # The port's tolerance bounds the L1 change of the whole vector; GDS's bounds each
                # node's delta (a smaller one is not propagated). tolerance / nodes keeps the mass
                # GDS leaves behind per superstep within the port's tolerance.
                return self._pagerank(name, boundary, sources, damping, max_iterations, tolerance / max(nodes, 1))
            except StoreError as exc:
                # The projection was dropped by another process's LRU, or a write landed between
                # projecting and streaming (a source is no longer in the projection): rebuild once.
                gone = isinstance(exc.__cause__, neo_exc.ClientError) and (
                    "GraphNotFoundException" in exc.__cause__.message or "do not exist in the in-memory graph" in exc.__cause__.message)
                if not gone or attempt:
                    raise
                with self._proj_lock:
                    self._projections.pop(name, None)
                    self._node_maps.pop(name, None)
                self._drop_projection(name)
        raise AssertionError("unreachable")

    def _neighbourhood(self, b: Boundary, reset: dict[str, float], contexts: list[str], contexts_total: int | None,
                       hub_cap: int | None, per_entity: int, reach: int, max_share: float,
                       exclude_labels: tuple[str, ...]) -> "_Neighbourhood":
        """The part of the boundary's graph a bounded walk runs on (schemas/ports/graph.py): the
        given contexts and the reset's that are inside the boundary, the `per_entity` strongest
        contexts (by eq. 4 weight, then id) of each reset entity that is not a hub (the
        `reach` strongest of them), every graph entity those contexts mention unless a hub
        (degree in the boundary's conversations above `hub_cap` or `max_share` of
        `contexts_total`), and the NEXT edges between the contexts."""
        where, params = _admits(b)
        limit = math.inf if hub_cap is None else hub_cap
        reset_entities = [n for n in reset if not n.startswith("t_")]
        degree = self._degrees(b, reset_entities, cap=hub_cap)
        reach = sorted((e for e in reset_entities if 0 < degree.get(e, 0) <= limit),
                       key=lambda e: (-reset[e], e))[:reach]
        seeds = list(dict.fromkeys([*contexts, *(n for n in reset if n.startswith("t_"))]))
        found = self._query(
            "reading a walk's contexts",
            f"MATCH (c:Context) USING INDEX c:Context(gen, turn_id) WHERE c.turn_id IN $seeds AND {where} "
            "RETURN c.turn_id AS c "
            "UNION "
            "UNWIND $reach AS eid MATCH (e:Entity {gen: $gen, entity_id: eid}) "
            f"CALL (e) {{ MATCH (c)-[m:MENTIONS]->(e) WHERE {where} "
            "  RETURN c.turn_id AS c ORDER BY m.weight DESC, c ASC LIMIT $per_entity } "
            "RETURN c", seeds=seeds, reach=reach, per_entity=max(int(per_entity), 0), **params)
        ctx = sorted({r["c"] for r in found})
        rows = self._query(
            "reading a walk's neighbourhood",
            "MATCH (c:Context) USING INDEX c:Context(gen, turn_id) WHERE c.gen = $gen AND c.turn_id IN $ctx "
            "CALL (c) { MATCH (c)-[m:MENTIONS]->(e) WHERE m.kind IN $kinds "
            "  RETURN collect([e.entity_id, m.weight, e.label]) AS mentions } "
            "CALL (c) { MATCH (c)-[:NEXT]->(n) WHERE n.turn_id IN $ctx "
            "  RETURN collect(n.turn_id) AS next } "
            "RETURN c.turn_id AS c, mentions, next", ctx=ctx, kinds=NODE_KINDS)
        mentions = [(r["c"], e, w, label) for r in rows for e, w, label in r["mentions"]]
        labels = {e: label for _, e, _, label in mentions}
        threshold = min(limit, (contexts_total or len(ctx)) * max_share)
        # Counted up to the threshold only: a degree above it is all the filter needs to know.
        cap = None if math.isinf(threshold) else max(math.floor(threshold), 0)
        degree.update(self._degrees(b, [e for e in labels if e not in degree], cap=cap))
        entities = sorted(e for e in labels if degree.get(e, 0) <= threshold)
        kept = [(c, e, w) for c, e, w, label in mentions if label not in exclude_labels]
        return _Neighbourhood.build(ctx, entities, kept, [(r["c"], n) for r in rows for n in r["next"]])

    def _require_weighted_sources(self) -> None:
        """The reset vector needs per-node source weights ([[node, bias], ...]): GDS >= 2.18."""
        if self._gds_checked:
            return
        version = self._query("reading the GDS version", "RETURN gds.version() AS v")[0]["v"]
        major, minor = (int(x) for x in version.split(".")[:2])
        if (major, minor) < (2, 18):
            raise StoreError(f"Neo4j at {self.uri} has Graph Data Science {version}, whose PageRank takes only uniform source "
                             "nodes; the graph view needs weighted sourceNodes (GDS >= 2.18, on Neo4j 2025.x or newer)")
        self._gds_checked = True

    def _pagerank(self, name: str, boundary: Boundary, sources: list, damping: float, max_iterations: int, tolerance: float) -> dict[str, float]:
        # Sources are the reset ids that are nodes of the projection (the contexts inside the
        # boundary and the entities they mention), given to GDS as its node ids; the division by
        # the total turns GDS's dangling-leaking scores into the embedded definition (module
        # docstring, point 3).
        node_of, context_of = self._node_ids(name)
        src = [(node_of[key], mass) for key, mass in sources if key in node_of]
        total = sum(mass for _, mass in src)
        if total <= 0:
            return {}
        # Only the contexts' scores come back (entities are ~3/4 of the nodes and were most of
        # the transfer); the mass that normalises them is summed over every node on the server.
        # The projection numbers the contexts first, so `nodeId <= $last` is usually exactly
        # them; the map below keeps the result exact whatever the numbering.
        row = self._query(
            "computing personalised PageRank with GDS",
            "CALL gds.pageRank.stream($graph, {sourceNodes: $sources, dampingFactor: $damping, relationshipWeightProperty: 'w', "
            "  maxIterations: $iterations, tolerance: $tolerance, concurrency: $concurrency, logProgress: false}) "
            "YIELD nodeId, score WITH sum(score) AS mass, collect(CASE WHEN nodeId <= $last THEN [nodeId, score] END) AS hits "
            "RETURN mass, [h IN hits | h[0]] AS ids, [h IN hits | h[1]] AS scores",
            graph=name, sources=[[node, mass / total] for node, mass in src], damping=float(damping), iterations=int(max_iterations),
            tolerance=float(tolerance), concurrency=self.pagerank_concurrency, last=max(context_of, default=-1))[0]
        mass = row["mass"] or 0.0
        return {context_of[n]: (s / mass if mass > 0 else 0.0) for n, s in zip(row["ids"], row["scores"]) if n in context_of}

    def _node_ids(self, name: str) -> tuple[dict[str, int], dict[int, str]]:
        """The projection's nodes as GDS numbers them: (turn or entity id -> node id, node id ->
        turn id of the contexts). Read from the projection itself (every node it holds, whatever
        was written since), once per projection: a name is a boundary at one data version, so
        the ids stay valid for as long as the name does. Resolving the sources by a MATCH per
        question and the scores by gds.util.asNode per node was ~60% of a PageRank call."""
        with self._proj_lock:
            hit = self._node_maps.get(name)
            if hit is not None:
                self._node_maps.move_to_end(name)
                return hit
        rows = self._query("reading a GDS projection's node ids",
                           "CALL gds.degree.stream($graph, {concurrency: 1}) YIELD nodeId WITH nodeId, gds.util.asNode(nodeId) AS n "
                           "WHERE n IS NOT NULL RETURN nodeId AS id, coalesce(n.turn_id, n.entity_id) AS key, n:Context AS context", graph=name)
        value = ({r["key"]: r["id"] for r in rows}, {r["id"]: r["key"] for r in rows if r["context"]})
        with self._proj_lock:
            self._node_maps[name] = value
            while len(self._node_maps) > self.max_projections:
                self._node_maps.popitem(last=False)
        return value

    def _projection(self, boundary: Boundary, adjacency_weight: float, exclude: tuple[str, ...], max_share: float) -> tuple[str, int] | None:
        """(name, node count) of a GDS projection of the boundary's graph at its current data
        version, built if needed (module docstring: caching and invalidation); None for an empty
        boundary."""
        b = boundary
        where, params = _scope(b)
        key = _digest(self._boundary_key(b), adjacency_weight, exclude, max_share)
        prefix = projection_prefix(VIEW, self.generation) + f"{key}-"
        name = prefix + _digest(list(self._versions(b)))
        with self._proj_lock:
            if name in self._projections:
                self._projections.move_to_end(name)
                return name, self._projections[name]
        where_b, _ = _scope(b, "b")
        try:
            rows = self._query(
                "projecting the boundary's graph into GDS",
                f"MATCH (c:Context) WHERE {where} "
                "WITH collect(c) AS cs "
                "CALL (cs) { "
                # every context is a node, even without edges
                "  UNWIND cs AS c RETURN c AS s, null AS t, 0.0 AS w "
                "  UNION ALL "
                # every entity the contexts mention is a node; kept entities get their eq. 4 edges
                "  UNWIND cs AS c MATCH (c)-[m:MENTIONS]->(e:Entity) WHERE m.kind IN $kinds "
                "  WITH e, collect(CASE WHEN m.weight > 0 THEN [c, m.weight] END) AS edges, size(cs) AS nc "
                "  WITH e, edges, NOT e.label IN $exclude AND size(edges) <= $max_share * nc AS keep "
                "  UNWIND [[e, null, 0.0]] + CASE WHEN keep THEN [p IN edges | [p[0], e, p[1]]] ELSE [] END AS row "
                "  RETURN row[0] AS s, row[1] AS t, row[2] AS w "
                "  UNION ALL "
                f"  UNWIND cs AS c MATCH (c)-[:NEXT]->(b:Context) WHERE $adjacency > 0 AND {where_b} "
                "  RETURN c AS s, b AS t, $adjacency AS w "
                "} "
                "WITH gds.graph.project($name, s, t, CASE WHEN t IS NULL THEN {} ELSE {relationshipProperties: {w: w}} END, "
                "  {undirectedRelationshipTypes: ['*']}) AS g "
                "RETURN g.nodeCount AS nodes, g.relationshipCount AS rels",
                name=name, kinds=NODE_KINDS, exclude=list(exclude), max_share=max_share, adjacency=adjacency_weight, **params)
            if not rows or rows[0]["nodes"] is None:
                return None
            nodes = rows[0]["nodes"]
            log.debug("gds projection built name=%s nodes=%s relationships=%s", name, nodes, rows[0]["rels"])
        except StoreError as exc:
            if not (isinstance(exc.__cause__, neo_exc.ClientError) and "already exists" in exc.__cause__.message):
                raise
            nodes = None  # another reader built the same version concurrently: use theirs
        # Older versions of this boundary's projection are stale now.
        for r in self._query("listing GDS projections", "CALL gds.graph.list() YIELD graphName, nodeCount "
                             "WHERE graphName STARTS WITH $prefix RETURN graphName, nodeCount", prefix=prefix):
            if r["graphName"] == name:
                nodes = r["nodeCount"]
            else:
                self._drop_projection(r["graphName"])
        if nodes is None:
            raise StoreError(f"GDS projection {name} vanished while it was being shared; the query can be retried")
        with self._proj_lock:
            for stale in [n for n in self._projections if n.startswith(prefix)]:
                del self._projections[stale]
            self._projections[name] = nodes
            self._projections.move_to_end(name)
            evicted = []
            while len(self._projections) > self.max_projections:
                evicted.append(self._projections.popitem(last=False)[0])
        for old in evicted:
            self._drop_projection(old)
        return name, nodes

    @once_per_request
    def _versions(self, b: Boundary) -> tuple:
        """The boundary's conversation versions: any write to it changes them (read once per
        request: every boundary-wide read keys its cache on them)."""
        if b.conversation_ids is not None and len(b.conversation_ids) == 1:
            # A question's usual boundary: the same read as conversation_version, which the query
            # also makes (type flags), so one round trip serves both.
            (conv,) = b.conversation_ids
            version = self.conversation_version(b.tenant_id, conv)
            return ((conv, version),) if version else ()
        _, params = _scope(b)
        return tuple((r["c"], r["v"]) for r in self._query(
            "reading conversation versions",
            "MATCH (v:MemstreamVersion) WHERE v.view = $view AND v.gen = $gen AND v.tenant_id = $tenant"
            + (" AND v.conversation_id IN $convs" if b.conversation_ids is not None else "")
            + " RETURN v.conversation_id AS c, v.version AS v ORDER BY c", view=VIEW, **params))

    @staticmethod
    def _boundary_key(b: Boundary) -> str:
        return _digest(b.tenant_id, sorted(b.conversation_ids) if b.conversation_ids is not None else None,
                       sorted(b.session_ids) if b.session_ids is not None else None, sorted(b.agent_ids) if b.agent_ids is not None else None,
                       b.since and utc(b.since).isoformat(), b.until and utc(b.until).isoformat())

    def _drop_projection(self, name: str) -> None:
        self._query(f"dropping GDS projection {name}", "CALL gds.graph.drop($name, false) YIELD graphName RETURN graphName", name=name)

    def projections(self) -> list[str]:
        """Names of the GDS projections this store currently keeps (for operators and tests)."""
        with self._proj_lock:
            return list(self._projections)

    # -- dump ------------------------------------------------------------------------------
    def canonical_dump(self) -> dict:
        turns = sorted(self._turns("dumping the turn ledger", "c.gen = $gen"), key=lambda t: t.turn_id)
        entities = self._query("dumping entities", "MATCH (e:Entity {gen: $gen}) RETURN e.entity_id AS id, e.tenant_id AS tenant, "
                               "e.label AS label, e.vector AS vector ORDER BY id")
        mentions = self._query("dumping mentions", "MATCH (c:Context {gen: $gen})-[m:MENTIONS]->(e:Entity) "
                               "RETURN c.turn_id AS c, e.entity_id AS e, m.count AS n, m.weight AS w, m.kind AS kind ORDER BY c, e")
        sentences = self._query("dumping sentences", "MATCH (s:Sentence {gen: $gen}) RETURN properties(s) AS p ORDER BY s.sentence_id")
        adjacency = self._query("dumping adjacency", "MATCH (a:Context {gen: $gen})-[n:NEXT]->(b:Context) "
                                "RETURN a.turn_id AS a, b.turn_id AS b, n.session_id AS s ORDER BY a, b")
        return {
            "view": self.view,
            "turns": ledger_dump(turns),
            "entities": [{"id": r["id"], "tenant": r["tenant"], "label": r["label"],
                          "vector": np.asarray(r["vector"] or [], np.float32).tolist()} for r in entities],
            "mentions": [[r["c"], r["e"], r["n"], round(r["w"], 9), r["kind"]] for r in mentions],
            "sentences": [[p["sentence_id"], p["context_id"], p["idx"], p["start"], p["end"], json.dumps(list(p["entity_ids"]))]
                          for p in (r["p"] for r in sentences)],
            "adjacency": [[r["a"], r["b"], r["s"]] for r in adjacency],
        }


class _Neighbourhood:
    """A bounded walk's graph in memory: contexts then entities as nodes, eq. 4 weights on
    entity–context edges and session adjacency between contexts (the embedded store's matrix)."""

    def __init__(self, contexts: list[str], index: dict[str, int], mentions: sp.csr_matrix, adjacency: sp.csr_matrix):
        self.contexts, self.index, self.mentions, self.adjacency = contexts, index, mentions, adjacency

    @classmethod
    def build(cls, contexts: list[str], entities: list[str], mentions: list[tuple[str, str, float]],
              edges: list[tuple[str, str]]) -> "_Neighbourhood":
        """`mentions`: (context, entity, weight), those of entities outside `entities` and of weight
        0 left out; `edges`: NEXT pairs (made symmetric). Excluded entities stay nodes (reset mass
        on them still counts) without edges, as in the whole-boundary walk."""
        ctx_index = {c: i for i, c in enumerate(contexts)}
        ent_index = {e: i for i, e in enumerate(entities)}
        keep = [(ctx_index[c], ent_index[e], float(w)) for c, e, w in mentions
                if e in ent_index and c in ctx_index and w > 0]
        mm = sp.csr_matrix(([w for *_, w in keep], ([r for r, _, _ in keep], [c for _, c, _ in keep])),
                           shape=(len(contexts), len(entities)), dtype=np.float64)
        pairs = {(ctx_index[a], ctx_index[b]) for a, b in edges if a in ctx_index and b in ctx_index}
        rows = [i for a, b in pairs for i in (a, b)]
        cols = [i for a, b in pairs for i in (b, a)]
        adj = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(contexts), len(contexts)), dtype=np.float64)
        return cls(contexts, {**ctx_index, **{e: len(contexts) + i for i, e in enumerate(entities)}}, mm, adj)

    def walk(self, reset: dict[str, float], damping: float, adjacency_weight: float, max_iterations: int,
             tolerance: float) -> dict[str, float]:
        """pi = (1-d) r + d (P^T pi + mass of dangling nodes * r), by power iteration from r."""
        n, nc = len(self.index), len(self.contexts)
        r = np.zeros(n)
        for node, mass in reset.items():
            i = self.index.get(node)
            if i is not None and mass > 0:
                r[i] += mass
        if n == 0 or r.sum() <= 0:
            return {}
        r /= r.sum()
        mm = self.mentions
        if mm.shape[1] == 0:
            A = (adjacency_weight * self.adjacency).tocsr()
        else:
            A = sp.bmat([[adjacency_weight * self.adjacency, mm], [mm.T, None]], format="csr", dtype=np.float64)
        deg = np.asarray(A.sum(axis=1)).ravel()
        inv = np.divide(1.0, deg, out=np.zeros_like(deg), where=deg > 0)
        PT = (sp.diags(inv) @ A).T.tocsr()
        dangling = np.flatnonzero(deg == 0)
        base, pi = (1 - damping) * r, r.copy()
        for it in range(max_iterations):
            nxt = PT @ pi
            if len(dangling):
                nxt += pi[dangling].sum() * r
            nxt = damping * nxt + base
            # Tested every 5th step, as the embedded store does: both stop at the same iteration.
            done = it % 5 == 4 and np.abs(nxt - pi).sum() < tolerance
            pi = nxt
            if done:
                break
        return dict(zip(self.contexts, pi[:nc].tolist()))
