"""Contract of the UnitStore port (hierarchy view), run against every adapter."""

from __future__ import annotations

import uuid

import pytest

from schemas.events import ForgetScope
from schemas.ports.unit_store import UnitChangeSet
from schemas.ports.views import Boundary, Forget
from streams.segmentation import diff_units
from tests.contracts import forgetting
from tests.contracts.builders import check_versions_pinned_by_read_scope, row, units

pytestmark = pytest.mark.contract


def _sqlite(request, tmp_path):
    from infra.units.sqlite import SqliteUnitStore

    return SqliteUnitStore(tmp_path / "units.sqlite", 1)


def _opensearch(request, tmp_path):
    from infra.units.opensearch import OpenSearchUnitStore

    # A fresh index prefix per test: tests sharing the node never see each other's units.
    s = OpenSearchUnitStore(request.getfixturevalue("opensearch_url"), f"contract-{uuid.uuid4().hex[:10]}", 1)
    request.addfinalizer(s.destroy)
    return s


ADAPTERS = {"sqlite": _sqlite, "opensearch": _opensearch}
NEEDS_SERVER = {"opensearch"}
SERVER_DATA = {"opensearch": "opensearch"}  # adapter -> test server whose files a byte scan reads


@pytest.fixture(params=[pytest.param(name, marks=pytest.mark.integration) if name in NEEDS_SERVER else name for name in sorted(ADAPTERS)])
def store(request, tmp_path):
    s = ADAPTERS[request.param](request, tmp_path)
    yield s
    s.close()


def _put(store, rows, positions):
    store.apply(UnitChangeSet(put_turns=rows, upsert_units=units(rows)), positions)


def test_units_and_positions_are_written_together_and_read_back(store):
    rows = [row(i, f"text {i}") for i in range(5)]
    assert store.positions() == {}
    _put(store, rows, {0: 5})
    assert store.positions() == {0: 5}
    all_units = units(rows)
    got = store.get_units("t1", [u.unit_id for u in all_units])
    assert got == {u.unit_id: u for u in all_units}
    windows = store.list_units(Boundary("t1", ("c1",)), "window")
    assert [u.provenance.turn_start for u in windows] == [0, 2, 4][: len(windows)]
    assert windows[0].provenance.event_ids == ("c1-s1-0", "c1-s1-1", "c1-s1-2")
    assert store.session_unit_ids("t1", "c1", "s1") == {u.unit_id for u in all_units}


def test_ledger_finds_turns_and_returns_sessions_in_canonical_order(store):
    rows = [row(i, f"text {i}") for i in range(4)]
    _put(store, [rows[2], rows[0], rows[3], rows[1]], {0: 4})
    assert [t.turn_index for t in store.session_turns("t1", "c1", "s1")] == [0, 1, 2, 3]
    found = store.find_turns("t1", "c1", ["c1-s1-1", "c1-s1-9"])
    assert set(found) == {"c1-s1-1"} and found["c1-s1-1"].text == "text 1"


def test_reads_never_cross_tenants(store):
    mine = [row(i, f"mine {i}") for i in range(3)]
    theirs = [row(i, f"theirs {i}", tenant="t2") for i in range(3)]
    _put(store, mine, {0: 3})
    _put(store, theirs, {0: 6})
    their_ids = [u.unit_id for u in units(theirs)]
    assert store.get_units("t1", their_ids) == {}
    assert all(u.provenance.tenant_id == "t1" for u in store.list_units(Boundary("t1"), "turn"))
    assert store.find_turns("t1", "c1", ["c1-s1-0"])["c1-s1-0"].text == "mine 0"


def test_boundary_filters_sessions_agents_and_time(store):
    rows = [row(i, f"a {i}", session="s1", agent="a1") for i in range(3)] + [row(i, f"b {i}", session="s2", agent="a2", minutes=100 + i) for i in range(3)]
    _put(store, rows[:3], {0: 3})
    _put(store, rows[3:], {0: 6})
    assert {u.provenance.session_id for u in store.list_units(Boundary("t1", ("c1",), ("s2",)), "turn")} == {"s2"}
    assert {u.provenance.agent_ids for u in store.list_units(Boundary("t1", agent_ids=("a1",)), "turn")} == {("a1",)}
    later = rows[3].occurred_at
    assert all(u.provenance.occurred_to >= later for u in store.list_units(Boundary("t1", since=later), "turn"))
    assert len(store.list_units(Boundary("t1", since=later), "turn")) == 3


def test_forget_conversation_removes_its_units_and_turns(store):
    rows = [row(i, f"x {i}") for i in range(3)]
    other = [row(i, f"y {i}", conv="c2") for i in range(3)]
    _put(store, rows, {0: 3})
    _put(store, other, {0: 6})
    store.apply(UnitChangeSet(forgets=[Forget("t1", ForgetScope(level="conversation", conversation_id="c1"))]), {0: 7})
    assert store.list_units(Boundary("t1", ("c1",)), "turn") == []
    assert store.session_turns("t1", "c1", "s1") == []
    assert len(store.list_units(Boundary("t1", ("c2",)), "turn")) == 3
    assert store.positions() == {0: 7}


def test_upsert_replaces_and_delete_removes(store):
    rows = [row(i, f"x {i}") for i in range(3)]
    _put(store, rows, {0: 3})
    grown = rows + [row(3, "x 3")]
    before, after = units(rows), units(grown)
    from streams.segmentation import diff_units

    upserts, deletes = diff_units(before, after)
    store.apply(UnitChangeSet(put_turns=[grown[-1]], upsert_units=upserts, delete_units=deletes), {0: 4})
    assert {u.unit_id for u in store.list_units(Boundary("t1"), "window")} == {u.unit_id for u in after if u.kind == "window"}
    assert store.canonical_dump() == store.canonical_dump()  # deterministic


def test_versions_change_on_write_and_hold_within_a_read_scope(store):
    _put(store, [row(0, "a")], {0: 1})
    check_versions_pinned_by_read_scope(store, lambda: _put(store, [row(1, "b")], {0: 2}))


# -- forgetting -------------------------------------------------------------------------------
def _session_change(change: UnitChangeSet, key, before, after, added) -> None:
    """The hierarchy projection's rule: a session's units move from `before` to `after`."""
    upserts, deletes = diff_units(units(before), units(after))
    change.upsert_units.extend(upserts)
    change.delete_units.extend(deletes)


MODEL = forgetting.Model(UnitChangeSet, _session_change)


def _reference(request, tmp_path):
    """A second store of the same adapter, in its own namespace."""
    def make():
        ref = ADAPTERS[request.node.callspec.params["store"]](request, tmp_path / "ref")
        request.addfinalizer(ref.close)
        return ref

    return make


@pytest.mark.parametrize("scope", sorted(forgetting.SCOPES))
def test_forget_removes_exactly_what_the_scope_covers(store, request, tmp_path, scope):
    forgetting.check_scope(store, _reference(request, tmp_path), MODEL, scope)


def test_forget_erases_every_byte_of_the_forgotten_turns(store, request, tmp_path):
    name = request.node.callspec.params["store"]
    root = forgetting.data_dir(SERVER_DATA[name]) if name in SERVER_DATA else tmp_path
    got = forgetting.check_canary(store, root, _reference(request, tmp_path), MODEL, keeps_plaintext=True)
    print(f"hierarchy/{name}: canaries seen before in {got['seen_before']}; erased after {got['erasure_seconds']:.1f} s")


# -- reading turns back (GET /v1/turns…): corrections, pages, event ids ---------------------------
def _correction(of, i: int, text: str, **kw):
    from dataclasses import replace

    r = row(i, text, **kw)
    return replace(r, supersedes=of.event_id)


def test_corrections_supersede_the_turn_they_name_within_its_conversation_only(store):
    c1 = [row(i, f"c1 turn {i}") for i in range(4)]
    c2 = [row(i, f"c2 turn {i}", conv="c2") for i in range(2)]  # c2-s1-0 ... ids differ; c1-s1-1 is named from c2 below
    fix = _correction(c1[1], 10, "c1 turn 1, corrected")
    fix2 = _correction(fix, 11, "c1 turn 1, corrected again")
    foreign = _correction(c1[2], 12, "names c1's turn from c2", conv="c2")  # another conversation: supersedes nothing
    other_tenant = _correction(c1[3], 13, "names c1's turn from t2", tenant="t2")
    _put(store, [*c1, *c2, fix, fix2, foreign, other_tenant], {0: 20})
    assert store.superseded(Boundary("t1", ("c1",))) == {c1[1].turn_id, fix.turn_id}
    assert store.superseded(Boundary("t1")) == {c1[1].turn_id, fix.turn_id}
    assert store.superseded(Boundary("t1", ("c2",))) == set()
    assert store.superseded(Boundary("t2")) == set()
    assert [t.event_id for t in store.corrections("t1", "c1", c1[1].event_id)] == [fix.event_id]
    assert [t.event_id for t in store.corrections("t1", "c1", fix.event_id)] == [fix2.event_id]
    assert store.corrections("t1", "c1", c1[2].event_id) == []
    [got] = store.turns_by_event("t1", fix2.event_id)
    assert got.supersedes == fix.event_id and got.text == "c1 turn 1, corrected again"


def test_pages_of_turns_follow_time_order_and_a_cursor_survives_new_turns(store):
    from infra.turn_docs import micros

    rows = [row(i, f"turn {i}", agent="a1" if i % 2 else "a2") for i in range(7)]
    fix = _correction(rows[3], 20, "turn 3, corrected")
    _put(store, [*rows, fix], {0: 8})
    b = Boundary("t1", ("c1",))
    first = store.page_turns(b, None, 3)
    assert [t.event_id for t in first] == ["c1-s1-0", "c1-s1-1", "c1-s1-2"]
    _put(store, [row(30, "a late turn, earlier in time", minutes=-5)], {0: 9})  # before the cursor: not on later pages
    cursor = (micros(first[-1].occurred_at), first[-1].turn_id)
    rest = store.page_turns(b, cursor, 100)
    assert [t.event_id for t in rest] == ["c1-s1-4", "c1-s1-5", "c1-s1-6", "c1-s1-20"]  # the corrected turn 3 is left out
    assert [t.event_id for t in store.page_turns(b, cursor, 100, include_superseded=True)][:2] == ["c1-s1-3", "c1-s1-4"]
    agent = store.page_turns(Boundary("t1", ("c1",), agent_ids=("a1",)), None, 100)
    assert [t.event_id for t in agent] == ["c1-s1-30", "c1-s1-1", "c1-s1-5", "c1-s1-20"]  # a1 (turn 3 is superseded)
    assert store.page_turns(Boundary("t2"), None, 100) == []
    assert store.turns_by_event("t1", "c1-s1-0", "c2") == [] and len(store.turns_by_event("t1", "c1-s1-0")) == 1


# -- the bounded query path's reads -------------------------------------------------------------
SPEAKERS = {("t1", "c1"): ("Ann", "Bob"), ("t1", "c2"): ("Cy",), ("t2", "c1"): ("Zed",), ("t2", "c2"): ("Zed",)}


def _speaking(rows):
    """forgetting.dataset() with speakers of their own per conversation (Ann and Bob take turns in t1's c1)."""
    from dataclasses import replace

    def speaker(r):
        names = SPEAKERS[(r.tenant_id, r.conversation_id)]
        return names[r.turn_index % len(names)]

    return [replace(r, speaker=speaker(r)) for r in rows]


def _held(rows) -> dict[str, list[str]]:
    """What `containing` must say for `rows`' turns: the windows and episodes of their sessions that hold each."""
    out: dict[str, list[str]] = {}
    for session in forgetting.sessions(rows).values():
        for u in units(session):
            if u.kind != "turn":
                for t in u.turn_ids:
                    out.setdefault(t, []).append(u.unit_id)
    return {t: sorted(ids) for t, ids in out.items()}


def _check_bounded_reads(store, rows) -> None:
    """speakers, size, latest, session_starts, units_by_keys and containing against what `rows` (the
    turns the store holds) say, for each tenant and a few boundaries."""
    from datetime import timedelta

    from schemas.units import unit_key
    from tests.contracts.builders import T0

    for tenant in ("t1", "t2", "t3"):
        mine = [r for r in rows if r.tenant_id == tenant]
        for convs, sessions in ((None, None), (("c1",), None), (("c1",), ("s2",)), (("c2", "c9"), ("s1", "s2")),
                                ((), None)):
            inside = [r for r in mine if convs is None or r.conversation_id in convs]
            # Sessions, agents and times narrow `latest` only as the docstrings say: the sessions do, the rest never.
            b = Boundary(tenant, convs, sessions, agent_ids=("a2",), since=T0 + timedelta(minutes=15),
                         until=T0 + timedelta(minutes=25))
            assert store.speakers(b) == sorted({r.speaker for r in inside}), (tenant, convs)
            assert store.size(b) == len(inside), (tenant, convs)
            latest = [r.occurred_at for r in inside if sessions is None or r.session_id in sessions]
            assert store.latest(b) == (max(latest) if latest else None), (tenant, convs, sessions)
        asked = [(c, s) for c in ("c1", "c2", "c9") for s in ("s1", "s2", "s9")]
        starts = {k: min(r.occurred_at for r in v) for k, v in forgetting.sessions(mine).items()}
        assert store.session_starts(tenant, asked) == {(c, s): t for (_, c, s), t in starts.items()}, tenant
        others = [r for r in rows if r.tenant_id != tenant]
        expected = {unit_key(u.unit_id): u for s in forgetting.sessions(mine).values() for u in units(s)}
        their_keys = [unit_key(u.unit_id) for s in forgetting.sessions(others).values() for u in units(s)]
        assert store.units_by_keys(tenant, [*expected, *their_keys, 12345]) == expected, tenant
        assert store.containing(tenant, [r.turn_id for r in mine] + ["t_unknown"]) == _held(mine), tenant


def test_bounded_reads_answer_what_the_boundarys_turns_say(store):
    rows = _speaking(forgetting.dataset())
    forgetting.write(store, MODEL, [r for r in rows if r.tenant_id == "t2"])
    forgetting.write(store, MODEL, [r for r in rows if r.tenant_id == "t1"])
    _check_bounded_reads(store, rows)
    assert store.units_by_keys("t1", []) == {} and store.containing("t1", []) == {}
    assert store.session_starts("t1", []) == {}




def test_containing_never_answers_for_another_tenants_turns(store, request):
    """Like every read of the port that takes a tenant: another tenant's ids are absent."""
    rows = forgetting.dataset()
    forgetting.write(store, MODEL, rows)
    theirs = [r.turn_id for r in rows if r.tenant_id == "t2"]
    assert store.containing("t2", theirs) == _held([r for r in rows if r.tenant_id == "t2"])
    assert store.containing("t1", theirs) == {}


def test_bounded_reads_follow_late_turns_and_forgets(store):
    """A late turn re-cuts its session's windows (the same window ids, other members: the
    documents replaced), and forgets — partial ones re-cut their sessions too — take turns,
    speakers and units out at once."""
    from schemas.units import unit_key

    rows = _speaking(forgetting.dataset())
    forgetting.write(store, MODEL, rows)
    first = {u.unit_id: u for u in units(forgetting.sessions(rows)[("t1", "c1", "s1")])}
    late = row(9, "a late turn between the first two", conv="c1", session="s1", agent="a2", speaker="Dee", minutes=5)
    forgetting.write(store, MODEL, [late])
    rows.append(late)
    now = {u.unit_id: u for u in units(forgetting.sessions(rows)[("t1", "c1", "s1")])}
    recut = [uid for uid in set(first) & set(now) if first[uid].turn_ids != now[uid].turn_ids]
    assert recut  # the case under test: a window kept its id and changed its members
    _check_bounded_reads(store, rows)
    assert store.units_by_keys("t1", [unit_key(u) for u in recut]) == {unit_key(u): now[u] for u in recut}
    # A partial forget (one turn, the session re-cut without it), then an agent's turns (several
    # sessions re-cut), then a whole conversation.
    for scope in (ForgetScope(level="turn", conversation_id="c1", event_id=late.event_id),
                  ForgetScope(level="agent", agent_id="a2"), ForgetScope(level="conversation", conversation_id="c1")):
        gone = forgetting.covered(scope, rows)
        forgetting.forget(store, MODEL, scope)
        rows = [r for r in rows if r.turn_id not in gone]
        _check_bounded_reads(store, rows)
        assert not set(store.containing("t1", sorted(gone))), scope


def _as_format_2_sqlite(store):
    """The file as format 2 wrote it: no keys, members or speakers tables."""
    import sqlite3

    store.close()
    conn = sqlite3.connect(store.path)
    conn.executescript("DROP TABLE unit_keys; DROP TABLE unit_members; DROP TABLE speakers; "
                       "UPDATE meta SET value = '2' WHERE key = 'format';")
    conn.close()
    from infra.units.sqlite import SqliteUnitStore

    return SqliteUnitStore(store.path, store.generation)


def _as_format_1_opensearch(store):
    """The indices as format 1 wrote them: units without their key and members, the ledger
    without `speaker` indexed, no format recorded."""
    from infra.opensearch_base import _LEDGER_MAPPINGS, all_hits
    from infra.units.opensearch import OpenSearchUnitStore

    client = store._os()
    units_ = all_hits(client, store.index, {"match_all": {}})
    stripped = [({"index": {"_index": store.index, "_id": h["_id"]}},
                 {k: v for k, v in h["_source"].items() if k not in ("unit_key", "turn_ids")}) for h in units_]
    client.bulk(body=[x for pair in stripped for x in pair], refresh=True)
    client.indices.put_mapping(index=store.index, body={"_meta": {}})
    ledger = all_hits(client, store.ledger_index, {"match_all": {}})
    settings = client.indices.get_settings(index=store.ledger_index)[store.ledger_index]["settings"]["index"]
    client.indices.delete(index=store.ledger_index)
    old = {**_LEDGER_MAPPINGS, "properties": {k: v for k, v in _LEDGER_MAPPINGS["properties"].items()
                                              if k != "speaker"}}
    client.indices.create(index=store.ledger_index,
                          body={"settings": {"number_of_shards": settings["number_of_shards"]}, "mappings": old})
    body = [x for h in ledger for x in ({"index": {"_index": store.ledger_index, "_id": h["_id"]}}, h["_source"])]
    client.bulk(body=body, refresh=True)
    return OpenSearchUnitStore(store.url, store.prefix, store.generation)


FORMER = {"sqlite": _as_format_2_sqlite, "opensearch": _as_format_1_opensearch}


def test_a_generation_written_before_the_bounded_reads_answers_them(store, request):
    """A generation written by the previous format, opened by this release: its bounded reads
    answer as for a new one (migrated on open), and writes keep them right."""
    rows = _speaking(forgetting.dataset())
    forgetting.write(store, MODEL, rows)
    old = FORMER[request.node.callspec.params["store"]](store)
    request.addfinalizer(old.close)
    _check_bounded_reads(old, rows)
    late = row(9, "a late turn", conv="c2", session="s1", speaker="Eve", minutes=5)
    forgetting.write(old, MODEL, [late])
    _check_bounded_reads(old, [*rows, late])


def _as_newer_sqlite(store):
    import sqlite3

    from infra.units.sqlite import SqliteUnitStore

    store.close()
    conn = sqlite3.connect(store.path)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'format'", (str(SqliteUnitStore.format_version + 1),))
    conn.commit()
    conn.close()
    return lambda: SqliteUnitStore(store.path, store.generation).positions()


def _as_newer_opensearch(store):
    from infra.units.opensearch import OpenSearchUnitStore

    newer = {"format": OpenSearchUnitStore.format_version + 1}
    store._os().indices.put_mapping(index=store.index, body={"_meta": newer})
    return lambda: OpenSearchUnitStore(store.url, store.prefix, store.generation).positions()


NEWER = {"sqlite": _as_newer_sqlite, "opensearch": _as_newer_opensearch}


def test_a_generation_of_a_newer_format_is_refused(store, request):
    """Written by a newer release: refused on open, never read (its fields may mean other things)."""
    from schemas.errors import FormatTooNew

    _put(store, [row(0, "a")], {0: 1})
    reopen = NEWER[request.node.callspec.params["store"]](store)
    with pytest.raises(FormatTooNew):
        reopen()
