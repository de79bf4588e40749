"""Contract of the GraphStore port (entity–context graph, PPR), run against every adapter."""

from __future__ import annotations

import uuid

import networkx as nx
import numpy as np
import pytest

from schemas.events import ForgetScope
from schemas.ports.graph import AdjacencyEdge, EntityNode, GraphChangeSet, Mention, SentenceNode
from schemas.ports.views import Boundary, Forget
from schemas.ordering import order_turns
from schemas.text import normalize_entity
from schemas.units import entity_id
from tests.contracts import forgetting
from tests.contracts.builders import check_concurrent_reads, check_versions_pinned_by_read_scope, row, unit_vector

pytestmark = pytest.mark.contract


def _sqlite(request, tmp_path):
    from infra.graph.sqlite import SqliteGraphStore

    return SqliteGraphStore(tmp_path / "graph.sqlite", 1)


def _neo4j(request, tmp_path):
    from infra.graph.neo4j import Neo4jGraphStore

    # One server per session; a random generation number per test is the namespace every
    # node, query and GDS projection of the store is bound to, so tests never see each other.
    from tests.integration.servers import neo4j_auth

    uri, generation = request.getfixturevalue("neo4j_uri"), uuid.uuid4().int % 2**52 + 1_000_000

    def cleanup():  # runs after the store is closed: a second store drops the generation's nodes
        leftover = Neo4jGraphStore(uri, generation, auth=neo4j_auth())
        try:
            leftover.drop_generation()
        finally:
            leftover.close()

    request.addfinalizer(cleanup)
    return Neo4jGraphStore(uri, generation, auth=neo4j_auth())


ADAPTERS = {"sqlite": _sqlite, "neo4j": _neo4j}
NEEDS_SERVER = {"neo4j"}
SERVER_DATA = {"neo4j": "neo4j"}  # adapter -> test server whose files a byte scan reads
KEEPS_PLAINTEXT = {"sqlite"}  # Neo4j keeps no text, speaker or entity name


@pytest.fixture(params=[pytest.param(name, marks=pytest.mark.integration) if name in NEEDS_SERVER else name for name in sorted(ADAPTERS)])
def store(request, tmp_path):
    s = ADAPTERS[request.param](request, tmp_path)
    yield s
    s.close()


# Four turns in c1: Ann talks about Paris and Bob; Bob about Paris; a turn about Rome; plus c2.
MENTIONS = {0: ["ann", "paris", "bob"], 1: ["bob", "paris"], 2: ["rome", "kw:pasta"], 3: ["ann"]}
LABELS = {"ann": "SPEAKER", "bob": "PERSON", "paris": "GPE", "rome": "GPE", "kw:pasta": "KEYWORD"}


def vec(name):
    return unit_vector(sum(map(ord, name)))


def build(store, tenant="t1", conv="c1", offset=0):
    rows = [row(i, f"turn {i}", tenant=tenant, conv=conv) for i in MENTIONS]
    names = sorted({n for ns in MENTIONS.values() for n in ns})
    ids = {n: entity_id(tenant, n) for n in names}
    change = GraphChangeSet(put_turns=rows)
    change.entities = [EntityNode(ids[n], tenant, n, LABELS[n], np.zeros(0, np.float32) if n.startswith("kw:") else vec(n)) for n in names]
    for i, ns in MENTIONS.items():
        for n in ns:
            change.mentions.append(Mention(ids[n], rows[i].turn_id, 1, 1 / len(ns), "ner"))
        change.sentences.append(SentenceNode(f"{rows[i].turn_id}.s0", rows[i].turn_id, 0, 0, 6, tuple(ids[n] for n in ns)))
    change.adjacency[(tenant, conv, "s1")] = [AdjacencyEdge(a.turn_id, b.turn_id, tenant, conv, "s1") for a, b in zip(rows, rows[1:])]
    store.apply(change, {0: offset + len(rows)})
    return rows, ids


def reference_ppr(rows, ids, reset, damping, adjacency_weight):
    g = nx.Graph()
    for i, ns in MENTIONS.items():
        for n in ns:
            g.add_edge(rows[i].turn_id, ids[n], weight=1 / len(ns))
    for a, b in zip(rows, rows[1:]):
        g.add_edge(a.turn_id, b.turn_id, weight=adjacency_weight)
    personalization = {n: reset.get(n, 0.0) for n in g.nodes}
    return nx.pagerank(g, alpha=damping, personalization=personalization, weight="weight", tol=1e-12, max_iter=1000)


def test_personalized_pagerank_matches_reference(store):
    rows, ids = build(store)
    reset = {ids["paris"]: 0.7, rows[2].turn_id: 0.3}
    got = store.personalized_pagerank(Boundary("t1", ("c1",)), reset, 0.6, max_iterations=500, tolerance=1e-12, adjacency_weight=0.5)
    want = reference_ppr(rows, ids, reset, 0.6, 0.5)
    assert set(got) == {r.turn_id for r in rows}  # context nodes only
    for cid, score in got.items():
        assert abs(score - want[cid]) < 1e-6
    top = max(got, key=got.get)
    assert top in {rows[0].turn_id, rows[1].turn_id, rows[2].turn_id}
    assert store.personalized_pagerank(Boundary("t1", ("c1",)), {}, 0.6) == {}


def test_excluded_labels_are_left_out_of_the_walk(store):
    rows, ids = build(store)
    b = Boundary("t1", ("c1",))
    with_ann = store.personalized_pagerank(b, {rows[0].turn_id: 1.0}, 0.6, adjacency_weight=0.0)
    without = store.personalized_pagerank(b, {rows[0].turn_id: 1.0}, 0.6, adjacency_weight=0.0, exclude_labels=("SPEAKER",))
    assert with_ann[rows[3].turn_id] > 0  # reached only through the speaker node "ann"
    assert without[rows[3].turn_id] == 0


def test_graph_reads_are_bounded_by_conversation_and_tenant(store):
    rows1, ids1 = build(store, conv="c1")
    rows2, _ = build(store, conv="c2", offset=4)
    rows3, ids3 = build(store, tenant="t2", offset=8)
    ppr = store.personalized_pagerank(Boundary("t1", ("c1",)), {ids1["paris"]: 1.0}, 0.6)
    assert set(ppr) == {r.turn_id for r in rows1}
    assert store.personalized_pagerank(Boundary("t1", ("c1",)), {ids3["paris"]: 1.0}, 0.6) == {}
    b = Boundary("t1", ("c1",))
    exact, near = store.align_entities(b, [ids1["bob"], entity_id("t1", "roma")], np.stack([vec("bob"), vec("rome")]), 2)
    assert [(m.entity_id, m.label, m.score) for m in exact] == [(ids1["bob"], "PERSON", 1.0)]
    assert near[0].entity_id == ids1["rome"] and near[0].label == "GPE" and near[0].score > 0.999
    assert all(m.entity_id != ids1["kw:pasta"] for m in near)  # keyword nodes align exactly only
    assert store.align_entities(b, [ids1["kw:pasta"]], np.zeros((1, 16), np.float32), 1)[0][0].entity_id == ids1["kw:pasta"]
    # Another tenant's entity is never matched exactly, even asked by its own id.
    assert all(m.entity_id in ids1.values() for m in store.align_entities(b, [ids3["paris"]], vec("paris")[None, :], 3)[0])
    assert store.present(b, [ids1["rome"], ids3["rome"], "n_nothing"]) == {ids1["rome"]}
    assert store.context_mentions(b)[rows1[2].turn_id] == sorted([(ids1["kw:pasta"], "KEYWORD"), (ids1["rome"], "GPE")])
    assert dict(store.entity_labels(b)) == {ids1[n]: LABELS[n] for n in ("ann", "bob", "paris", "rome")}  # named entities, not keywords
    assert dict(store.entity_labels(Boundary("t2", ("c1",)))) == {ids3[n]: LABELS[n] for n in ("ann", "bob", "paris", "rome")}
    inc = store.sentence_incidence(Boundary("t1", ("c1",)))
    bob = inc.sentences_mentioning([ids1["bob"]])
    assert {inc.context_ids[inc.sentence_ids.index(s)] for s in bob} == {rows1[0].turn_id, rows1[1].turn_id}
    assert set(inc.context_ids) <= {r.turn_id for r in rows1}  # nothing from c2 or tenant t2
    assert ids3["paris"] not in inc.entity_index
    assert store.context_entities("t1", [rows1[1].turn_id]) == {rows1[1].turn_id: {ids1["bob"], ids1["paris"]}}
    assert store.known_entities("t1", [ids1["ann"], "n_nothing"]) == {ids1["ann"]}
    assert store.known_entities("t2", [ids1["ann"]]) == set()


def test_forget_turn_and_conversation(store):
    rows, ids = build(store)
    store.apply(GraphChangeSet(forgets=[Forget("t1", ForgetScope(level="turn", conversation_id="c1", event_id=rows[2].event_id))]), {0: 5})
    ppr = store.personalized_pagerank(Boundary("t1", ("c1",)), {ids["paris"]: 1.0}, 0.6)
    assert rows[2].turn_id not in ppr
    assert store.known_entities("t1", [ids["rome"]]) == set()  # nobody mentions it any more
    store.apply(GraphChangeSet(forgets=[Forget("t1", ForgetScope(level="conversation", conversation_id="c1"))]), {0: 6})
    assert store.personalized_pagerank(Boundary("t1", ("c1",)), {ids["paris"]: 1.0}, 0.6) == {}
    assert store.positions() == {0: 6}


def test_boundary_reads_follow_writes_and_forgets(store):
    """An adapter may keep a boundary's entities, labels and sentences between writes (Neo4j
    does, per data version); what a query then reads must still be what the graph holds now."""
    rows, ids = build(store)
    b = Boundary("t1", ("c1",))
    gelato, rome = entity_id("t1", "kw:gelato"), ids["rome"]
    zero = np.zeros((2, 16), np.float32)  # scores 0 against every name: only exact matches score 1

    def seen():
        return (store.present(b, [gelato, rome]), [[m.entity_id for m in ms if m.score == 1.0] for ms in store.align_entities(b, [gelato, rome], zero, 1)],
                rome in store.entity_labels(b), set(store.sentence_incidence(b).context_ids))

    assert seen() == ({rome}, [[], [rome]], True, {r.turn_id for r in rows})  # read, and kept if the adapter keeps it
    late = row(7, "late turn", tenant="t1", conv="c1")
    change = GraphChangeSet(put_turns=[late], entities=[EntityNode(gelato, "t1", "kw:gelato", "KEYWORD", np.zeros(0, np.float32))],
                            mentions=[Mention(gelato, late.turn_id, 1, 1.0, "keyword")],
                            sentences=[SentenceNode(f"{late.turn_id}.s0", late.turn_id, 0, 0, 9, (gelato,))])
    store.apply(change, {0: 9})
    assert seen() == ({gelato, rome}, [[gelato], [rome]], True, {r.turn_id for r in rows} | {late.turn_id})
    store.apply(GraphChangeSet(forgets=[Forget("t1", ForgetScope(level="turn", conversation_id="c1", event_id=rows[2].event_id))]), {0: 10})
    assert seen() == ({gelato}, [[gelato], []], False, {r.turn_id for r in rows if r is not rows[2]} | {late.turn_id})


def test_reads_from_several_threads_at_once_answer_as_alone(store, request):
    rows, ids = build(store)
    b = Boundary("t1", ("c1",))
    rounded = lambda scores: {k: round(v, 9) for k, v in scores.items()}  # noqa: E731
    check_concurrent_reads(store, request.node.callspec.params["store"], NEEDS_SERVER, {
        "pagerank": lambda: rounded(store.personalized_pagerank(b, {ids["paris"]: 0.7, rows[2].turn_id: 0.3}, 0.6, adjacency_weight=0.5)),
        "closure walk": lambda: rounded(store.personalized_pagerank(b, {rows[0].turn_id: 1.0}, 0.6, exclude_labels=("SPEAKER",))),
        "present": lambda: store.present(b, [ids["rome"], ids["bob"], "n_nothing"]),
        "align": lambda: [[(m.entity_id, round(m.score, 6)) for m in ms]
                          for ms in store.align_entities(b, [ids["bob"], entity_id("t1", "roma")], np.stack([vec("bob"), vec("rome")]), 2)],
        "labels": lambda: dict(store.entity_labels(b)),
        "incidence": lambda: (store.sentence_incidence(b).sentence_ids, store.sentence_incidence(b).context_ids),
        "mentions": lambda: store.context_mentions(b),
    })


def test_versions_change_on_write_and_hold_within_a_read_scope(store):
    build(store)
    check_versions_pinned_by_read_scope(store, lambda: store.apply(GraphChangeSet(put_turns=[row(90, "late turn")]), {0: 99}))


# -- forgetting -------------------------------------------------------------------------------
def _turn_entities(t) -> list[tuple[str, str, str]]:
    """(name, label, kind) a turn mentions, as NER, the speaker rule and keyword nodes would
    give them: its speaker, its `topicN` words (named), its canary words (keywords)."""
    words = [w.strip(".,:") for w in t.text.split()]
    return ([(normalize_entity(t.speaker), "SPEAKER", "speaker")] + [(w, "EVENT", "ner") for w in words if w.startswith("topic")]
            + [("kw:" + w, "KEYWORD", "keyword") for w in words if w.endswith("canary")])


def _session_change(change: GraphChangeSet, key, before, after, added) -> None:
    """The graph projection's rule: a new turn's entities, mentions (eq. 4) and sentence; the
    session's adjacency replaced from the turns left."""
    tenant, conv, session = key
    ordered = order_turns(after)
    change.adjacency[key] = [AdjacencyEdge(a.turn_id, b.turn_id, tenant, conv, session) for a, b in zip(ordered, ordered[1:])]
    for t in added:
        found = _turn_entities(t)
        for name, label, kind in found:
            change.entities.append(EntityNode(entity_id(tenant, name), tenant, name, label,
                                              np.zeros(0, np.float32) if kind == "keyword" else vec(name)))
            change.mentions.append(Mention(entity_id(tenant, name), t.turn_id, 1, 1 / len(found), kind))
        change.sentences.append(SentenceNode(f"{t.turn_id}.s0", t.turn_id, 0, 0, len(t.text), tuple(entity_id(tenant, n) for n, _, _ in found)))


MODEL = forgetting.Model(GraphChangeSet, _session_change)


def _reference(request, tmp_path):
    def make():
        ref = ADAPTERS[request.node.callspec.params["store"]](request, tmp_path / "ref")
        request.addfinalizer(ref.close)
        return ref

    return make


@pytest.mark.parametrize("scope", sorted(forgetting.SCOPES))
def test_forget_removes_exactly_what_the_scope_covers(store, request, tmp_path, scope):
    forgetting.check_scope(store, _reference(request, tmp_path), MODEL, scope)  # the dump's entities: orphans dropped too


def test_forget_erases_every_byte_of_the_forgotten_turns(store, request, tmp_path):
    name = request.node.callspec.params["store"]
    root = forgetting.data_dir(SERVER_DATA[name]) if name in SERVER_DATA else tmp_path
    if name in KEEPS_PLAINTEXT:
        got = forgetting.check_canary(store, root, _reference(request, tmp_path), MODEL, keeps_plaintext=True)
        print(f"graph/{name}: canaries seen before in {got['seen_before']}; erased after {got['erasure_seconds']:.1f} s")
        return

    def probe(token: str) -> None:  # a plain property of the length of a turn's text (a short one Neo4j would pack into 6-bit codes)
        store._query("writing a probe", "CREATE (:MemstreamProbe {gen: $gen, text: $text})",
                     text=f"A probe of what Neo4j keeps in its files: {token} in plain text, long enough for the string store.")
        request.addfinalizer(lambda: store._query("deleting the probe", "MATCH (p:MemstreamProbe {gen: $gen}) DELETE p"))

    def ledger_has_no_text(rows, turn_scope) -> None:
        assert {(t.text, t.speaker, t.source_ref) for r in rows for t in store.session_turns(*r.session_key)} == {("", "", None)}

    got = forgetting.check_canary(store, root, _reference(request, tmp_path), MODEL, keeps_plaintext=False, probe=probe,
                                  between=ledger_has_no_text)
    print(f"graph/{name}: no plaintext ever; erased after {got['erasure_seconds']:.1f} s")
