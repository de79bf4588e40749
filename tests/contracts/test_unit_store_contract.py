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
