"""Contract of the LexicalIndex port (BM25 over units), run against every adapter."""

from __future__ import annotations

import uuid
from datetime import timedelta

import numpy as np
import pytest

from schemas.events import ForgetScope
from schemas.ports.lexical import LexicalChangeSet, LexicalDoc
from schemas.units import unit_key
from schemas.ports.views import Boundary, Forget
from streams.segmentation import diff_units
from tests.contracts import forgetting
from tests.contracts.builders import T0, check_concurrent_reads, row, units

pytestmark = pytest.mark.contract


def _tantivy(request, tmp_path):
    from infra.lexical.tantivy import TantivyLexicalIndex

    return TantivyLexicalIndex(tmp_path / "lexical", 1)


def _opensearch(request, tmp_path):
    from infra.lexical.opensearch import OpenSearchLexicalIndex

    # A fresh index prefix per test: tests sharing the node never see each other's documents.
    s = OpenSearchLexicalIndex(request.getfixturevalue("opensearch_url"), f"contract-{uuid.uuid4().hex[:10]}", 1)
    request.addfinalizer(s.destroy)
    return s


ADAPTERS = {"tantivy": _tantivy, "opensearch": _opensearch}
NEEDS_SERVER = {"opensearch"}
SERVER_DATA = {"opensearch": "opensearch"}  # adapter -> test server whose files a byte scan reads


@pytest.fixture(params=[pytest.param(name, marks=pytest.mark.integration) if name in NEEDS_SERVER else name for name in sorted(ADAPTERS)])
def index(request, tmp_path):
    s = ADAPTERS[request.param](request, tmp_path)
    yield s
    s.close()


def doc(uid, text, *, kind="turn", tenant="t1", conv="c1", session="s1", agents=("a1",), minutes=0):
    t = T0 + timedelta(minutes=minutes)
    return LexicalDoc(uid, kind, text, tenant, conv, session, agents, t, t)


def test_bm25_ranks_by_term_statistics_and_stems(index):
    index.apply(LexicalChangeSet(upsert_docs=[
        doc("u1", "we went hiking in the mountains"),
        doc("u2", "hiking hiking every weekend, hikes in the rain"),
        doc("u3", "I bought a new guitar"),
    ]), {0: 3})
    hits = index.search("turn", "hike", Boundary("t1"), 10)
    assert [h.unit_id for h in hits] == ["u2", "u1"]  # stemming: hike ~ hiking ~ hikes
    assert hits[0].score > hits[1].score > 0
    assert index.search("turn", "   ...  ", Boundary("t1"), 10) == []
    assert index.positions() == {0: 3}


def test_kinds_and_boundaries_filter(index):
    index.apply(LexicalChangeSet(upsert_docs=[
        doc("t-a", "pottery class", conv="c1", session="s1", agents=("a1",), minutes=0),
        doc("t-b", "pottery workshop", conv="c1", session="s2", agents=("a2",), minutes=60),
        doc("t-c", "pottery wheel", conv="c2"),
        doc("w-a", "pottery class and more", kind="window"),
        doc("t-x", "pottery", tenant="t2"),
    ]), {0: 5})
    ids = lambda b, kind="turn": {h.unit_id for h in index.search(kind, "pottery", b, 10)}
    assert ids(Boundary("t1")) == {"t-a", "t-b", "t-c"}
    assert ids(Boundary("t1"), "window") == {"w-a"}
    assert ids(Boundary("t1", ("c1",))) == {"t-a", "t-b"}
    assert ids(Boundary("t1", ("c1",), ("s2",))) == {"t-b"}
    assert ids(Boundary("t1", agent_ids=("a1",))) == {"t-a", "t-c"}
    assert ids(Boundary("t1", ("c1",), since=T0 + timedelta(minutes=30))) == {"t-b"}
    assert ids(Boundary("t1", ("c1",), until=T0 + timedelta(minutes=30))) == {"t-a"}
    assert ids(Boundary("t2")) == {"t-x"}


def test_scoring_every_kind_at_once_equals_each_kind_alone(index):
    index.apply(LexicalChangeSet(upsert_docs=[
        doc("t-a", "pottery class"), doc("t-b", "hiking trip"), doc("t-c", "pottery pottery wheel", conv="c2"),
        doc("w-a", "pottery class and a hiking trip", kind="window"), doc("e-a", "pottery and more pottery", kind="episode"),
        doc("t-x", "pottery", tenant="t2"),
    ]), {0: 6})
    b = Boundary("t1", ("c1",))
    keys, scores = index.score_units(None, "pottery hiking", b, 100)
    together = dict(zip(keys.tolist(), scores.tolist()))
    alone = {}
    for kind in ("turn", "window", "episode"):
        k, v = index.score_units(kind, "pottery hiking", b, 100)
        alone.update(zip(k.tolist(), v.tolist()))
    assert len(alone) == 4 and set(together) == set(alone)  # t-a, t-b, w-a, e-a; not c2, not t2
    assert all(abs(together[k] - alone[k]) < 1e-5 for k in alone)


def test_scoring_named_units_gives_each_the_score_of_the_whole_ranking(index):
    """score_ids: the named units inside the boundary that match, each with the score score_units
    gives it; units of another tenant, conversation or kind, and units that do not match, are absent."""
    index.apply(LexicalChangeSet(upsert_docs=[
        doc("t-a", "pottery class"), doc("t-b", "hiking trip"), doc("t-c", "pottery pottery wheel", conv="c2"),
        doc("t-d", "pottery and a lot of hiking"), doc("w-a", "pottery class and a hiking trip", kind="window"),
        doc("t-x", "pottery", tenant="t2"),
    ]), {0: 6})
    b = Boundary("t1", ("c1",))
    keys, scores = index.score_units("turn", "pottery hiking", b, 100)
    whole = dict(zip(keys.tolist(), scores.tolist()))
    k, v = index.score_ids("turn", "pottery hiking", b, ["t-a", "t-d", "t-c", "t-x", "w-a", "nope"])
    named = dict(zip(k.tolist(), v.tolist()))
    assert set(named) == {unit_key("t-a"), unit_key("t-d")}
    assert all(abs(named[key] - whole[key]) < 1e-5 for key in named)
    assert index.score_ids("turn", "   ", b, ["t-a"])[0].size == 0 and index.score_ids("turn", "pottery", b, [])[0].size == 0
    # Every kind at once: the same score per unit as its own kind's call.
    k, v = index.score_ids(None, "pottery hiking", b, ["t-a", "t-d", "w-a", "t-x"])
    mixed = dict(zip(k.tolist(), v.tolist()))
    window = dict(zip(*(a.tolist() for a in index.score_ids("window", "pottery hiking", b, ["w-a"]))))
    assert set(mixed) == {unit_key("t-a"), unit_key("t-d"), unit_key("w-a")}
    assert all(abs(mixed[key] - {**named, **window}[key]) < 1e-5 for key in mixed)


def test_reads_from_several_threads_at_once_answer_as_alone(index, request):
    index.apply(LexicalChangeSet(upsert_docs=[
        doc("t-a", "pottery class"), doc("t-b", "hiking trip"), doc("w-a", "pottery class and a hiking trip", kind="window"),
        doc("e-a", "pottery and more pottery", kind="episode"), doc("t-x", "pottery", tenant="t2"),
    ]), {0: 5})
    b = Boundary("t1", ("c1",))
    keyed = lambda ks: dict(zip(ks[0].tolist(), np.round(ks[1], 5).tolist()))  # noqa: E731
    check_concurrent_reads(index, request.node.callspec.params["index"], NEEDS_SERVER, {
        "every kind": lambda: keyed(index.score_units(None, "pottery hiking", b, 100)),
        "turns": lambda: keyed(index.score_units("turn", "pottery", b, 100)),
        "search": lambda: [(h.unit_id, round(h.score, 5)) for h in index.search("window", "hiking", b, 10)],
    })


def test_upsert_replaces_delete_removes_forget_clears_scope(index):
    index.apply(LexicalChangeSet(upsert_docs=[doc("u1", "red balloon"), doc("u2", "blue balloon", conv="c2")]), {0: 2})
    index.apply(LexicalChangeSet(upsert_docs=[doc("u1", "green kite")]), {0: 3})
    assert [h.unit_id for h in index.search("turn", "balloon", Boundary("t1"), 10)] == ["u2"]
    assert [h.unit_id for h in index.search("turn", "kite", Boundary("t1"), 10)] == ["u1"]
    index.apply(LexicalChangeSet(delete_docs=["u1"]), {0: 4})
    assert index.search("turn", "kite", Boundary("t1"), 10) == []
    index.apply(LexicalChangeSet(forgets=[Forget("t1", ForgetScope(level="conversation", conversation_id="c2"))]), {0: 5})
    assert index.search("turn", "balloon", Boundary("t1"), 10) == []
    assert index.positions() == {0: 5}


def test_ledger(index):
    rows = [row(2, "b"), row(0, "a"), row(1, "c")]
    index.apply(LexicalChangeSet(put_turns=rows), {0: 3})
    assert [t.turn_index for t in index.session_turns("t1", "c1", "s1")] == [0, 1, 2]
    assert set(index.find_turns("t1", "c1", ["c1-s1-1", "nope"])) == {"c1-s1-1"}


# -- forgetting -------------------------------------------------------------------------------
def _doc(u) -> LexicalDoc:
    """The lexical projection's document of a unit (turns carry their speaker's name)."""
    p = u.provenance
    text = f"{p.speakers[0]}: {u.text}" if u.kind == "turn" else u.text
    return LexicalDoc(u.unit_id, u.kind, text, p.tenant_id, p.conversation_id, p.session_id, p.agent_ids, p.occurred_from, p.occurred_to)


def _session_change(change: LexicalChangeSet, key, before, after, added) -> None:
    upserts, deletes = diff_units(units(before), units(after))
    change.upsert_docs.extend(_doc(u) for u in upserts)
    change.delete_docs.extend(deletes)


MODEL = forgetting.Model(LexicalChangeSet, _session_change)


def _reference(request, tmp_path):
    def make():
        ref = ADAPTERS[request.node.callspec.params["index"]](request, tmp_path / "ref")
        request.addfinalizer(ref.close)
        return ref

    return make


@pytest.mark.parametrize("scope", sorted(forgetting.SCOPES))
def test_forget_removes_exactly_what_the_scope_covers(index, request, tmp_path, scope):
    forgetting.check_scope(index, _reference(request, tmp_path), MODEL, scope)
    for name in ("hike", "topic0", "turn"):  # and the engine's own search agrees with the dump
        assert {h.unit_id for h in index.search("turn", name, Boundary("t1"), 100)} <= {
            d[0] for d in index.canonical_dump()["docs"]}


def test_forget_erases_every_byte_of_the_forgotten_turns(index, request, tmp_path):
    name = request.node.callspec.params["index"]
    root = forgetting.data_dir(SERVER_DATA[name]) if name in SERVER_DATA else tmp_path
    got = forgetting.check_canary(index, root, _reference(request, tmp_path), MODEL, keeps_plaintext=True)
    if name == "tantivy":  # the positive control saw the segments themselves, not only the ledger: a canary in a
        # .store file proves the scan reads them (LZ4 may encode part of a random canary as a back-reference
        # to bytes seen earlier in its block, so one of the two can be unreadable there as a whole)
        assert any(any(f.startswith("lexical/tenants/") and f.endswith(".store") for f in files) for files in got["seen_before"].values()), got
    print(f"lexical/{name}: canaries seen before in {got['seen_before']}; erased after {got['erasure_seconds']:.1f} s")


# -- a writer that dies in the middle of a change set -------------------------------------------
class _Died(BaseException):
    """The process 'dies' at a fault point: nothing of the apply runs after it (SQLite rolls its
    open transaction back, as a kill would leave it)."""


def _reopen(index):
    """A new store object over the same data: what a restarted process opens."""
    if index.backend == "tantivy":
        from infra.lexical.tantivy import TantivyLexicalIndex

        return TantivyLexicalIndex(index.directory, index.generation)
    from infra.lexical.opensearch import OpenSearchLexicalIndex

    return OpenSearchLexicalIndex(index.url, index.prefix, index.generation, **index._client_options)


@pytest.mark.parametrize("first", ["upsert", "forget"])
def test_a_change_interrupted_before_its_positions_leaves_nothing_the_ledger_cannot_account_for(index, monkeypatch, first):
    """The replay after a crash need not rewrite what the dead writer wrote (a turn whose key a
    forget destroyed meanwhile is skipped), so an interrupted change set must leave no document
    whose turns the ledger does not hold — here a turn and the window over it, followed by a
    replay that no longer has that turn."""
    from schemas import faults

    kept = [row(0, "the harbour ferry at dawn"), row(1, "a quiet ferry crossing")]
    lost = row(2, "zebra marmalade canary")  # the turn the replay will not see again
    index.apply(LexicalChangeSet(put_turns=kept, upsert_docs=[_doc(u) for u in units(kept)]), {0: 2})
    interrupted = LexicalChangeSet(put_turns=[lost], upsert_docs=[_doc(u) for u in units([*kept, lost]) if lost.turn_id in u.turn_ids])
    if first == "forget":  # an erasing change (the store may rebuild after it) interrupted the same way
        interrupted.forgets.append(Forget("t1", ForgetScope(level="turn", conversation_id="c1", event_id=kept[0].event_id)))

    def die(point: str) -> None:
        if point == "view-written":
            raise _Died(point)

    monkeypatch.setattr(faults, "hit", die)
    with pytest.raises(_Died):
        index.apply(interrupted, {0: 3})
    monkeypatch.undo()
    index.close()
    index = _reopen(index)
    try:
        assert index.positions() == {0: 2}
        index.apply(LexicalChangeSet(), {0: 3})  # the replay: the lost turn skipped, nothing else to write
        ledger = {t.turn_id for t in index.session_turns("t1", "c1", "s1")}
        hits = index.search(None, "zebra marmalade", Boundary("t1"), 10)
        if lost.turn_id not in ledger:
            assert hits == [], f"documents of a change the ledger never recorded survived the crash: {hits}"
        dumped = {d[0] for d in index.canonical_dump()["docs"]}
        assert {u.unit_id for u in units(kept) if u.kind == "turn"} - dumped <= ({kept[0].turn_id} if first == "forget" else set())
    finally:
        index.close()
