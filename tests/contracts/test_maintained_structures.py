"""What the embedded views maintain for the bounded query path stays equal, in content, to a fresh
build of it, whatever sequence of changes reached them: random sequences of appends, late turns,
corrections, forgets (turn, session, agent) and replays, driven through the real pipeline on the
declared fast model path (the models are not the point here).

After each sequence:
- the hierarchy view's trigger-kept tables (unit keys, unit members, speakers) equal what its units
  and turns say; the graph view's (entity degrees, sentences per entity) what its mentions and
  sentences say;
- the dense view's in-memory scopes, kept since the first search and updated point by point, hold
  exactly the points (ids and vectors) a store opened afresh on the same file loads; the graph
  view's (every context's node mentions, adjacency rows and the entities' degrees) what loading
  them again from the tables gives;
- the hierarchy view's in-memory reads (units by id and key, the windows and episodes holding a
  turn, sessions' first times), kept since the first search, what a store opened afresh reads;
- a search through the long-lived query service (warm caches and scopes) returns the evidence a
  query service opened afresh on the same data returns.
The server adapters' own maintained fields are held by the port contract suites."""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
from collections import Counter
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from infra.models.fast import HashingEncoder, LexiconExtractor
from infra.registry import Registry
from infra.settings import Settings
from schemas.query import SearchRequest
from schemas.units import unit_key
from services.query.service import QueryService
from services.runtime import build_pipeline
from services.views import LiveViews

pytestmark = pytest.mark.contract

T0 = datetime(2026, 3, 1, 9, tzinfo=timezone.utc)
WORDS = ["ferry", "Lisbon", "hike", "concert", "Maya", "pottery", "Kyoto", "market", "rain", "guitar", "Ada", "Bo"]
QUESTIONS = ["Where did Ada go hiking?", "What did Bo say about the concert?", "When was the pottery class in Kyoto?"]


def _turn(rng: random.Random, n: int, conv: str, session: str, index: int, minutes: float, **extra) -> dict:
    who = rng.choice(["Ada", "Bo"])
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) + "."
    return {"type": "TurnRecorded", "event_id": f"e{n}", "tenant_id": "t1", "conversation_id": conv, "session_id": session,
            "agent_id": f"agent-{who.lower()}", "turn_index": index, "speaker": who, "text": text,
            "occurred_at": (T0 + timedelta(minutes=minutes)).isoformat(), **extra}


def _forget(n: int, scope: dict) -> dict:
    return {"type": "ForgetRequested", "event_id": f"f{n}", "tenant_id": "t1", "scope": scope,
            "requested_at": (T0 + timedelta(days=30)).isoformat()}


OPS = st.lists(st.sampled_from(["append", "append", "append", "session", "late", "correct", "forget-turn", "forget-session",
                                "forget-agent", "replay"]), min_size=6, max_size=14)


class World:
    """A data directory, a pipeline on the fast models and a long-lived query service over it."""

    def __init__(self, root):
        self.settings = Settings.load(data_dir=root, encoder={"model": "hashing"}, ner={"model": "lexicon"})
        self.registry = Registry(self.settings).use_models(HashingEncoder(64), LexiconExtractor())
        self.pipeline = build_pipeline(self.settings, registry=self.registry)
        self.views = LiveViews(self.registry)
        self.service = QueryService(self.views, self.registry.encoder(), self.registry.extractor())
        self.n, self.minutes, self.turns = 0, 0.0, []  # turns: (event id, conversation, session, agent)

    async def publish(self, items: list[dict]) -> None:
        await self.pipeline.publisher().publish_items(items)
        await self.pipeline.process_until_caught_up()

    def search(self, service: QueryService) -> list[list[str]]:
        scopes = [{"conversation_id": c} for c in ("c1", "c2", None)] + [{"conversation_id": "c1", "agent_id": "agent-ada"},
                                                                          {"agent_id": "agent-bo", "since": T0 + timedelta(minutes=30)}]
        return [[e.unit_id for e in service.search(SearchRequest(question=q, tenant_id="t1", max_turns=10, **scope)).evidence]
                for q in QUESTIONS for scope in scopes]


async def _run(world: World, ops: list[str], rng: random.Random) -> None:
    await world.pipeline.start()
    sessions = {"c1": ["s0"], "c2": ["s0"]}
    for op in ops:
        world.n += 1
        world.minutes += rng.uniform(1, 30)
        conv = rng.choice(["c1", "c2"])
        if op in ("append", "session"):
            if op == "session":
                sessions[conv].append(f"s{len(sessions[conv])}")
            session = sessions[conv][-1]
            items = [_turn(rng, world.n * 10 + k, conv, session, k, world.minutes + k) for k in range(rng.randint(1, 4))]
            await world.publish(items)
            world.turns += [(i["event_id"], conv, session, i["agent_id"]) for i in items]
        elif op == "late" and world.turns:
            _, c, session, _ = rng.choice(world.turns)
            item = _turn(rng, world.n * 10, c, session, 0, world.minutes - rng.uniform(60, 600))  # before the session's turns
            await world.publish([item])
            world.turns.append((item["event_id"], c, session, item["agent_id"]))
        elif op == "correct" and world.turns:
            event, c, session, _ = rng.choice(world.turns)
            item = _turn(rng, world.n * 10, c, session, 99, world.minutes, supersedes=event)
            await world.publish([item])
            world.turns.append((item["event_id"], c, session, item["agent_id"]))
        elif op == "forget-turn" and world.turns:
            event, c, _, _ = world.turns.pop(rng.randrange(len(world.turns)))
            await world.publish([_forget(world.n, {"level": "turn", "conversation_id": c, "event_id": event})])
        elif op == "forget-session" and world.turns:
            _, c, session, _ = rng.choice(world.turns)
            await world.publish([_forget(world.n, {"level": "session", "conversation_id": c, "session_id": session})])
            world.turns = [t for t in world.turns if (t[1], t[2]) != (c, session)]
        elif op == "forget-agent" and world.turns:
            agent = rng.choice(world.turns)[3]
            await world.publish([_forget(world.n, {"level": "agent", "agent_id": agent})])
            world.turns = [t for t in world.turns if t[3] != agent]
        elif op == "replay":
            for view in ("hierarchy", "dense", "graph", "lexical"):
                await world.pipeline.replay(view)
        world.search(world.service)  # the scopes and caches are made, and maintained from here on


def _rows(path, sql: str) -> Counter:
    with sqlite3.connect(path) as conn:
        return Counter(tuple(r) for r in conn.execute(sql).fetchall())


def _check_tables(world: World) -> None:
    hierarchy, graph = world.pipeline.store("hierarchy").path, world.pipeline.store("graph").path
    with sqlite3.connect(hierarchy) as conn:
        units = conn.execute("SELECT unit_id, tenant_id, kind, data FROM units").fetchall()
    members = Counter((t, u, tenant) for u, tenant, kind, data in units if kind != "turn" for t in json.loads(data)["turn_ids"])
    assert _rows(hierarchy, "SELECT turn_id, unit_id, tenant_id FROM unit_members") == members
    assert _rows(hierarchy, "SELECT unit_key, unit_id FROM unit_keys") == Counter((unit_key(u), u) for u, *_ in units)
    assert _rows(hierarchy, "SELECT tenant_id, conversation_id, speaker, turns FROM speakers") == Counter(
        (t, c, s, n) for (t, c, s), n in _rows(hierarchy, "SELECT tenant_id, conversation_id, speaker FROM turns").items())
    assert _rows(graph, "SELECT entity_id, tenant_id, conversation_id, contexts FROM entity_degree") == Counter(
        (e, t, c, n) for (e, t, c), n in _rows(graph, "SELECT entity_id, tenant_id, conversation_id FROM mentions "
                                                      "WHERE kind IN ('ner', 'speaker', 'keyword')").items())
    with sqlite3.connect(graph) as conn:
        sentences = conn.execute("SELECT sentence_id, tenant_id, conversation_id, entity_ids FROM sentences").fetchall()
    assert _rows(graph, "SELECT entity_id, sentence_id, tenant_id, conversation_id FROM sentence_entities") == Counter(
        {(e, s, t, c) for s, t, c, ents in sentences for e in json.loads(ents)})


def _conversations(world: World) -> set[str]:
    """The conversations that still hold turns."""
    return {c for (c,) in _rows(world.pipeline.store("hierarchy").path, "SELECT DISTINCT conversation_id FROM turns")}


def _check_scopes(world: World) -> None:
    live = world.views.store("dense")
    fresh = type(live)(live.path, live.generation)
    try:
        for key, scope in live._scopes.loaded():
            again = fresh._scope(*key)
            assert set(scope.row) == set(again.row), key
            for pid in scope.row:
                np.testing.assert_allclose(scope._vectors(np.array([scope.row[pid]])), again._vectors(np.array([again.row[pid]])))
    finally:
        fresh.close()
    graph = world.views.store("graph")
    held = graph.scope_contents()
    # A conversation every turn of which was forgotten has no walk, so no scope.
    assert {("t1", c) for c in _conversations(world)} | ({("t1", None)} if _conversations(world) else set()) <= set(held)
    assert held == graph.scope_contents(fresh=True)


def _check_unit_reads(world: World) -> None:
    live = world.views.store("hierarchy")
    held = live.kept_reads()
    if _conversations(world):
        assert held["units"] and held["groups"] and held["starts"]  # the searches read through them
    fresh = type(live)(live.path, live.generation)
    try:
        units = fresh.get_units("t1", list(held["units"]))
        assert {uid: u.model_dump_json() for uid, u in units.items()} == held["units"]
        assert all(unit_key(uid) == key and uid in held["units"] for key, uid in held["keys"].items())
        kept_groups = {t: [g for g, _ in groups] for t, (_, groups) in held["groups"].items()}
        assert fresh.containing("t1", list(held["groups"])) == kept_groups
        starts = fresh.session_starts("t1", [(c, s) for _, c, s in held["starts"]])
        assert {("t1", c, s): at for (c, s), at in starts.items()} == held["starts"]
    finally:
        fresh.close()


@settings(max_examples=6, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(ops=OPS, seed=st.integers(0, 10_000))
def test_maintained_structures_equal_a_fresh_build(tmp_path_factory, ops, seed):
    world = World(tmp_path_factory.mktemp("maintained"))
    try:
        asyncio.run(_run(world, ops, random.Random(seed)))
        _check_tables(world)
        _check_scopes(world)
        _check_unit_reads(world)
        fresh_views = LiveViews(world.registry)
        try:
            fresh = QueryService(fresh_views, world.registry.encoder(), world.registry.extractor())
            assert world.search(world.service) == world.search(fresh)
        finally:
            fresh_views.close()
    finally:
        world.views.close()
        asyncio.run(world.pipeline.close())
