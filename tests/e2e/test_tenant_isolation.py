"""Tenant isolation, proven by property, through the query service.

Seven tenants share everything a producer chooses: conversation ids, session ids, agent ids,
speaker names, event ids, timestamps, the chit-chat around the facts and its entity names —
so every engine has cross-tenant bait (BM25 and dense candidates with the same words, graph
entities of the same name for alignment, propagation, PageRank and closure, neighbouring turns
at the same positions). What differs is secret: each tenant's planted facts carry a canary
(`canary-<tenant>-<random>`) and every turn of a tenant carries the tenant's marker in its
`source_ref` (returned with every evidence turn). Hypothesis then draws questions and filters
and runs every strategy:

(a) a question that asks for one of the tenant's planted facts, with filters that admit the
    fact, must find that fact (its canary is in the evidence); a boundary that admits any turn
    never answers with empty evidence;
(b) nothing in the response (evidence texts, turns, profile, notes — the whole JSON) carries
    another tenant's canary or marker, and every evidence turn is one of the asking tenant's
    turns inside the boundary.

A leaky test double (a hierarchy store that drops the tenant filter, a lexical index that
searches another tenant's boundary) plugged into the service's views makes the same check fail.
The caches (corpora, dense matrices, graph snapshots, answer-type flags, the strategies' own
indexes) are checked with two tenants at equal conversation ids and versions. `pytest -s`
prints the examples tried per strategy.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings, strategies as st

from schemas.events import TurnRecorded
from schemas.ports.views import Boundary
from schemas.query import STRATEGIES, SearchRequest, SearchResponse
from schemas.units import turn_unit_id
from services.query.config import DEFAULT_BOUNDS
from tests.e2e.helpers import make_pipeline, registry_with

pytestmark = pytest.mark.e2e

EXAMPLES = 500  # per strategy: at least 500 in embedded mode

# Prefixes of each other, and the characters Lucene (-) and SQL LIKE (_) treat specially.
TENANTS = ("acme", "acme-b", "acme_b", "0", "zeta", "z-9", "globex")
CONVERSATIONS = ("c1", 'trip "β" {2025}: q&a')
SESSIONS = ("s1", "s2")
AGENTS = ("agent-a", "agent-b")
SPEAKERS = ("Alice", "Bob")
TURNS_PER_SESSION = 8
T0 = datetime(2025, 5, 5, 9, 0, tzinfo=timezone.utc)

# Said in every tenant, at the same positions: shared names and words for every engine to
# confuse (Captain Nemo, the Zanzibar Observatory, Lisbon, telescopes, umbrellas, code words).
CHATTER = (
    "I met Captain Nemo near the Zanzibar Observatory and we talked about old telescopes.",
    "Lisbon was sunny, we took the tram with Marguerite and ate custard tarts.",
    "Did you hear that Captain Nemo lost his umbrella on the Lisbon tram?",
    "The Zanzibar Observatory opens at nine; Marguerite wants to see the stars.",
    "My code word for the gym locker is something silly, I always forget it.",
    "We should plan a trip to Paris with Marguerite next spring.",
    "Captain Nemo collects brass instruments and antique maps.",
    "I bought a new notebook for the astronomy class at the observatory.",
    "The weather in Lisbon changed quickly, everybody opened an umbrella.",
    "Marguerite said the telescope shop in Paris closes early on Sundays.",
    "Let's meet Captain Nemo at the harbour after lunch.",
    "I keep losing labels and tags for my luggage.",
)


@dataclass(frozen=True)
class Fact:
    tenant: str
    name: str
    text: str
    canary: str
    questions: tuple[str, ...]
    turn_id: str


@dataclass(frozen=True)
class Slot:
    """Where a turn sits: the same for every tenant."""

    conversation: str
    session: str
    index: int
    agent: str
    speaker: str
    occurred_at: datetime
    event_id: str


@dataclass
class World:
    events: list[TurnRecorded] = field(default_factory=list)
    facts: dict[str, list[Fact]] = field(default_factory=dict)  # tenant -> its planted facts
    secrets: dict[str, tuple[str, ...]] = field(default_factory=dict)  # tenant -> canaries + marker
    turns: dict[str, tuple[str, Slot, str]] = field(default_factory=dict)  # turn id -> (tenant, slot, text)

    def admitted(self, tenant: str, boundary: Boundary) -> set[str]:
        """The turn ids a boundary admits, from the test's own record of what it published."""
        out = set()
        for tid, (owner, s, _) in self.turns.items():
            if owner != tenant:
                continue
            if boundary.conversation_ids is not None and s.conversation not in boundary.conversation_ids:
                continue
            if boundary.session_ids is not None and s.session not in boundary.session_ids:
                continue
            if boundary.agent_ids is not None and s.agent not in boundary.agent_ids:
                continue
            if boundary.since is not None and s.occurred_at < boundary.since:
                continue
            if boundary.until is not None and s.occurred_at > boundary.until:
                continue
            out.add(tid)
        return out


def _code(*parts: str) -> str:
    return hashlib.blake2b("/".join(parts).encode(), digest_size=5).hexdigest()


def slots() -> list[Slot]:
    out = []
    for c, conv in enumerate(CONVERSATIONS):
        for s, session in enumerate(SESSIONS):
            start = T0 + timedelta(days=2 * c + s)
            for i in range(TURNS_PER_SESSION):
                out.append(Slot(conv, session, i, AGENTS[(i // 2) % 2], SPEAKERS[i % 2], start + timedelta(minutes=5 * i),
                                f"ev'{session}:{i}"))  # event ids repeat across conversations and tenants
    return out


# Every tenant plants the two shared facts (same words, its own canary) and one of its own.
SHARED_FACTS = {
    "telescope": ("Alice hid the brass telescope behind the Zanzibar Observatory, secret code {canary}.",
                  ("Where did Alice hide the brass telescope?", "What is the secret code of the brass telescope behind the observatory?",
                   "brass telescope hidden behind the Zanzibar Observatory")),
    "umbrella": ("Bob stores the velvet umbrella at the Lisbon tram depot under label {canary}.",
                 ("Where does Bob store the velvet umbrella?", "Which label is on the velvet umbrella at the tram depot?",
                  "velvet umbrella Lisbon tram depot label")),
}
OWN_OBJECTS = {  # per tenant: words no other tenant uses
    "acme": ("porcelain harmonica", "Kilimanjaro"), "acme-b": ("walnut abacus", "Reykjavik"),
    "acme_b": ("copper kettle drum", "Valparaiso"), "0": ("jade chess clock", "Timbuktu"),
    "zeta": ("silver sextant", "Ushuaia"), "z-9": ("felt accordion", "Samarkand"), "globex": ("glass metronome", "Tromso"),
}


def own_fact(tenant: str) -> tuple[str, tuple[str, ...]]:
    thing, place = OWN_OBJECTS[tenant]
    return (f"Marguerite buried the {thing} near {place}, tagged {{canary}}.",
            (f"Where did Marguerite bury the {thing}?", f"What tag is on the {thing} buried near {place}?", f"{thing} {place}"))


def build_world() -> World:
    world = World()
    layout = slots()
    for tenant in TENANTS:
        rng = random.Random(f"layout/{tenant}")
        marker = f"mark-{tenant}-{_code('mark', tenant)}"
        plants = {**{name: SHARED_FACTS[name] for name in SHARED_FACTS}, "own": own_fact(tenant)}
        fact_slots = dict(zip(plants, rng.sample(range(len(layout)), len(plants))))
        canaries, facts = [], []
        for n, slot in enumerate(layout):
            fact = next((name for name, at in fact_slots.items() if at == n), None)
            if fact is None:
                text = CHATTER[n % len(CHATTER)]
            else:
                canary = f"canary-{tenant}-{_code('canary', tenant, fact)}"
                template, questions = plants[fact]
                text = template.format(canary=canary)
                canaries.append(canary)
                facts.append(Fact(tenant, fact, text, canary, questions, turn_unit_id(tenant, slot.conversation, slot.event_id)))
            event = TurnRecorded(
                event_id=slot.event_id, tenant_id=tenant, agent_id=slot.agent, conversation_id=slot.conversation,
                session_id=slot.session, turn_index=slot.index, speaker=slot.speaker, text=text, occurred_at=slot.occurred_at,
                source_ref=f"{marker}:{n}")
            world.events.append(event)
            world.turns[turn_unit_id(tenant, slot.conversation, slot.event_id)] = (tenant, slot, event.full_text)
        world.facts[tenant] = facts
        world.secrets[tenant] = (*canaries, marker)
    return world


# -- the property's checks ---------------------------------------------------------------------
class LeakFound(AssertionError):
    """A response carried another tenant's data, or a turn outside the boundary."""


class RecallLost(AssertionError):
    """A question for the tenant's own planted fact, inside the boundary, did not find it."""


def check_isolation(world: World, request: SearchRequest, response: SearchResponse) -> None:
    """(b): no other tenant's secret anywhere in the response, every evidence turn the asking
    tenant's own, inside the boundary, with its own text."""
    blob = response.model_dump_json()
    for other, secrets in world.secrets.items():
        if other != request.tenant_id:
            for secret in secrets:
                if secret in blob:
                    raise LeakFound(f"{request.strategy}: tenant {request.tenant_id!r} got {other!r}'s {secret!r}: {request!r}")
    admitted = world.admitted(request.tenant_id, boundary_of(request))
    for e in response.evidence:
        for t in e.turns:
            if t.turn_id not in admitted:
                owner = world.turns.get(t.turn_id, ("an unknown tenant",))[0]
                raise LeakFound(f"{request.strategy}: tenant {request.tenant_id!r} got turn {t.turn_id} of {owner!r} "
                                f"({t.text!r}), outside its boundary: {request!r}")
            if t.text != world.turns[t.turn_id][2]:
                raise LeakFound(f"{request.strategy}: turn {t.turn_id} came back with another text: {t.text!r}")


def check_recall(world: World, request: SearchRequest, response: SearchResponse, fact: Fact | None) -> None:
    """(a): no empty evidence for a boundary that admits turns; the asked-for fact found."""
    admitted = world.admitted(request.tenant_id, boundary_of(request))
    if admitted and not response.evidence:
        raise RecallLost(f"{request.strategy}: empty evidence although the boundary admits {len(admitted)} turns: {request!r}")
    if fact is not None and fact.turn_id in admitted:
        found = [t for e in response.evidence for t in e.turns if fact.canary in t.text]
        if not found:
            raise RecallLost(f"{request.strategy}: {fact.canary} (fact {fact.name!r}) not in the evidence "
                             f"({[t.text[:40] for e in response.evidence for t in e.turns]}): {request!r}")


def boundary_of(r: SearchRequest) -> Boundary:
    return Boundary(r.tenant_id, (r.conversation_id,) if r.conversation_id else None, (r.session_id,) if r.session_id else None,
                    (r.agent_id,) if r.agent_id else None, r.since, r.until)


WORLD = build_world()  # deterministic, ~1 ms: shared by the hypothesis strategies and the fixtures

# The smallest evidence budget (turns) at which a strategy is expected to return the asked-for
# fact on this data. Ranking strategies put it within their top 5 (measured: zero-mem <= 2,
# hierarchy-only <= 4, the others 0-1 on the whole tenant); raw-rag returns its best 256-token
# window as one span whose turns come in conversation order, and a window here holds up to ~16 turns.
RECALL_BUDGET = {strategy: 6 for strategy in STRATEGIES} | {"raw-rag": 20}
MAX_BUDGET = 40

# Around a question for a fact: nothing that asks about something else (a second topic — "Captain
# Nemo wants to know", "code word, label, tag?" — legitimately outranks the fact at small budgets;
# that is retrieval quality, not isolation). Around the other questions: more shared names.
POLITE = ("", " please", " — do you remember?", " (just checking)", "?!")
NOISE = ("", " Captain Nemo wants to know.", " (Marguerite asked me in Lisbon)", " tell me about the Zanzibar Observatory too",
         " and the umbrella?", " code word, label, tag?")
VOCABULARY = sorted({w.strip(".,;?!").lower() for text in (*CHATTER, *(t for t, _ in SHARED_FACTS.values())) for w in text.split()}
                    | {w for thing, place in OWN_OBJECTS.values() for w in (*thing.split(), place)} | {"canary", "mark", "secret"})


@dataclass(frozen=True)
class Query:
    request: SearchRequest
    fact: Fact | None  # the asking tenant's fact the question asks for, if it does


def _slot_of(turn_id: str) -> Slot:
    return WORLD.turns[turn_id][1]


@st.composite
def queries(draw, strategy: str) -> Query:
    """A tenant, a question (its own planted fact, another tenant's fact, shared vocabulary, or
    another tenant's secret spelled out) and filters drawn around the fact or a random turn."""
    tenant = draw(st.sampled_from(TENANTS))
    mode = draw(st.sampled_from(("fact",) * 5 + ("other", "bait", "probe")))
    fact = None
    if mode == "fact":
        fact = draw(st.sampled_from(WORLD.facts[tenant]))
        question = draw(st.sampled_from(fact.questions)) + draw(st.sampled_from(POLITE))
        anchor = _slot_of(fact.turn_id)
    else:
        other = draw(st.sampled_from([t for t in TENANTS if t != tenant]))
        if mode == "other":
            question = draw(st.sampled_from(draw(st.sampled_from(WORLD.facts[other])).questions))
        elif mode == "bait":
            question = " ".join(draw(st.lists(st.sampled_from(VOCABULARY), min_size=1, max_size=8))).capitalize() + "?"
        else:  # the other tenant's canary or marker as words: BM25 terms only that tenant's documents hold
            question = f"What is {draw(st.sampled_from(WORLD.secrets[other])).replace('-', ' ')}?"
        question += draw(st.sampled_from(NOISE))
        anchor = draw(st.sampled_from(slots()))

    def around(value, choices):  # unset, the anchor's own value, or any value (some of them unknown)
        pick = draw(st.sampled_from(("unset", "anchor", "anchor", "any")))
        return None if pick == "unset" else value if pick == "anchor" else draw(st.sampled_from(choices))

    conversation = around(anchor.conversation, (*CONVERSATIONS, "c-unknown"))
    session = around(anchor.session, (*SESSIONS, "s-unknown"))
    agent = around(anchor.agent, AGENTS)
    offsets = (None, None, timedelta(days=-3), timedelta(days=-1), timedelta(minutes=-10), timedelta(0), timedelta(minutes=5),
               timedelta(days=1))
    since, until = (None if d is None else anchor.occurred_at + d for d in (draw(st.sampled_from(offsets)), draw(st.sampled_from(offsets))))
    if since is not None and until is not None and since > until:
        since, until = until, since
    as_of = draw(st.one_of(st.none(), st.just(anchor.occurred_at + timedelta(days=1))))
    low = RECALL_BUDGET[strategy] if fact is not None else 1
    request = SearchRequest(
        question=question, tenant_id=tenant, conversation_id=conversation, session_id=session, agent_id=agent, since=since,
        until=until, as_of=as_of, strategy=strategy, k=draw(st.integers(1, 20)), max_turns=draw(st.integers(low, MAX_BUDGET)))
    return Query(request, fact)


def run_property(service, strategy: str, examples: int, phases=tuple(Phase)) -> dict:
    """The property, for one strategy: draws `examples` queries, checks (a) and (b) on each.
    Returns what was tried (examples, fact questions whose fact the boundary admitted)."""
    tried = {"examples": 0, "fact_checks": 0}

    @seed(zlib.crc32(strategy.encode()))  # reproducible, and each strategy sees other draws
    @settings(max_examples=examples, deadline=None, database=None, phases=phases,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(queries(strategy))
    def prop(q: Query) -> None:
        response = service.search(q.request)
        check_isolation(WORLD, q.request, response)
        check_recall(WORLD, q.request, response, q.fact)
        tried["examples"] += 1
        tried["fact_checks"] += q.fact is not None and q.fact.turn_id in WORLD.admitted(q.request.tenant_id, boundary_of(q.request))

    prop()
    return tried


# -- fixtures ----------------------------------------------------------------------------------
async def _ingest(pipeline, events) -> None:

    await pipeline.start()
    try:
        await pipeline.publisher().publish(events)
        await pipeline.process_until_caught_up()
    finally:
        await pipeline.close()


def _query_service(settings, models):
    """The query service as `memstream serve` builds it, over the live views of `settings`."""
    from services.api import build_query_service
    from services.views import LiveViews

    registry = registry_with(settings, models)
    views = LiveViews(registry)
    return build_query_service(settings, registry, views), views


@pytest.fixture(scope="module")
def world(tmp_path_factory, models):
    """Every tenant's events through the embedded log and the four projections, once per module."""
    pipeline, settings = make_pipeline(tmp_path_factory.mktemp("tenants"), models)
    asyncio.run(_ingest(pipeline, WORLD.events))
    return settings


@pytest.fixture(scope="module")
def service(world, models):
    svc, views = _query_service(world, models)
    yield svc
    views.close()


# -- (a) and (b), every strategy ---------------------------------------------------------------
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_keeps_tenants_apart_and_finds_their_own_facts(service, strategy):
    t0 = time.perf_counter()
    tried = run_property(service, strategy, EXAMPLES)
    print(f"\ntenant isolation {strategy}: {tried['examples']} examples, {tried['fact_checks']} asked for an admitted "
          f"fact of their own, {time.perf_counter() - t0:.1f} s")
    assert tried["examples"] >= EXAMPLES
    assert tried["fact_checks"] >= EXAMPLES // 10  # the recall half was exercised (~100 of 500 here), not vacuous


def test_the_whole_boundary_path_a_deployment_may_choose_keeps_the_property(world, models):
    """MEMSTREAM_QUERY_PATH=whole ranks every turn of the boundary instead of its candidates."""
    from infra.settings import QuerySettings

    svc, views = _query_service(world.model_copy(update={"query": QuerySettings(path="whole")}), models)
    try:
        assert svc.bounds is None
        tried = run_property(svc, "zero-mem", EXAMPLES // 5)
        assert tried["fact_checks"] >= EXAMPLES // 50
    finally:
        views.close()


# -- a leaky adapter makes the same check fail ------------------------------------------------
class _Delegate:
    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)


class TenantBlindUnits(_Delegate):
    """A hierarchy store that drops the tenant filter: the boundary's conversations, sessions,
    agents and times of every tenant, on the whole-boundary listing and on the bounded path's
    reads by key and id alike."""

    def list_units(self, boundary, kind):
        return [u for t in TENANTS for u in self.inner.list_units(Boundary(t, *_filters(boundary)), kind)]

    def units_by_keys(self, tenant_id, keys):
        return {k: u for t in TENANTS for k, u in self.inner.units_by_keys(t, keys).items()}

    def get_units(self, tenant_id, unit_ids):
        return {i: u for t in TENANTS for i, u in self.inner.get_units(t, unit_ids).items()}

    def containing(self, tenant_id, turn_ids):
        out: dict[str, list[str]] = {}
        for t in TENANTS:
            for turn, units in self.inner.containing(t, turn_ids).items():
                out.setdefault(turn, []).extend(units)
        return out


class WrongTenantLexical(_Delegate):
    """A lexical index that searches the boundary of another tenant (a filter built from the
    wrong id): its units are not in the asking tenant's corpus, so no text of theirs can come
    back, but the asking tenant's ranking loses its BM25 evidence."""

    def score_units(self, kind, query, boundary, limit):
        return self.inner.score_units(kind, query, _other_tenant(boundary), limit)

    def score_ids(self, kind, query, boundary, unit_ids):
        return self.inner.score_ids(kind, query, _other_tenant(boundary), unit_ids)


def _other_tenant(b: Boundary) -> Boundary:
    return Boundary(TENANTS[(TENANTS.index(b.tenant_id) + 1) % len(TENANTS)], *_filters(b))


def _filters(b: Boundary) -> tuple:
    return (b.conversation_ids, b.session_ids, b.agent_ids, b.since, b.until)


def _every_tenant(read, boundary, limit):
    """(keys, scores) of `read` over the boundary in every tenant, best `limit` first."""
    parts = [read(Boundary(t, *_filters(boundary))) for t in TENANTS]
    keys = np.concatenate([k for k, _ in parts]).astype(np.int64)
    scores = np.concatenate([v for _, v in parts]).astype(float)
    top = np.argsort(-scores, kind="stable")[:limit]
    return keys[top], scores[top]


class TenantBlindLexical(_Delegate):
    """A lexical index that drops the tenant filter: BM25 hits of every tenant."""

    def score_units(self, kind, query, boundary, limit):
        return _every_tenant(lambda b: self.inner.score_units(kind, query, b, limit), boundary, limit)


class TenantBlindDense(_Delegate):
    """A dense index that drops the tenant filter: nearest points of every tenant."""

    def nearest(self, collection, vector, boundary, limit):
        return _every_tenant(lambda b: self.inner.nearest(collection, vector, b, limit), boundary, limit)


class DoubledViews:
    """The service's live views with some views' stores wrapped in test doubles (one wrapper per
    store, so caches keyed on a store see one object)."""

    def __init__(self, views, doubles: dict):
        self.views, self.doubles = views, doubles
        self._wrapped: dict[int, object] = {}

    def store(self, view):
        store = self.views.store(view)
        if view not in self.doubles:
            return store
        if id(store) not in self._wrapped:
            self._wrapped[id(store)] = self.doubles[view](store)
        return self._wrapped[id(store)]


WHOLE = None  # the whole-boundary path (QueryService bounds=None)


def _with_double(service, view: str | None = None, double=None, *, bounds=DEFAULT_BOUNDS, **doubles):
    from services.query.service import QueryService

    if view is not None:
        doubles[view] = double
    return QueryService(DoubledViews(service.views, doubles), service.encoder, service.extractor, bounds=bounds)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_store_that_drops_the_tenant_filter_fails_the_property(service, strategy):
    leaky = _with_double(service, "hierarchy", TenantBlindUnits, bounds=WHOLE)
    with pytest.raises(LeakFound):
        run_property(leaky, strategy, 50, phases=(Phase.generate,))


@pytest.mark.parametrize("strategy", ["zero-mem", "bm25", "dense"])
def test_the_bounded_path_leaks_only_when_both_the_index_and_the_hierarchy_drop_the_tenant(service, strategy):
    """On the bounded path candidates come from the indexes and their units from the hierarchy
    by key and id, each read filtered on the tenant: one store dropping its filter leaks nothing,
    an index and the hierarchy both dropping it fail the property."""
    run_property(_with_double(service, "hierarchy", TenantBlindUnits), strategy, 30)
    run_property(_with_double(service, lexical=TenantBlindLexical, dense=TenantBlindDense), strategy, 30)
    leaky = _with_double(service, hierarchy=TenantBlindUnits, lexical=TenantBlindLexical, dense=TenantBlindDense)
    with pytest.raises(LeakFound):
        run_property(leaky, strategy, 50, phases=(Phase.generate,))


def test_a_lexical_index_searching_another_tenant_fails_the_property(service):
    leaky = _with_double(service, "lexical", WrongTenantLexical)
    with pytest.raises(RecallLost):
        run_property(leaky, "bm25", 50, phases=(Phase.generate,))
    run_property(_with_double(service, "lexical", _Delegate), "bm25", 50)  # the double's plumbing alone changes nothing


# -- caches keyed by tenant, and by the corpus they were built for -------------------------------
def _evidence(response: SearchResponse) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(e.unit_id, e.text, tuple(t.turn_id for t in e.turns)) for e in response.evidence]


def test_strategy_caches_belong_to_their_corpus_even_after_it_is_evicted(service):
    """Raw-RAG's window index and the pyramid's stem bags are built per corpus. When the corpus
    cache evicts a corpus, CPython hands its memory to the next objects, so a later corpus —
    another tenant's or a newer version's — can have the same id(); an index kept by id would
    be served to it (its windows index turns of another corpus: wrong evidence or IndexError)."""
    from services.query.corpus import CorpusCache
    from services.query.service import QueryService

    requests = [SearchRequest(question=q, tenant_id=t, conversation_id=c, session_id=s, strategy=strategy, max_turns=MAX_BUDGET)
                for t in TENANTS[:3] for c in (None, *CONVERSATIONS) for s in (None, SESSIONS[0]) for strategy in ("raw-rag", "pyramid")
                for q in ("Where did Alice hide the brass telescope?",)]
    reference = QueryService(service.views, service.encoder, service.extractor)  # < 64 boundaries: nothing is evicted
    expected = {r: _evidence(reference.search(r)) for r in requests}
    churn = QueryService(service.views, service.encoder, service.extractor)
    churn.corpora = CorpusCache(size=1)  # every other boundary evicts the previous corpus
    rng = random.Random(13)
    for _ in range(4):
        for r in rng.sample(requests, len(requests)):
            assert _evidence(churn.search(r)) == expected[r], r


CACHE_TENANTS = TENANTS[:2]  # "acme" and "acme-b": same conversation, session, agent and event ids


@pytest.fixture(scope="module")
def two_tenants(tmp_path_factory, models):
    """Two tenants written one after the other, each in one projection step, so that every view
    holds the same conversation ids at the same versions for both."""
    pipeline, settings = make_pipeline(tmp_path_factory.mktemp("two-tenants"), models)

    async def ingest():

        await pipeline.start()
        try:
            for tenant in CACHE_TENANTS:
                await pipeline.publisher().publish([e for e in WORLD.events if e.tenant_id == tenant])
                await pipeline.process_until_caught_up()
        finally:
            await pipeline.close()

    asyncio.run(ingest())
    return settings


def _cache_requests(tenant: str) -> list[SearchRequest]:
    fact = WORLD.facts[tenant][0]
    return [SearchRequest(question=q, tenant_id=tenant, conversation_id=c, session_id=s, strategy=strategy, max_turns=12)
            for strategy in STRATEGIES for c, s in ((None, None), (CONVERSATIONS[0], None), (CONVERSATIONS[1], SESSIONS[1]))
            for q in (fact.questions[0], "What did Captain Nemo say about the Zanzibar Observatory?")]


def check_caches_are_per_tenant(settings, models, corpus_cache=None) -> int:
    """Warm every query-side and store-side cache with one tenant, then ask the same questions
    of the other (same conversation ids, same versions) and back: every answer equals the one a
    cold service gives, and carries nothing of the other tenant. Returns the requests compared."""
    a, b = CACHE_TENANTS
    cold = {}
    for tenant in CACHE_TENANTS:  # one cold service per tenant: nothing cached from the other
        svc, views = _query_service(settings, models)
        cold.update({r: _evidence(svc.search(r)) for r in _cache_requests(tenant)})
        views.close()
    warm, views = _query_service(settings, models)
    if corpus_cache is not None:
        warm.corpora = corpus_cache
    try:
        units = views.store("hierarchy")
        for view in ("hierarchy", "lexical", "dense", "graph"):  # the premise: equal ids, equal versions
            store = views.store(view)
            for conv in (None, *CONVERSATIONS):
                assert store.conversation_version(a, conv) == store.conversation_version(b, conv) > 0, (view, conv)
        assert units.generation == views.store("hierarchy").generation
        compared = 0
        for tenant in (a, b, a, b):
            for r in _cache_requests(tenant):
                response = warm.search(r)
                check_isolation(WORLD, r, response)
                assert _evidence(response) == cold[r], f"a warm cache answered {r!r} differently from a cold one"
                compared += 1
        return compared
    finally:
        views.close()


def test_query_caches_never_serve_one_tenant_what_was_built_for_another(two_tenants, models):
    assert check_caches_are_per_tenant(two_tenants, models) == 4 * len(_cache_requests(CACHE_TENANTS[0]))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the other tenant's corpus has no vectors here: empty means
def test_a_corpus_cache_keyed_without_the_tenant_fails_the_cache_check(two_tenants, models):
    from services.query.corpus import CorpusCache, build_corpus

    class TenantBlindCorpora(CorpusCache):  # keyed on the conversations and versions only
        blind: dict = {}

        def get(self, units_store, boundary):
            convs = boundary.conversation_ids or (None,)
            key = (boundary.conversation_ids, boundary.session_ids,
                   *(units_store.conversation_version(boundary.tenant_id, c) for c in convs))
            if key not in self.blind:
                self.blind[key] = build_corpus(units_store, boundary)
            return self.blind[key]

    with pytest.raises(LeakFound):
        check_caches_are_per_tenant(two_tenants, models, TenantBlindCorpora())
