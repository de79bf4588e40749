"""The Neo4j graph view against a real Neo4j + Graph Data Science server, beyond the port
contract (tests/contracts/test_graph_contract.py runs that against Neo4j too): proof that
personalised PageRank is computed by GDS on the server, the projection cache and its
invalidation, the catalog reclaiming a dropped generation, an unreachable server, and the real
graph projection (NER, encoder, runner) writing into Neo4j."""

from __future__ import annotations

import uuid
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from schemas.errors import StoreError, TransientError
from schemas.ports.graph import AdjacencyEdge, EntityNode, GraphChangeSet, Mention, SentenceNode
from schemas.ports.views import Boundary
from schemas.units import entity_id
from tests.contracts.builders import row, unit_vector
from tests.integration.servers import free_ports

pytestmark = pytest.mark.integration

# Turns 0-4 of session s1 mention these entities; turn 5 (session s2) mentions nothing: a
# dangling node, where GDS's definition and the embedded one differ before normalisation.
MENTIONS = {0: ["ann", "paris", "bob"], 1: ["bob", "paris"], 2: ["rome", "kw:pasta"], 3: ["ann"], 4: ["paris", "kw:pasta"], 5: []}
LABELS = {"ann": "SPEAKER", "bob": "PERSON", "paris": "GPE", "rome": "GPE", "kw:pasta": "KEYWORD"}


def new_store(uri: str, generation: int | None = None, **kw):
    """A store on a fresh random generation: the namespace that isolates this test's data."""
    from infra.graph.neo4j import Neo4jGraphStore

    from tests.integration.servers import neo4j_auth

    return Neo4jGraphStore(uri, generation or uuid.uuid4().int % 2**52 + 1_000_000, auth=neo4j_auth(), **kw)


def close_to(a: dict, b: dict, tol: float = 1e-12) -> bool:
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) < tol for k in a)


@pytest.fixture
def store(neo4j_uri):
    s = new_store(neo4j_uri)
    yield s
    s.close()
    cleanup = new_store(neo4j_uri, s.generation)  # the test may have closed `s` itself
    cleanup.drop_generation()
    cleanup.close()


@pytest.fixture
def driver(neo4j_uri):
    import neo4j

    from tests.integration.servers import neo4j_auth

    d = neo4j.GraphDatabase.driver(neo4j_uri, auth=neo4j_auth())
    yield d
    d.close()


def build(store, conv="c1", offset=0):
    rows = [row(i, f"turn {i}", conv=conv, session="s2" if i == 5 else "s1") for i in MENTIONS]
    ids = {n: entity_id("t1", n) for n in LABELS}
    change = GraphChangeSet(put_turns=rows)
    change.entities = [EntityNode(ids[n], "t1", n, LABELS[n], np.zeros(0, np.float32) if n.startswith("kw:") else unit_vector(len(n)))
                       for n in LABELS]
    for i, ns in MENTIONS.items():
        change.mentions += [Mention(ids[n], rows[i].turn_id, 1, 1 / len(ns), "ner") for n in ns]
        change.sentences.append(SentenceNode(f"{rows[i].turn_id}.s0", rows[i].turn_id, 0, 0, 6, tuple(ids[n] for n in ns)))
    change.adjacency[("t1", conv, "s1")] = [AdjacencyEdge(a.turn_id, b.turn_id, "t1", conv, "s1") for a, b in zip(rows[:5], rows[1:5])]
    store.apply(change, {0: offset + len(rows)})
    return rows, ids


def reference(rows, ids, reset, damping, adjacency_weight):
    g = nx.Graph()
    g.add_nodes_from(r.turn_id for r in rows)
    for i, ns in MENTIONS.items():
        for n in ns:
            g.add_edge(rows[i].turn_id, ids[n], weight=1 / len(ns))
    for a, b in zip(rows[:5], rows[1:5]):
        g.add_edge(a.turn_id, b.turn_id, weight=adjacency_weight)
    return nx.pagerank(g, alpha=damping, personalization={n: reset.get(n, 0.0) for n in g}, weight="weight", tol=1e-13, max_iter=2000)


def server_log(driver) -> Path | None:
    """The server's debug.log, when the server runs on this machine (GDS logs every run there)."""
    with driver.session() as s:
        rec = s.run("SHOW SETTINGS YIELD name, value WHERE name = 'server.directories.logs' RETURN value").single()
    path = Path(rec["value"]) / "debug.log" if rec else None
    return path if path and path.is_file() else None


def log_since(path: Path, offset: int) -> str:
    size = path.stat().st_size
    with path.open("rb") as f:
        f.seek(offset if size >= offset else 0)  # rotated meanwhile: the new file is all new
        return f.read().decode("utf-8", "replace")


def gds_graphs(driver, prefix: str) -> dict[str, tuple[int, int]]:
    with driver.session() as s:
        return {r["graphName"]: (r["nodeCount"], r["relationshipCount"]) for r in s.run(
            "CALL gds.graph.list() YIELD graphName, nodeCount, relationshipCount WHERE graphName STARTS WITH $prefix "
            "RETURN graphName, nodeCount, relationshipCount", prefix=prefix)}


def test_pagerank_is_computed_by_gds_on_the_server(store, driver):
    rows, ids = build(store)
    b = Boundary("t1", ("c1",))
    reset = {ids["paris"]: 0.5, rows[2].turn_id: 0.2, rows[5].turn_id: 0.3}  # 0.3 on the dangling turn
    log = server_log(driver)
    offset = log.stat().st_size if log else 0

    got = store.personalized_pagerank(b, reset, 0.6, adjacency_weight=0.5, max_iterations=500, tolerance=1e-12)

    # 1. The projection the adapter used lives in the server's GDS graph catalog, holding exactly
    #    the boundary's graph: 6 contexts + 5 entities; 10 mentions + 4 adjacency edges, both ways.
    [name] = store.projections()
    assert gds_graphs(driver, name) == {name: (11, 2 * (10 + 4))}
    # 2. GDS's own pageRank, called directly on that projection, gives the adapter's scores (after
    #    the normalisation that maps GDS's dangling-node handling onto the embedded definition;
    #    the adapter gives GDS the port's tolerance divided by the projection's node count).
    with driver.session() as s:
        direct = s.run(
            "UNWIND $reset AS r MATCH (n) WHERE n.gen = $gen AND (n.turn_id = r[0] OR n.entity_id = r[0]) "
            "WITH collect([n, r[1]]) AS src "
            "CALL gds.pageRank.stream($name, {sourceNodes: src, dampingFactor: 0.6, relationshipWeightProperty: 'w', "
            "  maxIterations: 500, tolerance: 1e-12 / 11}) YIELD nodeId, score "
            "RETURN gds.util.asNode(nodeId).turn_id AS turn, score",
            reset=[[k, v] for k, v in reset.items()], gen=store.generation, name=name).data()
    total = sum(r["score"] for r in direct)
    assert total < 0.99  # GDS dropped the mass that reached the dangling turn ...
    by_turn = {r["turn"]: r["score"] / total for r in direct if r["turn"]}
    assert got.keys() == by_turn.keys() == {r.turn_id for r in rows}
    assert max(abs(got[k] - by_turn[k]) for k in got) < 1e-12
    # ... and the normalised scores are the embedded definition's (networkx, dangling mass to r).
    want = reference(rows, ids, reset, 0.6, 0.5)
    assert max(abs(got[k] - want[k]) for k in got) < 1e-9
    # 3. The server logged the GDS PageRank runs (checked when the server's log is on this machine).
    if log is not None:
        assert "PageRank :: Finished" in log_since(log, offset)
    # 4. Parameters go to GDS as they are: its own validation refuses this damping factor.
    with pytest.raises(StoreError, match="dampingFactor"):
        store.personalized_pagerank(b, reset, 1.5)
    # 5. close() drops the projection from the server.
    store.close()
    assert gds_graphs(driver, name) == {}


def test_writes_invalidate_projections_which_are_shared_bounded_and_dropped(neo4j_uri, driver):
    store = new_store(neo4j_uri, max_projections=2)
    other = new_store(neo4j_uri, store.generation)  # another process serving the same generation
    prefix = f"memstream-graph-g{store.generation}-"
    try:
        rows, ids = build(store)
        b = Boundary("t1", ("c1",))
        reset = {ids["rome"]: 1.0}
        first = store.personalized_pagerank(b, reset, 0.6)
        [name] = store.projections()
        assert close_to(other.personalized_pagerank(b, reset, 0.6), first)
        assert other.projections() == [name] and list(gds_graphs(driver, prefix)) == [name]  # reused, not rebuilt

        late = row(9, "turn 9", session="s3")  # a new turn about rome bumps c1's version
        store.apply(GraphChangeSet(put_turns=[late], mentions=[Mention(ids["rome"], late.turn_id, 1, 1.0, "ner")]), {0: 10})
        second = store.personalized_pagerank(b, reset, 0.6)
        [renamed] = store.projections()
        assert renamed != name and late.turn_id in second and late.turn_id not in first
        assert list(gds_graphs(driver, prefix)) == [renamed]  # the stale projection was dropped

        for weight in (0.25, 0.5):  # two more walk settings: the LRU of 2 drops the oldest
            store.personalized_pagerank(b, reset, 0.6, adjacency_weight=weight)
        assert len(store.projections()) == 2 and renamed not in store.projections()
        assert set(gds_graphs(driver, prefix)) == set(store.projections())
        # `other` still names the evicted projection: it rebuilds it instead of failing.
        assert close_to(other.personalized_pagerank(b, reset, 0.6), second)
    finally:
        store.drop_generation()
        store.close()
        other.close()
    assert gds_graphs(driver, prefix) == {}


def test_dropping_a_generation_in_the_catalog_reclaims_its_nodes_and_projections(store, driver, neo4j_uri):
    from infra.catalog.neo4j import Neo4jViewCatalog

    rows, ids = build(store)
    keep = new_store(neo4j_uri)  # another generation on the same server is left alone
    build(keep)
    b = Boundary("t1", ("c1",))
    store.personalized_pagerank(b, {ids["rome"]: 1.0}, 0.6)
    prefix = f"memstream-graph-g{store.generation}-"
    assert len(gds_graphs(driver, prefix)) == 1
    from tests.integration.servers import neo4j_auth

    catalog = Neo4jViewCatalog(neo4j_uri, auth=neo4j_auth())
    try:
        catalog.drop("graph", store.generation)  # a retired generation (never live here)
        with driver.session() as s:
            left = s.run("MATCH (n) WHERE n.gen IN [$a, $b] RETURN n.gen AS g, count(*) AS n", a=store.generation, b=keep.generation).data()
        assert left == [{"g": keep.generation, "n": len(rows) + 5 + len(rows) + 1 + 1}]  # contexts, entities, sentences, positions, version
        assert gds_graphs(driver, prefix) == {} and store.positions() == {} and not store.known_tenant("t1")
        assert keep.known_tenant("t1")
    finally:
        catalog.close()
        keep.drop_generation()
        keep.close()


def test_unreachable_server_is_a_transient_error():
    [port] = free_ports(1)  # nothing listens there
    store = new_store(f"bolt://127.0.0.1:{port}")  # the constructor does no I/O
    try:
        with pytest.raises(TransientError, match=f"127.0.0.1:{port}"):
            store.positions()
    finally:
        store.close()


@pytest.mark.anyio
async def test_the_graph_projection_builds_on_neo4j_the_view_it_builds_embedded(tmp_path, models, neo4j_uri):
    """The real write path (NER, encoder, GraphProjection, ProjectionRunner) into Neo4j: late
    turns, a duplicate and a forgotten turn give the embedded graph view's canonical dump, and
    the same reads."""
    from streams.runner import ProjectionRunner
    from tests.e2e.helpers import assert_same_views, make_pipeline, publish, sample_items

    items = sample_items()
    p, _ = make_pipeline(tmp_path / "embedded", models, runner={"batch_size": 4})
    neo = new_store(neo4j_uri)
    await p.start()
    try:
        runner = ProjectionRunner(log_=p.log, topic=p.config.topic, dlq_topic=p.config.dlq_topic,
                                  projection=p.projection("graph", neo), group=f"neo4j-{uuid.uuid4().hex[:8]}",
                                  batch_size=4)
        late = items[:4] + items[6:] + items[4:6] + items[2:3]  # two late turns and a redelivered one
        await publish(p, late)
        await publish(p, [{"type": "ForgetRequested", "event_id": "forget-1", "tenant_id": "demo", "requested_at": "2026-05-01T00:00:00Z",
                           "scope": {"level": "turn", "conversation_id": "lisbon-trip", "event_id": items[9]["event_id"]}}])
        await p.process_until_caught_up()
        await runner.run_until(await p.log.end_offsets(p.config.topic))
        embedded = p.store("graph")
        assert_same_views(embedded.canonical_dump(), neo.canonical_dump())
        b = Boundary("demo", ("lisbon-trip",))
        assert neo.entity_labels(b) == embedded.entity_labels(b)
        assert neo.context_mentions(b) == embedded.context_mentions(b)
        maya, maya_id = models[0].encode(["Maya"]), entity_id("demo", "maya")
        [[exact]] = neo.align_entities(b, [maya_id], maya, 1)
        assert exact == embedded.align_entities(b, [maya_id], maya, 1)[0][0]
        reset = {exact.entity_id: 1.0}
        want = embedded.personalized_pagerank(b, reset, 0.8, max_iterations=1000, tolerance=1e-13)
        got = neo.personalized_pagerank(b, reset, 0.8, max_iterations=1000, tolerance=1e-13)
        assert got.keys() == want.keys() and max(abs(got[k] - want[k]) for k in want) < 1e-8
        # forgetting the tenant empties the view, entities included
        await publish(p, [{"type": "ForgetRequested", "event_id": "forget-2", "tenant_id": "demo", "requested_at": "2026-05-01T00:00:00Z",
                           "scope": {"level": "tenant"}}])
        await runner.run_until(await p.log.end_offsets(p.config.topic))
        assert neo.align_entities(b, [maya_id], maya, 1) == [[]]
        assert not neo.known_tenant("demo") and neo.known_entities("demo", [exact.entity_id]) == set()
        assert neo.personalized_pagerank(b, reset, 0.8) == {}
    finally:
        await p.close()
        neo.drop_generation()
        neo.close()
