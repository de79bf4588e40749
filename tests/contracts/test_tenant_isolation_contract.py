"""Tenant isolation at the ports, run against every adapter: hierarchy (unit store),
lexical, dense (vectors) and graph.

Each hypothesis example writes two to four tenants into one store: tenant ids that are
prefixes of each other (`5-ab`, `5-ab-`, `5-ab_b`; `-` and `_` are Lucene's and SQL LIKE's
special characters), sharing every other identifier — conversation, session, agent and event
ids, drawn from the characters each engine's query language treats specially (Cypher's quotes,
backticks, backslashes, `$`, `{}`; Lucene's `+ - && || ! ( ) { } [ ] ^ " ~ * ? : \\ /`; JSON
and Qdrant filter syntax; SQL's quotes, `%`, `_`) and from all of the id pattern — the same
texts and vectors at the same positions, and the same entity names. Only a private word per
tenant (in its texts) and a private entity name differ. Every read of the port then returns,
for the asking tenant (one per example) and a boundary drawn over those ids, exactly that
tenant's units inside the boundary: nothing of another tenant (CrossTenant), nothing missing.

A store gets one fresh namespace per test (the suites' adapter factories: a new index prefix,
collection prefix or graph generation, dropped afterwards); each example's tenant ids carry a
serial number, so the examples of one run never share a tenant, and every earlier example's
data is more bait for the next. A store wrapped in a double that drops the tenant filter
makes the same check fail.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass, field, replace
from datetime import timedelta

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from schemas.events import ID_PATTERN
from schemas.ports.graph import AdjacencyEdge, EntityNode, GraphChangeSet, Mention, SentenceNode
from schemas.ports.lexical import LexicalChangeSet, LexicalDoc
from schemas.ports.unit_store import UnitChangeSet
from schemas.ports.vectors import COLLECTIONS, VectorChangeSet, VectorPoint
from schemas.ports.views import Boundary, TurnRow, content_hash
from schemas.units import UNIT_KINDS, TraceUnit, entity_id, sentence_id, turn_unit_id, unit_key
from tests.contracts import (
    test_graph_contract as graph_suite,
    test_lexical_contract as lexical_suite,
    test_unit_store_contract as unit_suite,
    test_vector_contract as vector_suite,
)
from tests.contracts.builders import T0, unit_vector, units

pytestmark = pytest.mark.contract

EXAMPLES = 50  # per adapter: at least 50 per server adapter
DIM = 16
COMMON = "marmalade"  # in every text of every tenant: a query with it matches every document

# Characters the engines' query languages treat specially, and Lucene's operators as words.
SPECIALS = "'\"`\\$%_{}[]()+-&|!^~*?:/<>=@#;,. "
_ID_CHARS = st.sampled_from(tuple(SPECIALS) + tuple("aZ9éß😀"))
_LUCENE = ("+", "-", "&&", "||", "!", "(", ")", "{", "}", "[", "]", "^", '"', "~", "*", "?", ":", "\\", "/", "AND", "OR", "NOT",
           "TO", "*:*", "tenant_id:*", "body:marmalade", "kind:turn", "'", "%", "_", "$gen", "`x`", '{"a": 1}', "x' OR '1'='1")


def _valid_id(s: str) -> bool:
    return re.fullmatch(ID_PATTERN, s) is not None and not any("\ud800" <= c <= "\udfff" for c in s)


# ID_PATTERN with its length bounded (the full pattern allows 200 characters: slow to draw).
_SHORT_ID = r"[^\s\x00-\x1f\x7f](?:[^\x00-\x1f\x7f]{0,18}[^\s\x00-\x1f\x7f])?"
IDENTIFIERS = st.one_of(st.text(_ID_CHARS, min_size=1, max_size=12), st.from_regex(_SHORT_ID, fullmatch=True)).filter(_valid_id)
TEXTS = st.lists(st.one_of(st.sampled_from(_LUCENE), st.text(_ID_CHARS, max_size=6)), max_size=6).map(" ".join)
_TENANT = st.from_regex(r"[a-z0-9][a-z0-9_-]{0,12}", fullmatch=True)
_SERIAL = itertools.count()


class CrossTenant(AssertionError):
    """A read returned something of another tenant."""


def _private(kind: str, tenant: str) -> str:
    return kind + hashlib.blake2b(tenant.encode(), digest_size=5).hexdigest()


@dataclass
class Example:
    tenants: list[str]
    rows: dict[str, list[TurnRow]]
    units: dict[str, list[TraceUnit]]
    boundaries: dict[str, Boundary]  # the asking tenant's boundary
    names: list[str]  # entity names every tenant's turns mention
    mentions: list[tuple[str, ...]]  # per slot: the shared names its turn mentions
    query: str
    sessions: list[tuple[str, str]] = field(default_factory=list)  # (conversation, session)

    def word(self, tenant: str) -> str:
        """The tenant's private word: in its texts only."""
        return _private("zz", tenant)

    def private_name(self, tenant: str) -> str:
        return _private("secret ", tenant)

    def own(self, tenant: str, items) -> set:
        """`items(tenant)` (a function of a tenant) as a set."""
        return set(items(tenant))

    def foreign(self, tenant: str, items) -> set:
        """`items` of every other tenant of the example."""
        return {x for t in self.tenants if t != tenant for x in items(t)}

    def turn_ids(self, tenant: str) -> list[str]:
        return [r.turn_id for r in self.rows[tenant]]


@st.composite
def tenant_examples(draw) -> Example:
    serial = next(_SERIAL)
    base = draw(_TENANT)
    raw = [base, base + draw(st.sampled_from(("-", "_", "-b", "_b", "0", "--", "__"))), *draw(st.lists(_TENANT, max_size=2))]
    tenants = [f"{serial}-{t}" for t in dict.fromkeys(raw)]
    convs = draw(st.lists(IDENTIFIERS, min_size=1, max_size=2, unique=True))
    sessions = draw(st.lists(IDENTIFIERS, min_size=1, max_size=2, unique=True))
    agents = draw(st.lists(IDENTIFIERS, min_size=1, max_size=2, unique=True))
    names = draw(st.lists(IDENTIFIERS.filter(lambda n: not n.startswith("kw:")), min_size=1, max_size=3, unique=True))
    slots, minute = [], 0
    for conv in convs:
        sizes = [draw(st.integers(1, 3)) for _ in sessions]
        events = iter(draw(st.lists(IDENTIFIERS, min_size=sum(sizes), max_size=sum(sizes), unique=True)))  # unique per conversation
        for session, size in zip(sessions, sizes):
            for i in range(size):
                minute += draw(st.sampled_from((0, 1, 30)))
                slots.append((conv, session, i, next(events), draw(st.sampled_from(agents)), T0 + timedelta(minutes=minute), draw(TEXTS),
                              tuple(draw(st.lists(st.sampled_from(names), max_size=2, unique=True)))))
    ex = Example(tenants, {}, {}, {}, names, [s[-1] for s in slots], "", sessions=[(c, s) for c in convs for s in sessions])
    for t in tenants:
        ex.rows[t] = [
            TurnRow(turn_id=turn_unit_id(t, conv, ev), tenant_id=t, conversation_id=conv, session_id=session, event_id=ev, agent_id=agent,
                    speaker="Ann" if i % 2 == 0 else "Bob", role="user", turn_index=i, occurred_at=when,
                    text=f"{text} {COMMON} {ex.word(t)}", source_ref=None, partition=0, offset=k,
                    content_hash=content_hash(t, conv, ev, text))
            for k, (conv, session, i, ev, agent, when, text, _) in enumerate(slots)]
        ex.units[t] = [u for conv, session in ex.sessions
                       for u in units([r for r in ex.rows[t] if (r.conversation_id, r.session_id) == (conv, session)])]
    times = sorted({s[5] for s in slots})
    unknown = draw(IDENTIFIERS)

    def subset(values):  # unset, or one or two of the values (an unknown id among them)
        return draw(st.one_of(st.none(), st.lists(st.sampled_from([*values, unknown]), min_size=1, max_size=2, unique=True).map(tuple)))

    def moment():  # unset (two times in three), or one of the turns' times
        return None if draw(st.integers(0, 2)) else draw(st.sampled_from(times))

    # Who asks: one of the tenants, with a boundary of its own; the others are bait.
    for t in [draw(st.sampled_from(tenants))]:
        ex.boundaries[t] = Boundary(t, subset(convs), subset(sessions), subset(agents), moment(), moment())
    # The query: special characters, the common word, and every tenant's private word.
    ex.query = " ".join([draw(TEXTS), COMMON, *(ex.word(t) for t in tenants)])
    return ex


def inside(b: Boundary, tenant: str, conv: str, session: str, agents, t_from, t_to) -> bool:
    """The port's boundary rule (a unit is inside if it overlaps the time range and shares an agent)."""
    return (tenant == b.tenant_id and (b.conversation_ids is None or conv in b.conversation_ids)
            and (b.session_ids is None or session in b.session_ids) and (b.agent_ids is None or bool(set(agents) & set(b.agent_ids)))
            and (b.since is None or t_to >= b.since) and (b.until is None or t_from <= b.until))


def unit_inside(b: Boundary, u: TraceUnit) -> bool:
    p = u.provenance
    return inside(b, p.tenant_id, p.conversation_id, p.session_id, p.agent_ids, p.occurred_from, p.occurred_to)


def row_inside(b: Boundary, r: TurnRow) -> bool:
    return inside(b, r.tenant_id, r.conversation_id, r.session_id, (r.agent_id,), r.occurred_at, r.occurred_at)


def only_own(what: str, got, own: set, foreign: set, expected: set | None = None) -> None:
    """`got` holds nothing of `foreign` (CrossTenant otherwise), only `own` ids, and equals `expected`."""
    got = set(got)
    if got & foreign:
        raise CrossTenant(f"{what}: another tenant's {sorted(got & foreign)[:3]}")
    assert got <= own, f"{what}: unknown ids {sorted(got - own)[:3]}"
    if expected is not None:
        assert got == expected, f"{what}: missing {sorted(expected - got)[:3]}, unexpected {sorted(got - expected)[:3]}"


_OFFSETS = itertools.count(1)


def run_property(store, write, check, examples: int = EXAMPLES, phases=tuple(Phase)) -> list[Example]:
    """Write each drawn example into `store` and check every read; returns the examples tried."""
    tried: list[Example] = []

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True, phases=phases,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(ex=tenant_examples())
    def prop(ex: Example) -> None:
        write(store, ex)
        check(store, ex)
        tried.append(ex)

    prop()
    return tried


def report(request, tried: list[Example]) -> None:
    turns = sum(len(rows) for ex in tried for rows in ex.rows.values())
    tenants, asked = sum(len(ex.tenants) for ex in tried), sum(len(ex.boundaries) for ex in tried)
    print(f"\n{request.node.name}: {len(tried)} examples, {tenants} tenants, {turns} turns, {asked} tenants asking")
    assert len(tried) >= EXAMPLES


def _params(suite):
    return [pytest.param(name, marks=pytest.mark.integration) if name in suite.NEEDS_SERVER else name for name in sorted(suite.ADAPTERS)]


def _open(suite, request, tmp_path):
    store = suite.ADAPTERS[request.param](request, tmp_path)
    request.addfinalizer(store.close)
    return store


def check_ledger(store, ex: Example, tenant: str) -> None:
    """The turn ledger every view keeps: by tenant too."""
    own_turns, foreign_turns = ex.own(tenant, ex.turn_ids), ex.foreign(tenant, ex.turn_ids)
    for conv in dict.fromkeys(c for c, _ in ex.sessions):
        events = [r.event_id for r in ex.rows[tenant] if r.conversation_id == conv]
        found = store.find_turns(tenant, conv, events)
        only_own(f"find_turns({conv!r})", [r.turn_id for r in found.values()], own_turns, foreign_turns,
                 {r.turn_id for r in ex.rows[tenant] if r.conversation_id == conv})
        assert set(found) == set(events)
    conv, session = ex.sessions[-1]
    only_own(f"session_turns({conv!r}, {session!r})", [r.turn_id for r in store.session_turns(tenant, conv, session)], own_turns,
             foreign_turns, {r.turn_id for r in ex.rows[tenant] if (r.conversation_id, r.session_id) == (conv, session)})
    assert store.known_tenant(tenant) and not store.known_tenant(tenant + "-never")


# -- hierarchy ---------------------------------------------------------------------------------
@pytest.fixture(params=_params(unit_suite))
def unit_store(request, tmp_path):
    return _open(unit_suite, request, tmp_path)


def write_units(store, ex: Example) -> None:
    store.apply(UnitChangeSet(put_turns=[r for t in ex.tenants for r in ex.rows[t]], upsert_units=[u for t in ex.tenants for u in ex.units[t]]),
                {0: next(_OFFSETS)})


def check_units(store, ex: Example) -> None:
    ids = lambda t: [u.unit_id for u in ex.units[t]]
    for t, b in ex.boundaries.items():
        own, foreign = ex.own(t, ids), ex.foreign(t, ids)
        for kind in UNIT_KINDS:
            got = store.list_units(b, kind)
            assert len(got) == len({u.unit_id for u in got})
            only_own(f"list_units({b}, {kind})", [u.unit_id for u in got], own, foreign,
                     {u.unit_id for u in ex.units[t] if u.kind == kind and unit_inside(b, u)})
            assert all(u.provenance.tenant_id == t and ex.word(t) in u.text for u in got)
        only_own("get_units", store.get_units(t, [i for x in ex.tenants for i in ids(x)]), own, foreign, own)
        check_bounded_units(store, ex, t, b)
        conv, session = ex.sessions[0]
        only_own("session_unit_ids", store.session_unit_ids(t, conv, session), own, foreign,
                 {u.unit_id for u in ex.units[t] if (u.provenance.conversation_id, u.provenance.session_id) == (conv, session)})
        check_ledger(store, ex, t)


def check_bounded_units(store, ex: Example, t: str, b: Boundary) -> None:
    """The bounded query path's reads (schemas/ports/unit_store.py)."""
    keys = lambda x: [unit_key(u.unit_id) for u in ex.units[x]]  # noqa: E731
    ids = lambda x: [u.unit_id for u in ex.units[x]]  # noqa: E731
    got = store.units_by_keys(t, [k for x in ex.tenants for k in keys(x)])
    only_own("units_by_keys", got, ex.own(t, keys), ex.foreign(t, keys), ex.own(t, keys))
    assert all(unit_key(u.unit_id) == k for k, u in got.items())
    held = store.containing(t, ex.turn_ids(t))
    only_own("containing", {u for us in held.values() for u in us}, ex.own(t, ids), ex.foreign(t, ids),
             {u.unit_id for u in ex.units[t] if u.kind != "turn"})
    conversations = [r for r in ex.rows[t] if b.conversation_ids is None or r.conversation_id in b.conversation_ids]
    assert store.size(b) == len(conversations)
    assert store.speakers(b) == sorted({r.speaker for r in conversations})
    latest = [r.occurred_at for r in conversations if b.session_ids is None or r.session_id in b.session_ids]
    assert store.latest(b) == (max(latest) if latest else None)
    starts = {(c, s): min(r.occurred_at for r in ex.rows[t] if (r.conversation_id, r.session_id) == (c, s))
              for c, s in ex.sessions}
    assert store.session_starts(t, ex.sessions) == starts


def test_unit_store_returns_only_the_asking_tenants_units(unit_store, request):
    report(request, run_property(unit_store, write_units, check_units))


# -- lexical -------------------------------------------------------------------------------------
@pytest.fixture(params=_params(lexical_suite))
def lexical_index(request, tmp_path):
    return _open(lexical_suite, request, tmp_path)


def lexical_docs(ex: Example, tenant: str) -> list[LexicalDoc]:
    return [LexicalDoc(u.unit_id, u.kind, u.text, tenant, u.provenance.conversation_id, u.provenance.session_id, u.provenance.agent_ids,
                       u.provenance.occurred_from, u.provenance.occurred_to) for u in ex.units[tenant]]


def write_lexical(index, ex: Example) -> None:
    index.apply(LexicalChangeSet(put_turns=[r for t in ex.tenants for r in ex.rows[t]], upsert_docs=[d for t in ex.tenants for d in lexical_docs(ex, t)]),
                {0: next(_OFFSETS)})


def check_lexical(index, ex: Example) -> None:
    keys = lambda t: [unit_key(u.unit_id) for u in ex.units[t]]
    ids = lambda t: [u.unit_id for u in ex.units[t]]
    for t, b in ex.boundaries.items():
        inside_b = [u for u in ex.units[t] if unit_inside(b, u)]
        got, scores = index.score_units(None, ex.query, b, 10_000)
        only_own(f"score_units({b}, {ex.query!r})", got.tolist(), ex.own(t, keys), ex.foreign(t, keys), {unit_key(u.unit_id) for u in inside_b})
        assert (scores > 0).all()
        for kind in UNIT_KINDS:
            hits = index.search(kind, ex.query, b, 1_000)
            only_own(f"search({kind}, {b})", [h.unit_id for h in hits], ex.own(t, ids), ex.foreign(t, ids),
                     {u.unit_id for u in inside_b if u.kind == kind})
        # Words only the other tenants' documents hold find nothing here.
        others = " ".join(ex.word(x) for x in ex.tenants if x != t)
        assert index.score_units(None, others, Boundary(t), 10_000)[0].tolist() == []
        check_ledger(index, ex, t)


def test_lexical_index_returns_only_the_asking_tenants_units(lexical_index, request):
    report(request, run_property(lexical_index, write_lexical, check_lexical))


# -- dense ---------------------------------------------------------------------------------------
@pytest.fixture(params=_params(vector_suite))
def vector_store(request, tmp_path):
    return _open(vector_suite, request, tmp_path)


def vector_points(ex: Example, tenant: str) -> list[VectorPoint]:
    """Every unit and one sentence per turn, with the same vector at the same position in every tenant."""
    out = []
    for n, u in enumerate(ex.units[tenant]):
        p = u.provenance
        out.append(VectorPoint(u.kind, u.unit_id, unit_vector(n, DIM), tenant, p.conversation_id, p.session_id, p.agent_ids,
                               p.occurred_from, p.occurred_to, u.unit_id))
        if u.kind == "turn":
            out.append(VectorPoint("sentence", sentence_id(u.unit_id, 0), unit_vector(1000 + n, DIM), tenant, p.conversation_id, p.session_id,
                                   p.agent_ids, p.occurred_from, p.occurred_to, u.unit_id))
    return out


def write_vectors(store, ex: Example) -> None:
    store.apply(VectorChangeSet(put_turns=[r for t in ex.tenants for r in ex.rows[t]], upsert_points=[p for t in ex.tenants for p in vector_points(ex, t)]),
                {0: next(_OFFSETS)})


def check_vectors(store, ex: Example) -> None:
    points = {t: vector_points(ex, t) for t in ex.tenants}
    q = unit_vector(7, DIM)
    for t, b in ex.boundaries.items():
        for col in COLLECTIONS:
            ids = lambda x: [p.point_id for p in points[x] if p.collection == col]
            mine = [p for p in points[t] if p.collection == col]
            expected = {p.point_id for p in mine if inside(b, t, p.conversation_id, p.session_id, p.agent_ids, p.occurred_from, p.occurred_to)}
            keys = lambda x: [unit_key(i) for i in ids(x)]
            got, scores = store.score_units(col, q, b)
            only_own(f"score_units({col}, {b})", got.tolist(), ex.own(t, keys), ex.foreign(t, keys), {unit_key(i) for i in expected})
            [(got, _), (again, _)] = store.score_units_many([(col, q), (col, -q)], b)  # several reads in flight together
            for what, g in (("", got), (" second", again)):
                only_own(f"score_units_many({col}, {b}){what}", g.tolist(), ex.own(t, keys), ex.foreign(t, keys), {unit_key(i) for i in expected})
            only_own(f"search({col}, {b})", [h.unit_id for h in store.search(col, q, b, 1_000)], ex.own(t, ids), ex.foreign(t, ids), expected)
            only_own(f"vectors({col})", store.vectors(col, t, [i for x in ex.tenants for i in ids(x)]), ex.own(t, ids), ex.foreign(t, ids),
                     ex.own(t, ids))
            if col != "sentence":  # (nearest is the bounded path's read of units; sentences are scored by id)
                nearest, _ = store.nearest(col, q, b, 1_000)
                only_own(f"nearest({col}, {b})", nearest.tolist(), ex.own(t, keys), ex.foreign(t, keys),
                         {unit_key(i) for i in expected})
            only_own(f"score_points({col})", store.score_points(col, q, b, [i for x in ex.tenants for i in ids(x)]),
                     ex.own(t, ids), ex.foreign(t, ids), ex.own(t, ids))
            conv, session = ex.sessions[0]
            only_own(f"session_point_ids({col})", store.session_point_ids(col, t, conv, session), ex.own(t, ids), ex.foreign(t, ids),
                     {p.point_id for p in mine if (p.conversation_id, p.session_id) == (conv, session)})
        check_ledger(store, ex, t)


def test_vector_store_returns_only_the_asking_tenants_points(vector_store, request):
    report(request, run_property(vector_store, write_vectors, check_vectors))


# -- graph ---------------------------------------------------------------------------------------
@pytest.fixture(params=_params(graph_suite))
def graph_store(request, tmp_path):
    return _open(graph_suite, request, tmp_path)


def _names(ex: Example, tenant: str, slot: int) -> tuple[str, ...]:
    """What a turn mentions: the slot's shared names, the tenant's private name, and a keyword."""
    return (*ex.mentions[slot], ex.private_name(tenant), "kw:" + ex.names[0])


def graph_change(ex: Example) -> GraphChangeSet:
    change = GraphChangeSet(put_turns=[r for t in ex.tenants for r in ex.rows[t]])
    for t in ex.tenants:
        for name in (*ex.names, ex.private_name(t), "kw:" + ex.names[0]):
            keyword = name.startswith("kw:") and name != ex.names[0]
            vector = np.zeros(0, np.float32) if keyword else unit_vector(int.from_bytes(name.encode()[:6], "big") % 10_000, DIM)
            change.entities.append(EntityNode(entity_id(t, name), t, name, "KEYWORD" if keyword else "PERSON", vector))
        for n, r in enumerate(ex.rows[t]):
            names = _names(ex, t, n)
            change.mentions += [Mention(entity_id(t, name), r.turn_id, 1, 1 / len(names), "keyword" if name.startswith("kw:") else "ner")
                                for name in names]
            change.sentences.append(SentenceNode(sentence_id(r.turn_id, 0), r.turn_id, 0, 0, len(r.text), tuple(entity_id(t, x) for x in names)))
        for conv, session in ex.sessions:
            rows = [r for r in ex.rows[t] if (r.conversation_id, r.session_id) == (conv, session)]
            change.adjacency[(t, conv, session)] = [AdjacencyEdge(a.turn_id, b.turn_id, t, conv, session) for a, b in zip(rows, rows[1:])]
    return change


def write_graph(store, ex: Example) -> None:
    store.apply(graph_change(ex), {0: next(_OFFSETS)})


def check_graph(store, ex: Example) -> None:
    def entities(t):
        return [entity_id(t, n) for n in (*ex.names, ex.private_name(t), "kw:" + ex.names[0])]

    every_id = [i for t in ex.tenants for i in (*entities(t), *ex.turn_ids(t))]
    for t, b in ex.boundaries.items():
        contexts = {r.turn_id for r in ex.rows[t] if row_inside(b, r)}
        mentioned = {entity_id(t, name) for n, r in enumerate(ex.rows[t]) if r.turn_id in contexts for name in _names(ex, t, n)}
        own_ctx, foreign_ctx = ex.own(t, ex.turn_ids), ex.foreign(t, ex.turn_ids)
        own_ent, foreign_ent = ex.own(t, entities), ex.foreign(t, entities)
        ppr = store.personalized_pagerank(b, dict.fromkeys(every_id, 1.0), 0.6)
        only_own(f"personalized_pagerank({b})", ppr, own_ctx, foreign_ctx, contexts)
        foreign_seeds = {i: 1.0 for x in ex.tenants if x != t for i in (*entities(x), *ex.turn_ids(x))}
        only_own("personalized_pagerank seeded by other tenants only", store.personalized_pagerank(b, foreign_seeds, 0.6), own_ctx, foreign_ctx, set())
        only_own("present", store.present(b, [i for x in ex.tenants for i in entities(x)]), own_ent, foreign_ent, mentioned)
        labels = store.entity_labels(b)
        only_own("entity_labels", labels, own_ent, foreign_ent,
                 {entity_id(t, n) for n in (*ex.names, ex.private_name(t)) if entity_id(t, n) in mentioned})
        privates = {ex.private_name(x) for x in ex.tenants if x != t}
        # Asked by the ids the query side computes (the asking tenant's), and by other tenants' own ids.
        asked = [entity_id(t, n) for n in (*ex.names, *privates, ex.private_name(t))] + sorted(ex.foreign(t, entities))
        vectors = np.stack([unit_vector(int.from_bytes(e.encode()[2:8], "big") % 10_000, DIM) for e in asked])
        matches = store.align_entities(b, asked, vectors, 2)
        only_own("align_entities", [m.entity_id for ms in matches for m in ms], own_ent, foreign_ent)
        for e, ms in zip(asked, matches):
            if e in mentioned:
                assert [(m.entity_id, m.score) for m in ms] == [(e, 1.0)]
        cm = store.context_mentions(b)
        only_own("context_mentions", cm, own_ctx, foreign_ctx, contexts)
        only_own("context_mentions' entities", {e for found in cm.values() for e, _ in found}, own_ent, foreign_ent)
        inc = store.sentence_incidence(b)
        only_own("sentence_incidence contexts", inc.context_ids, own_ctx, foreign_ctx, contexts)
        only_own("sentence_incidence entities", inc.entity_ids, own_ent, foreign_ent, mentioned)
        ce = store.context_entities(t, [i for x in ex.tenants for i in ex.turn_ids(x)])
        only_own("context_entities", ce, own_ctx, foreign_ctx, own_ctx)
        only_own("context_entities' entities", {e for es in ce.values() for e in es}, own_ent, foreign_ent)
        only_own("known_entities", store.known_entities(t, [i for x in ex.tenants for i in entities(x)]), own_ent, foreign_ent, own_ent)
        check_bounded_graph(store, ex, t, b, entities, contexts, mentioned)
        check_ledger(store, ex, t)


def check_bounded_graph(store, ex: Example, t: str, b: Boundary, entities, contexts: set, mentioned: set) -> None:
    """The bounded query path's reads that take ids (schemas/ports/graph.py), asked for every
    tenant's ids (align_entities' `among` and the neighbourhood walk have tests of their own in
    tests/contracts/test_graph_contract.py)."""
    own_ctx, foreign_ctx = ex.own(t, ex.turn_ids), ex.foreign(t, ex.turn_ids)
    own_ent, foreign_ent = ex.own(t, entities), ex.foreign(t, entities)
    all_entities = [i for x in ex.tenants for i in entities(x)]
    labels = store.labels_of(b, all_entities)
    only_own("labels_of", labels, own_ent, foreign_ent, set(store.entity_labels(b)))
    in_conversations = [n for n, r in enumerate(ex.rows[t])
                        if b.conversation_ids is None or r.conversation_id in b.conversation_ids]
    degrees: dict[str, int] = {}
    for n in in_conversations:
        for e in {entity_id(t, name) for name in _names(ex, t, n)}:
            degrees[e] = degrees.get(e, 0) + 1
    got = store.entity_degrees(b, all_entities)
    only_own("entity_degrees", got, own_ent, foreign_ent, set(degrees))
    assert got == degrees
    cm = store.context_mentions(b, [i for x in ex.tenants for i in ex.turn_ids(x)])
    only_own("context_mentions(context_ids)", cm, own_ctx, foreign_ctx)
    assert contexts <= set(cm)
    only_own("context_mentions(context_ids)' entities", {e for found in cm.values() for e, _ in found}, own_ent,
             foreign_ent)
    inc = store.sentence_incidence(b, entity_ids=all_entities)
    only_own("sentence_incidence(entity_ids) contexts", inc.context_ids, own_ctx, foreign_ctx, contexts)
    only_own("sentence_incidence(entity_ids) entities", inc.entity_ids, own_ent, foreign_ent, mentioned)


def test_graph_store_returns_only_the_asking_tenants_nodes(graph_store, request):
    report(request, run_property(graph_store, write_graph, check_graph))


# -- a store that drops the tenant filter fails the same check -----------------------------------
class TenantBlind:
    """A test double: boundary reads run for every tenant written so far, answers merged (what
    a store that forgot `tenant_id = ?` in its query would return); everything else delegates."""

    def __init__(self, inner):
        self.inner, self.tenants = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def apply(self, change, positions):
        self.tenants += [t for t in dict.fromkeys(r.tenant_id for r in change.put_turns) if t not in self.tenants]
        self.inner.apply(change, positions)

    def _each(self, boundary: Boundary):
        return [replace(boundary, tenant_id=t) for t in self.tenants]

    def list_units(self, boundary, kind):
        return [u for b in self._each(boundary) for u in self.inner.list_units(b, kind)]

    def search(self, kind, query, boundary, k):
        return [h for b in self._each(boundary) for h in self.inner.search(kind, query, b, k)]

    def score_units(self, kind, query, boundary, *limit):
        parts = [self.inner.score_units(kind, query, b, *limit) for b in self._each(boundary)]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def score_units_many(self, requests, boundary):
        return [self.score_units(kind, query, boundary) for kind, query in requests]

    def personalized_pagerank(self, boundary, reset, damping, **kw):
        return {c: s for b in self._each(boundary) for c, s in self.inner.personalized_pagerank(b, reset, damping, **kw).items()}


PORTS = {  # the embedded adapter of each port, and how the property writes and checks it
    "hierarchy": (unit_suite, "sqlite", write_units, check_units),
    "lexical": (lexical_suite, "tantivy", write_lexical, check_lexical),
    "dense": (vector_suite, "sqlite", write_vectors, check_vectors),
    "graph": (graph_suite, "sqlite", write_graph, check_graph),
}


@pytest.mark.parametrize("port", sorted(PORTS))
def test_a_store_that_drops_the_tenant_filter_fails_the_property(port, request, tmp_path):
    suite, adapter, write, check = PORTS[port]
    store = suite.ADAPTERS[adapter](request, tmp_path)
    request.addfinalizer(store.close)
    with pytest.raises(CrossTenant):
        run_property(TenantBlind(store), write, check, 20, phases=(Phase.generate,))


# -- do a tenant's scores depend on other tenants' data? ----------------------------------------
def _two_tenant_example() -> Example:
    """A fixed example: tenant `a` alone first, then `b` with the same ids and words."""
    rows = {}
    for t in ("a", "b"):
        rows[t] = [TurnRow(turn_id=turn_unit_id(t, "c1", f"e{i}"), tenant_id=t, conversation_id="c1", session_id="s1", event_id=f"e{i}",
                           agent_id="x", speaker="Ann", role="user", turn_index=i, occurred_at=T0 + timedelta(minutes=i),
                           text=text, source_ref=None, partition=0, offset=i, content_hash=content_hash(t, i, text))
                   for i, text in enumerate(["project falcon launch plan", "lunch menu today", "falcon falcon everywhere, a long turn"])]
    ex = Example(["a", "b"], rows, {t: units(rows[t]) for t in rows}, {"a": Boundary("a")}, ["falcon"], [("falcon",)] * 3, "falcon",
                 sessions=[("c1", "s1")])
    return ex


def _only(ex: Example, tenant: str) -> Example:
    return Example([tenant], {tenant: ex.rows[tenant]}, {tenant: ex.units[tenant]}, ex.boundaries, ex.names, ex.mentions, ex.query, sessions=ex.sessions)


def test_dense_scores_do_not_depend_on_other_tenants(vector_store):
    ex = _two_tenant_example()
    q = unit_vector(7, DIM)
    write_vectors(vector_store, _only(ex, "a"))
    before = vector_store.score_units("turn", q, Boundary("a"))
    write_vectors(vector_store, _only(ex, "b"))  # the same points at the same ids, for another tenant
    after = vector_store.score_units("turn", q, Boundary("a"))
    assert dict(zip(*map(np.ndarray.tolist, before))) == pytest.approx(dict(zip(*map(np.ndarray.tolist, after))), abs=1e-6)


def test_graph_scores_do_not_depend_on_other_tenants(graph_store):
    ex = _two_tenant_example()
    write_graph(graph_store, _only(ex, "a"))
    reset = {entity_id("a", "falcon"): 1.0}
    before = graph_store.personalized_pagerank(Boundary("a"), reset, 0.6, max_iterations=200, tolerance=1e-10)
    write_graph(graph_store, _only(ex, "b"))  # the same graph under the same names, for another tenant
    after = graph_store.personalized_pagerank(Boundary("a"), {**reset, entity_id("b", "falcon"): 1.0}, 0.6, max_iterations=200, tolerance=1e-10)
    assert before and after == pytest.approx(before, abs=1e-6)


def test_bm25_scores_do_not_depend_on_other_tenants(lexical_index):
    """BM25's statistics (document count, each term's document frequency, average length) are
    the tenant's own: another tenant writing the same words, ids and more of them moves none of
    a tenant's scores (else a planted word's score gauges how many documents of all tenants hold
    it, and a tenant's ranking drifts with the fleet around it)."""
    ex = _two_tenant_example()
    write_lexical(lexical_index, _only(ex, "a"))
    before = dict(zip(*map(np.ndarray.tolist, lexical_index.score_units("turn", "falcon", Boundary("a"), 100))))
    write_lexical(lexical_index, _only(ex, "b"))
    after = dict(zip(*map(np.ndarray.tolist, lexical_index.score_units("turn", "falcon", Boundary("a"), 100))))
    assert len(before) == 2 and after == pytest.approx(before, rel=1e-6)
    hits = lexical_index.search("turn", "falcon", Boundary("a"), 10)
    assert [h.score for h in hits] == pytest.approx(sorted(before.values(), reverse=True), rel=1e-6)
