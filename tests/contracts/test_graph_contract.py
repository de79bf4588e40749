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
        # the bounded query path's reads
        "bounded walk": lambda: rounded(store.personalized_pagerank(b, {ids["paris"]: 0.7, rows[2].turn_id: 0.3}, 0.6,
                                                                    contexts=[rows[0].turn_id], hub_cap=10)),
        "labels of": lambda: store.labels_of(b, [ids["rome"], ids["bob"], ids["kw:pasta"]]),
        "degrees": lambda: store.entity_degrees(b, [ids["ann"], ids["rome"]]),
        "mentions of": lambda: store.context_mentions(b, [rows[0].turn_id, rows[2].turn_id]),
        "incidence of": lambda: store.sentence_incidence(b, entity_ids=[ids["bob"]]).sentence_ids,
        "align among": lambda: [[(m.entity_id, round(m.score, 6)) for m in ms] for ms in store.align_entities(
            b, [ids["bob"], entity_id("t1", "roma")], np.stack([vec("bob"), vec("rome")]), 2, among=[rows[2].turn_id])],
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


# -- the bounded query path's reads -------------------------------------------------------------
# Two sessions with two agents and a value (a DATE: kind "value", weight 0, not a graph node) in c1;
# c2 and tenant t2 hold the same turns. Entities are the tenant's, shared by its conversations.
WIDE = [  # (turn index, session, agent, minutes, mentioned names)
    (0, "s1", "a1", 0, ["ann", "paris", "bob"]),
    (1, "s1", "a2", 10, ["bob", "paris", "2024"]),
    (2, "s1", "a1", 20, ["rome", "kw:pasta"]),
    (3, "s1", "a2", 30, ["ann"]),
    (4, "s2", "a1", 100, ["bob", "lyon"]),
    (5, "s2", "a2", 110, ["ann", "kw:pasta", "lyon"]),
]
WIDE_LABELS = {**LABELS, "lyon": "GPE", "2024": "DATE"}
VALUES = {"2024"}


def build_wide(store, tenant="t1", conv="c1", offset=0):
    """WIDE written the way the graph projection writes it; returns (rows, entity ids by name)."""
    rows = [row(i, f"turn {i}", tenant=tenant, conv=conv, session=s, agent=a, minutes=m) for i, s, a, m, _ in WIDE]
    names = sorted({n for *_, ns in WIDE for n in ns})
    ids = {n: entity_id(tenant, n) for n in names}
    change = GraphChangeSet(put_turns=rows)
    change.entities = [EntityNode(ids[n], tenant, n, WIDE_LABELS[n],
                                  np.zeros(0, np.float32) if n.startswith("kw:") else vec(n)) for n in names]
    for r, (*_, ns) in zip(rows, WIDE):
        nodes = [n for n in ns if n not in VALUES]
        for n in ns:
            kind = "value" if n in VALUES else "keyword" if n.startswith("kw:") else "ner"
            change.mentions.append(Mention(ids[n], r.turn_id, 1, 0.0 if n in VALUES else 1 / len(nodes), kind))
        change.sentences.append(SentenceNode(f"{r.turn_id}.s0", r.turn_id, 0, 0, 6, tuple(ids[n] for n in nodes)))
    for session in ("s1", "s2"):
        turns = [r for r in rows if r.session_id == session]
        change.adjacency[(tenant, conv, session)] = [AdjacencyEdge(a.turn_id, b.turn_id, tenant, conv, session)
                                                     for a, b in zip(turns, turns[1:])]
    store.apply(change, {0: offset + len(rows)})
    return rows, ids


def _wide(store):
    """t1's c1 and c2, and t2's c1: (rows of each, t1's entity ids, t2's)."""
    c1, ids = build_wide(store)
    c2, _ = build_wide(store, conv="c2", offset=10)
    t2, ids2 = build_wide(store, tenant="t2", offset=20)
    return c1, c2, t2, ids, ids2


def _admitted(rows, b: Boundary):
    """The rows (of WIDE's turns) a boundary admits: tenant, conversations, sessions, agents, times."""
    return [r for r in rows if r.tenant_id == b.tenant_id
            and (b.conversation_ids is None or r.conversation_id in b.conversation_ids)
            and (b.session_ids is None or r.session_id in b.session_ids)
            and (b.agent_ids is None or r.agent_id in b.agent_ids)
            and (b.since is None or r.occurred_at >= b.since) and (b.until is None or r.occurred_at <= b.until)]


def _names(r) -> list[str]:
    return next(ns for i, *_, ns in WIDE if i == r.turn_index)


def _wide_boundaries():
    from datetime import timedelta

    from tests.contracts.builders import T0

    return [Boundary("t1"), Boundary("t1", ("c1",)), Boundary("t1", ("c1",), ("s2",)),
            Boundary("t1", ("c1",), agent_ids=("a2",)),
            Boundary("t1", ("c1", "c2"), since=T0 + timedelta(minutes=15), until=T0 + timedelta(minutes=105)),
            Boundary("t1", ("c9",))]


def test_labels_of_and_entity_degrees_answer_for_the_asked_entities(store):
    """labels_of: the asked named entities that a context inside the boundary mentions as a graph
    node (entity_labels restricted to them); entity_degrees: how many contexts of the boundary's
    conversations (sessions, agents and times aside) mention each; another tenant's never."""
    c1, c2, t2, ids, ids2 = _wide(store)
    asked = [ids[n] for n in ids if n not in VALUES] + list(ids2.values()) + ["n_nothing"]
    for b in _wide_boundaries():
        inside = _admitted(c1 + c2 + t2, b)
        named = {ids[n]: WIDE_LABELS[n] for r in inside for n in _names(r)
                 if n not in VALUES and not n.startswith("kw:")}
        assert store.labels_of(b, asked) == named, b
        assert store.labels_of(b, asked) == {e: label for e, label in store.entity_labels(b).items() if e in asked}, b
        whole = _admitted(c1 + c2 + t2, Boundary(b.tenant_id, b.conversation_ids))
        want: dict[str, int] = {}
        for r in whole:
            for n in _names(r):
                if n not in VALUES:
                    want[ids[n]] = want.get(ids[n], 0) + 1
        assert store.entity_degrees(b, asked) == want, b
    assert store.labels_of(Boundary("t1"), []) == {} and store.entity_degrees(Boundary("t1"), []) == {}
    assert store.entity_degrees(Boundary("t2"), [ids["ann"], ids2["ann"]]) == {ids2["ann"]: 3}




def test_labels_of_leaves_out_what_entity_labels_leaves_out(store, request):
    """A value (DATE, CARDINAL…) is no graph node: entity_labels leaves it out, so labels_of does."""
    c1, _, _, ids, _ = _wide(store)
    b = Boundary("t1", ("c1",))
    assert ids["2024"] not in store.entity_labels(b)
    assert store.labels_of(b, [ids["2024"], ids["paris"]]) == {ids["paris"]: "GPE"}


def test_present_counts_what_the_whole_boundary_alignment_counts(store, request):
    """present and align_entities' exact match agree on an entity mentioned only as a value."""
    c1, _, _, ids, _ = _wide(store)
    b = Boundary("t1", ("c1",))
    exact = [m.entity_id for m in store.align_entities(b, [ids["2024"]], np.zeros((1, 16), np.float32), 1)[0]
             if m.score == 1.0]
    assert store.present(b, [ids["2024"]]) == set(exact) == set()


def test_align_among_matches_like_the_whole_boundary_alignment(store, request):
    """With `among`, an entity exact in the boundary still matches exactly; an entity mentioned
    only as a value does not, as without `among`."""
    c1, _, _, ids, _ = _wide(store)
    b = Boundary("t1", ("c1",))
    zero = np.zeros((1, 16), np.float32)
    assert [m.score for m in store.align_entities(b, [ids["2024"]], zero, 1)[0]] != [1.0]
    assert [m.score for m in store.align_entities(b, [ids["2024"]], zero, 1, among=[r.turn_id for r in c1])[0]] != [1.0]


def test_align_among_takes_its_cosine_candidates_from_the_given_contexts(store):
    c1, c2, t2, ids, ids2 = _wide(store)
    b = Boundary("t1", ("c1",))
    roma, q = entity_id("t1", "roma"), np.stack([vec("bob"), vec("rome"), vec("lyon")])
    asked = [ids["bob"], roma, entity_id("t1", "lyons")]
    by_id = {r.turn_id: r for r in c1}

    def scored(matches):
        return [[(m.entity_id, m.label, round(m.score, 5)) for m in ms] for ms in matches]

    # Every context of the boundary as candidates: the whole boundary's alignment.
    every = scored(store.align_entities(b, asked, q, 3, among=list(by_id)))
    assert every == scored(store.align_entities(b, asked, q, 3))
    # One context (rome and a keyword): rome alone can answer by cosine; bob is still exact.
    exact, near, far = store.align_entities(b, asked, q, 3, among=[c1[2].turn_id])
    assert [(m.entity_id, m.score) for m in exact] == [(ids["bob"], 1.0)]
    assert [m.entity_id for m in near] == [ids["rome"]] and near[0].score > 0.999
    assert [m.entity_id for m in far] == [ids["rome"]]
    # No candidates: exact matches only; another tenant's contexts and entities never answer.
    assert scored(store.align_entities(b, asked, q, 3, among=[])) == [[(ids["bob"], "PERSON", 1.0)], [], []]
    got = store.align_entities(b, [ids2["bob"], roma], np.stack([vec("bob"), vec("rome")]), 3,
                               among=[r.turn_id for r in t2])
    assert got == [[], []]


def test_context_mentions_and_sentence_incidence_for_given_ids(store):
    """context_mentions(context_ids) and sentence_incidence(entity_ids) are the boundary's answers
    restricted to what is asked; another tenant's ids give nothing."""
    c1, c2, t2, ids, ids2 = _wide(store)
    for b in _wide_boundaries():
        inside = [r.turn_id for r in _admitted(c1 + c2, b)]
        asked = inside[::2] + [r.turn_id for r in t2] + ["t_nothing"]
        whole = store.context_mentions(b)
        assert set(whole) == set(inside)
        assert store.context_mentions(b, asked) == {c: m for c, m in whole.items() if c in asked}, b
        full = store.sentence_incidence(b)
        for names in (["bob"], ["lyon", "kw:pasta"], ["ann"], ["2024"]):
            entities = [ids[n] for n in names] + [ids2[n] for n in names]
            got = store.sentence_incidence(b, entity_ids=entities)
            want = full.sentences_mentioning(entities)
            assert sorted(got.sentence_ids) == sorted(want), (b, names)
            for s in got.sentence_ids:  # each with all its entities, in its context
                i, j = got.sentence_ids.index(s), full.sentence_ids.index(s)
                assert got.context_ids[i] == full.context_ids[j]
                mine, theirs = got.matrix[i].indices, full.matrix[j].indices
                assert {got.entity_ids[k] for k in mine} == {full.entity_ids[k] for k in theirs}
    assert store.sentence_incidence(Boundary("t1"), entity_ids=[]).sentence_ids == ()




def test_context_mentions_of_given_ids_stay_inside_the_boundary(store, request):
    """The graph a query sees is its boundary's (module docstring): asked for a context of another
    conversation or session of the tenant, context_mentions leaves it out."""
    c1, c2, _, _, _ = _wide(store)
    b = Boundary("t1", ("c1",), ("s1",))
    asked = [r.turn_id for r in c1 + c2]
    assert set(store.context_mentions(b, asked)) == {r.turn_id for r in c1 if r.session_id == "s1"}


def test_align_among_takes_its_candidates_inside_the_boundary(store, request):
    """Candidate contexts outside the boundary (another session of the conversation) lend no entity."""
    c1, _, _, ids, _ = _wide(store)
    b = Boundary("t1", ("c1",), ("s1",))
    [near] = store.align_entities(b, [entity_id("t1", "lyons")], vec("lyon")[None, :], 1, among=[c1[4].turn_id])
    assert near == []  # lyon is mentioned in s2 only


# -- the bounded walk ---------------------------------------------------------------------------
def _close(a: dict, b: dict, tol: float = 1e-6) -> bool:
    return set(a) == set(b) and all(abs(a[k] - b[k]) < tol for k in a)


def test_bounded_walk_on_every_context_is_the_whole_walk(store):
    """With every context of the boundary given and no hub cap, the neighbourhood is the whole
    boundary's graph: the walk agrees with the whole-boundary walk (excluded labels, hubs by
    `max_share` of `contexts_total` and adjacency weights included)."""
    c1, c2, t2, ids, _ = _wide(store)
    reset = {ids["paris"]: 0.5, c1[2].turn_id: 0.3, ids["lyon"]: 0.2}
    exact = dict(max_iterations=500, tolerance=1e-12)
    for b, walks in ((Boundary("t1", ("c1",)), (dict(adjacency_weight=0.5), dict(exclude_labels=("SPEAKER",)))),
                     (Boundary("t1"), (dict(adjacency_weight=0.5),)),
                     (Boundary("t1", ("c1",), ("s1",), agent_ids=("a1",)), (dict(adjacency_weight=0.5),))):
        every = [r.turn_id for r in _admitted(c1 + c2 + t2, b)]
        for walk in walks:
            whole = store.personalized_pagerank(b, reset, 0.6, **walk, **exact)
            bounded = store.personalized_pagerank(b, reset, 0.6, **walk, **exact, contexts=every, hub_cap=10**6,
                                                  per_entity=10**6)
            assert set(whole) == set(every) and _close(bounded, whole), (b, walk)
    b = Boundary("t1", ("c1",))
    every = [r.turn_id for r in c1]
    whole = store.personalized_pagerank(b, reset, 0.6, max_share=0.4, **exact)
    bounded = store.personalized_pagerank(b, reset, 0.6, max_share=0.4, **exact, contexts=every,
                                          contexts_total=len(every))
    assert _close(bounded, whole)


def test_bounded_walk_builds_its_neighbourhood_as_stated(store):
    """The neighbourhood: the given contexts and the reset's, the `per_entity` strongest contexts of
    each reset entity, the entities they mention but hubs (`hub_cap`, or `max_share` of
    `contexts_total`), and the adjacency between the contexts."""
    rows, ids = build(store)  # degrees: ann 2, bob 2, paris 2, rome 1, kw:pasta 1
    b, t = Boundary("t1", ("c1",)), [r.turn_id for r in rows]
    walk = dict(max_iterations=500, tolerance=1e-12)
    # paris is mentioned by turn 0 (weight 1/3) and turn 1 (1/2): its strongest context is turn 1.
    # (Hubs are judged against `contexts_total`, else the neighbourhood's size: four turns here.)
    got = store.personalized_pagerank(b, {ids["paris"]: 1.0}, 0.6, contexts=[], per_entity=1, contexts_total=4, **walk)
    assert set(got) == {t[1]}
    got = store.personalized_pagerank(b, {ids["paris"]: 1.0}, 0.6, contexts=[], per_entity=2, contexts_total=4, **walk)
    assert set(got) == {t[0], t[1]}
    # hub_cap 1: ann, bob and paris are hubs. Turn 0 keeps no entity; rome reaches turn 2; turns 0
    # and 2 are not adjacent. The walk: turn 2, rome and pasta only (turn 0 isolated, so 0).
    small = nx.Graph([(t[2], ids["rome"], {"weight": 0.5}), (t[2], ids["kw:pasta"], {"weight": 0.5})])
    want = nx.pagerank(small, alpha=0.6, personalization={ids["rome"]: 1.0, t[2]: 0.0, ids["kw:pasta"]: 0.0}, tol=1e-12,
                       max_iter=1000)
    for hubs in (dict(hub_cap=1), dict(max_share=0.3, contexts_total=4)):
        got = store.personalized_pagerank(b, {ids["rome"]: 1.0}, 0.6, contexts=[t[0]], **hubs, **walk)
        assert set(got) == {t[0], t[2]} and got[t[0]] == 0.0 and abs(got[t[2]] - want[t[2]]) < 1e-6, hubs
    # A reset entity that is a hub reaches nothing, and its mass goes nowhere: an empty walk.
    assert store.personalized_pagerank(b, {ids["ann"]: 1.0}, 0.6, contexts=[], hub_cap=1, **walk) == {}
    # Adjacency between the given contexts carries the walk from turn 1 to turns 0 and 2.
    got = store.personalized_pagerank(b, {t[1]: 1.0}, 0.6, adjacency_weight=1.0, contexts=[t[0], t[2]], hub_cap=1,
                                      **walk)
    assert set(got) == {t[0], t[1], t[2]} and got[t[0]] > 0 and got[t[2]] > 0




def test_bounded_walk_stays_inside_the_boundary(store, request):
    """Contexts and reset ids outside the boundary (another conversation, another tenant) are
    ignored, as in the whole-boundary walk: only the boundary's contexts come back."""
    c1, c2, t2, ids, ids2 = _wide(store)
    b = Boundary("t1", ("c1",))
    reset = {c2[0].turn_id: 1.0, t2[0].turn_id: 1.0, ids2["rome"]: 1.0, ids["rome"]: 1.0}
    asked = [c1[0].turn_id, c2[1].turn_id, t2[1].turn_id, "t_nothing"]
    got = store.personalized_pagerank(b, reset, 0.6, contexts=asked)
    assert got and set(got) <= {r.turn_id for r in c1}


def test_bounded_reads_follow_writes_and_forgets(store):
    """What the bounded reads return right after a write or a forget is what the graph holds then."""
    c1, c2, t2, ids, _ = _wide(store)
    b = Boundary("t1", ("c1",))
    every = [r.turn_id for r in c1]

    def seen(candidates):
        # The walk reaches the late turn and the forgotten one (if it were there) through rome only.
        walk = store.personalized_pagerank(b, {ids["rome"]: 1.0, ids["gelato"]: 1.0}, 0.6, contexts=candidates,
                                           hub_cap=10)
        return (store.labels_of(b, [ids["rome"], ids["gelato"]]),
                store.entity_degrees(b, [ids["rome"], ids["kw:pasta"]]),
                set(store.context_mentions(b, [c1[2].turn_id, late.turn_id])),
                set(store.sentence_incidence(b, entity_ids=[ids["rome"]]).context_ids), set(walk),
                [m.entity_id for m in store.align_entities(b, [entity_id("t1", "roma")], vec("rome")[None, :], 1,
                                                            among=[c1[2].turn_id, late.turn_id])[0]])

    ids["gelato"] = entity_id("t1", "gelato")
    late = row(7, "late turn", conv="c1", session="s2", minutes=120)
    others = [t for t in every if t != c1[2].turn_id]
    assert seen(others) == ({ids["rome"]: "GPE"}, {ids["rome"]: 1, ids["kw:pasta"]: 2}, {c1[2].turn_id},
                            {c1[2].turn_id}, set(every), [ids["rome"]])
    store.apply(GraphChangeSet(
        put_turns=[late], entities=[EntityNode(ids["gelato"], "t1", "gelato", "PRODUCT", vec("gelato"))],
        mentions=[Mention(ids["gelato"], late.turn_id, 1, 0.5, "ner"),
                  Mention(ids["rome"], late.turn_id, 1, 0.5, "ner")],
        sentences=[SentenceNode(f"{late.turn_id}.s0", late.turn_id, 0, 0, 9, (ids["gelato"], ids["rome"]))]), {0: 40})
    assert seen(others) == ({ids["rome"]: "GPE", ids["gelato"]: "PRODUCT"}, {ids["rome"]: 2, ids["kw:pasta"]: 2},
                            {c1[2].turn_id, late.turn_id}, {c1[2].turn_id, late.turn_id}, set(every) | {late.turn_id},
                            [ids["rome"]])
    forget_turn = ForgetScope(level="turn", conversation_id="c1", event_id=c1[2].event_id)
    store.apply(GraphChangeSet(forgets=[Forget("t1", forget_turn)]), {0: 41})
    assert seen(others) == ({ids["rome"]: "GPE", ids["gelato"]: "PRODUCT"}, {ids["rome"]: 1, ids["kw:pasta"]: 1},
                            {late.turn_id}, {late.turn_id}, set(others) | {late.turn_id}, [ids["rome"]])
    store.apply(GraphChangeSet(forgets=[Forget("t1", ForgetScope(level="conversation", conversation_id="c1"))]),
                {0: 42})
    assert seen([]) == ({}, {}, set(), set(), set(), [])
