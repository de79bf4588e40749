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
