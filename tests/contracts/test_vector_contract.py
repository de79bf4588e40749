"""Contract of the VectorStore port (dense view), run against every adapter."""

from __future__ import annotations

import uuid
from datetime import timedelta

import numpy as np
import pytest

from schemas.events import ForgetScope
from schemas.ports.vectors import TurnPooling, VectorChangeSet, VectorPoint
from schemas.ports.views import Boundary, Forget
from schemas.units import sentence_id, unit_key
from streams.segmentation import diff_units
from tests.contracts import forgetting
from tests.contracts.builders import T0, check_concurrent_reads, check_versions_pinned_by_read_scope, row, sealer, unit_vector, units

pytestmark = pytest.mark.contract


def _sqlite(request, tmp_path):
    from infra.vectors.sqlite import SqliteVectorStore

    return SqliteVectorStore(tmp_path / "vectors.sqlite", 1)


def _qdrant_local(request, tmp_path):
    from infra.vectors.qdrant import QdrantVectorStore

    # qdrant-client's local mode: the same client API in-process, on disk in the test's own
    # directory (the `qdrant+local://` option); the prefix keeps collection names unique anyway.
    return QdrantVectorStore(str(tmp_path / "qdrant"), f"contract-{uuid.uuid4().hex[:10]}", 1, sealer=sealer(tmp_path))


def _qdrant_server(request, tmp_path, *, grpc: bool):
    from infra.vectors.qdrant import QdrantVectorStore
    from tests.integration.servers import drop_qdrant_prefix, qdrant_test_client

    # The real server, shared by the session: a fresh prefix per test, its collections deleted after.
    client, prefix = qdrant_test_client(request.getfixturevalue("qdrant_url"), grpc=grpc), f"contract-{uuid.uuid4().hex[:10]}"
    request.addfinalizer(lambda: drop_qdrant_prefix(request.getfixturevalue("qdrant_url"), prefix))
    return QdrantVectorStore(client, prefix, 1, sealer=sealer(tmp_path))


ADAPTERS = {
    "sqlite": _sqlite, "qdrant-local": _qdrant_local,
    "qdrant-server-grpc": lambda r, t: _qdrant_server(r, t, grpc=True), "qdrant-server-rest": lambda r, t: _qdrant_server(r, t, grpc=False),
}
NEEDS_SERVER = {"qdrant-server-grpc", "qdrant-server-rest"}
SERVER_DATA = {"qdrant-server-grpc": "qdrant", "qdrant-server-rest": "qdrant"}  # adapter -> test server whose files a byte scan reads
KEEPS_PLAINTEXT = {"sqlite"}  # the Qdrant adapters keep none (the ledger's text is sealed)


@pytest.fixture(params=[pytest.param(name, marks=pytest.mark.integration) if name in NEEDS_SERVER else name for name in sorted(ADAPTERS)])
def store(request, tmp_path):
    s = ADAPTERS[request.param](request, tmp_path)
    yield s
    s.close()


def point(pid, vec, *, collection="turn", tenant="t1", conv="c1", session="s1", agents=("a1",), minutes=0, owner=None):
    t = T0 + timedelta(minutes=minutes)
    return VectorPoint(collection, pid, vec, tenant, conv, session, agents, t, t, owner or pid)


def test_search_returns_exact_cosine_in_order(store):
    vecs = {f"p{i}": unit_vector(i) for i in range(20)}
    store.apply(VectorChangeSet(upsert_points=[point(k, v) for k, v in vecs.items()]), {0: 20})
    q = unit_vector(3)
    hits = store.search("turn", q, Boundary("t1", ("c1",)), 5)
    expected = sorted(vecs, key=lambda k: -float(vecs[k] @ q))[:5]
    assert [h.unit_id for h in hits] == expected
    assert hits[0].unit_id == "p3" and abs(hits[0].score - 1.0) < 1e-5
    for h in hits:
        assert abs(h.score - float(vecs[h.unit_id] @ q)) < 1e-5
    np.testing.assert_allclose(store.vectors("turn", "t1", ["p7"])["p7"], vecs["p7"], atol=1e-6)
    assert store.positions() == {0: 20}


@pytest.mark.parametrize("page", [None, 3], ids=["one-request", "counted"])
def test_score_units_scores_every_admissible_point_by_its_key(store, page):
    """Every point inside the boundary, and none outside it, with its exact cosine, under its
    unit key. `page`: a server adapter asks for a page of points first and counts only when the
    page comes back full; a small page reaches that path (adapters without one ignore it)."""
    from schemas.units import unit_key

    if page is not None:
        if not hasattr(store, "page"):
            pytest.skip("this adapter reads every point in one request")
        store.page = page
    vecs = {f"p{i}": unit_vector(i) for i in range(8)}
    store.apply(VectorChangeSet(upsert_points=[point(k, v) for k, v in vecs.items()]
                                + [point("other-conv", unit_vector(1), conv="c2"), point("other-tenant", unit_vector(1), tenant="t2"),
                                   point("w", unit_vector(1), collection="window")]), {0: 11})
    q = unit_vector(3)
    keys, scores = store.score_units("turn", q, Boundary("t1", ("c1",)))
    assert keys.dtype == np.int64 and len(keys) == len(scores) == len(vecs)
    want = {unit_key(k): float(v @ q) for k, v in vecs.items()}
    got = dict(zip(keys.tolist(), scores.tolist()))
    assert set(got) == set(want)
    for k, s in got.items():
        assert abs(s - want[k]) < 1e-5
    keys, _ = store.score_units("turn", q, Boundary("t1", ("nothing-here",)))
    assert len(keys) == 0
    # Several reads at once (a server adapter has them in flight together): each as if alone, in
    # order, a collection nobody wrote to included.
    requests = [("turn", q), ("window", unit_vector(1)), ("episode", q), ("turn", unit_vector(5))]
    many = store.score_units_many(requests, Boundary("t1", ("c1",)))
    assert len(many) == len(requests)
    for (collection, vector), (k, s) in zip(requests, many):
        alone = store.score_units(collection, vector, Boundary("t1", ("c1",)))
        assert dict(zip(k.tolist(), s.tolist())) == pytest.approx(dict(zip(alone[0].tolist(), alone[1].tolist())), abs=1e-6)
    assert len(many[1][0]) == 1 and len(many[2][0]) == 0  # the one window point; no episode collection at all


def test_reads_from_several_threads_at_once_answer_as_alone(store, request):
    vecs = {f"p{i}": unit_vector(i) for i in range(12)}
    store.apply(VectorChangeSet(upsert_points=[point(k, v) for k, v in vecs.items()] + [point("w", unit_vector(1), collection="window")]), {0: 13})
    b, q = Boundary("t1", ("c1",)), unit_vector(3)
    keyed = lambda ks: dict(zip(ks[0].tolist(), np.round(ks[1], 6).tolist()))  # noqa: E731
    check_concurrent_reads(store, request.node.callspec.params["store"], NEEDS_SERVER, {
        "score_units": lambda: keyed(store.score_units("turn", q, b)),
        "score_units_many": lambda: [keyed(r) for r in store.score_units_many([("turn", q), ("window", q), ("turn", unit_vector(5))], b)],
        "vectors": lambda: {k: np.round(v, 6).tolist() for k, v in store.vectors("turn", "t1", ["p1", "p7"]).items()},
        "search": lambda: [(h.unit_id, round(h.score, 6)) for h in store.search("turn", q, b, 5)],
        "nearest": lambda: keyed(store.nearest("turn", q, b, 5)),
        "score_points": lambda: {k: round(v, 6) for k, v in
                                 store.score_points("turn", q, b, ["p1", "p7", "w"]).items()},
    })


def test_collections_boundaries_and_tenants_are_separate(store):
    v = unit_vector(1)
    store.apply(VectorChangeSet(upsert_points=[
        point("a", v), point("b", v, session="s2", agents=("a2",), minutes=60), point("c", v, conv="c2"),
        point("w", v, collection="window"), point("x", v, tenant="t2"),
    ]), {0: 5})
    ids = lambda b, col="turn": {h.unit_id for h in store.search(col, v, b, 10)}
    assert ids(Boundary("t1")) == {"a", "b", "c"}
    assert ids(Boundary("t1"), "window") == {"w"}
    assert ids(Boundary("t1", ("c1",))) == {"a", "b"}
    assert ids(Boundary("t1", ("c1",), ("s2",))) == {"b"}
    assert ids(Boundary("t1", agent_ids=("a2",))) == {"b"}
    assert ids(Boundary("t1", ("c1",), since=T0 + timedelta(minutes=30))) == {"b"}
    assert ids(Boundary("t2")) == {"x"}
    assert store.vectors("turn", "t2", ["a"]) == {}


def test_upsert_delete_pooling_and_forget(store):
    r = row(0, "hello there")
    store.apply(VectorChangeSet(put_turns=[r], pooling=[TurnPooling(r.turn_id, unit_vector(5) * 3, 7)],
                                upsert_points=[point(r.turn_id, unit_vector(5)), point("other", unit_vector(6), conv="c2")]), {0: 1})
    got = store.pooling([r.turn_id, "missing"])
    assert set(got) == {r.turn_id} and got[r.turn_id].tokens == 7
    np.testing.assert_allclose(got[r.turn_id].mean, unit_vector(5) * 3, atol=1e-6)
    store.apply(VectorChangeSet(upsert_points=[point(r.turn_id, unit_vector(9))]), {0: 2})
    assert store.search("turn", unit_vector(9), Boundary("t1", ("c1",)), 1)[0].score > 0.999
    store.apply(VectorChangeSet(delete_points=[("turn", "other")]), {0: 3})
    assert store.search("turn", unit_vector(6), Boundary("t1", ("c2",)), 5) == []
    store.apply(VectorChangeSet(forgets=[Forget("t1", ForgetScope(level="conversation", conversation_id="c1"))]), {0: 4})
    assert store.search("turn", unit_vector(9), Boundary("t1"), 5) == []
    assert store.pooling([r.turn_id]) == {}
    assert store.session_turns("t1", "c1", "s1") == []


def test_versions_change_on_write_and_hold_within_a_read_scope(store):
    store.apply(VectorChangeSet(upsert_points=[point("p0", unit_vector(0))]), {0: 1})
    check_versions_pinned_by_read_scope(store, lambda: store.apply(VectorChangeSet(upsert_points=[point("p1", unit_vector(1))]), {0: 2}))


# -- forgetting -------------------------------------------------------------------------------
def _vec(name: str) -> np.ndarray:
    return unit_vector(int.from_bytes(name.encode()[-6:], "big") % 100_000)


def _unit_point(collection, point_id, members, owner) -> VectorPoint:
    v = np.mean([_vec(m.turn_id) for m in members], axis=0)
    return VectorPoint(collection, point_id, (v / np.linalg.norm(v)).astype(np.float32), members[0].tenant_id, members[0].conversation_id,
                       members[0].session_id, tuple(sorted({m.agent_id for m in members})), min(m.occurred_at for m in members),
                       max(m.occurred_at for m in members), owner)


def _session_change(change: VectorChangeSet, key, before, after, added) -> None:
    """The dense projection's rule: a new turn's pooling, turn and sentence points; windows and
    episodes pooled from their turns, upserted when they change, deleted when they go."""
    upserts, deletes = diff_units(units(before), units(after))
    by_id = {t.turn_id: t for t in after}
    for t in added:
        change.pooling.append(TurnPooling(t.turn_id, _vec(t.turn_id) * 3, 5))
        change.upsert_points.append(_unit_point("turn", t.turn_id, [t], t.turn_id))
        change.upsert_points.append(_unit_point("sentence", sentence_id(t.turn_id, 0), [t], t.turn_id))
    for u in upserts:
        if u.kind != "turn":
            change.upsert_points.append(_unit_point(u.kind, u.unit_id, [by_id[m] for m in u.turn_ids], u.unit_id))
    for uid in deletes:
        if uid.startswith("t_"):
            change.delete_points += [("turn", uid), ("sentence", sentence_id(uid, 0))]
        else:
            change.delete_points.append(("window" if uid.startswith("w_") else "episode", uid))


MODEL = forgetting.Model(VectorChangeSet, _session_change)


def _reference(request, tmp_path):
    def make():
        ref = ADAPTERS[request.node.callspec.params["store"]](request, tmp_path / "ref")
        request.addfinalizer(ref.close)
        return ref

    return make


@pytest.mark.parametrize("scope", sorted(forgetting.SCOPES))
def test_forget_removes_exactly_what_the_scope_covers(store, request, tmp_path, scope):
    forgetting.check_scope(store, _reference(request, tmp_path), MODEL, scope)
    kept = {t.turn_id for r in forgetting.dataset() for t in store.session_turns(*r.session_key)}
    assert store.pooling(sorted({r.turn_id for r in forgetting.dataset()})).keys() == kept


def test_forget_erases_every_byte_of_the_forgotten_turns(store, request, tmp_path):
    name = request.node.callspec.params["store"]
    root = forgetting.data_dir(SERVER_DATA[name]) if name in SERVER_DATA else tmp_path
    if name in KEEPS_PLAINTEXT:
        got = forgetting.check_canary(store, root, _reference(request, tmp_path), MODEL, keeps_plaintext=True)
        print(f"dense/{name}: canaries seen before in {got['seen_before']}; erased after {got['erasure_seconds']:.1f} s")
        return
    from qdrant_client import models

    from schemas.ports.keystore import EventRef

    tokens: dict[str, tuple] = {}

    def probe(token: str) -> None:  # a plain payload, as the ledger's text would be if it were not sealed
        store._qd().upsert(store.ledger, [models.PointStruct(id=store_point("probe"), vector={}, payload={
            "type": "probe", "text": f"A probe of what Qdrant keeps in its files: {token} in plain text."})], wait=True)

    def destroy_keys_first(rows, turn_scope) -> None:
        """The eraser may destroy the forgotten turns' keys before the view applies the forget:
        the sealed copies open to nothing, and the forget still completes."""
        for p in store._scroll(store.ledger, models.Filter(must=[models.FieldCondition(key="type", match=models.MatchValue(value="turn"))])):
            assert set(p.payload) >= {"sealed"} and not {"text", "speaker", "source_ref"} & set(p.payload)
            tokens[p.payload["event_id"] + "@" + p.payload["conversation_id"]] = (p.payload["tenant_id"], p.payload["conversation_id"],
                                                                                  p.payload["event_id"], p.payload["sealed"])
        forgotten = [r for r in rows if r.turn_id in forgetting.covered(turn_scope, rows)]
        store.sealer.keystore.destroy([EventRef(r.tenant_id, r.conversation_id, r.event_id) for r in forgotten], "contract-test")
        [(t, c, e, _)] = [tokens[f"{r.event_id}@{r.conversation_id}"] for r in forgotten]
        assert [x.text for x in store.session_turns(t, c, "s1") if x.event_id == e] == [""]  # still in the ledger, unreadable

    from infra.qdrant_base import point_uuid as store_point

    got = forgetting.check_canary(store, root, _reference(request, tmp_path), MODEL, keeps_plaintext=False, probe=probe,
                                  between=destroy_keys_first)
    # A copy of the ledger taken before the forget: nothing of the forgotten turns opens any more.
    store.sealer.keystore.destroy([EventRef("t1", "c3", f"c3-s1-{i}") for i in range(5)], "contract-test")
    opened = dict(zip(tokens, store.sealer.open_many(tokens.values())))
    assert {k for k, v in opened.items() if v is None} == {"c1-s1-2@c1", *(f"c3-s1-{i}@c3" for i in range(5))}
    assert all(v is not None and "canary" not in v for v in opened.values() if v is not None)
    print(f"dense/{name}: no plaintext ever; erased after {got['erasure_seconds']:.1f} s")


# -- the bounded query path's reads -------------------------------------------------------------
def _ranked(store, collection, q, b) -> tuple[list[int], dict[int, float]]:
    """score_units' answer as a ranking (best first, ties by key) and key -> score."""
    keys, scores = store.score_units(collection, q, b)
    order = np.lexsort((keys, -scores))
    return keys[order].tolist(), dict(zip(keys.tolist(), scores.tolist()))


def _check_nearest(store, collection, q, b, limit) -> None:
    keys, scores = store.nearest(collection, q, b, limit)
    assert keys.dtype == np.int64 and len(keys) == len(scores)
    ranking, score = _ranked(store, collection, q, b)
    assert keys.tolist() == ranking[:limit], (collection, b, limit)
    assert scores.tolist() == pytest.approx([score[k] for k in keys.tolist()], abs=1e-5)


def _bounded_points(tenant: str, seed: int = 0) -> list[VectorPoint]:
    """c1: s1 (agents a1/a2 by turn, every 10 min) and s2 (+100 min); c2; a window and a sentence."""
    out = [point(f"{tenant}-c1-s1-{i}", unit_vector(seed + i), tenant=tenant, agents=("a1",) if i % 2 else ("a2",),
                 minutes=10 * i) for i in range(6)]
    out += [point(f"{tenant}-c1-s2-{i}", unit_vector(seed + 10 + i), tenant=tenant, session="s2", minutes=100 + i)
            for i in range(4)]
    out += [point(f"{tenant}-c2-s1-{i}", unit_vector(seed + 20 + i), tenant=tenant, conv="c2", agents=("a1", "a3"),
                  minutes=i) for i in range(3)]
    out += [point(f"{tenant}-w", unit_vector(seed + 30), tenant=tenant, collection="window"),
            point(f"{tenant}-c1-s1-0.s0", unit_vector(seed + 31), tenant=tenant, collection="sentence")]
    return out


BOUNDED = [Boundary("t1"), Boundary("t1", ("c1",)), Boundary("t1", ("c1",), ("s2",)),
           Boundary("t1", agent_ids=("a2", "a3")),
           Boundary("t1", ("c1", "c2"), since=T0 + timedelta(minutes=2), until=T0 + timedelta(minutes=100)),
           Boundary("t1", ("c9",))]


def test_nearest_is_score_units_best_first_inside_the_boundary(store):
    """nearest = score_units' ranking cut at `limit` (exact on a scope this small), for every
    part of a boundary; another tenant's points, the best ones included, never come back."""
    store.apply(VectorChangeSet(upsert_points=_bounded_points("t1") + _bounded_points("t2", seed=100)), {0: 1})
    theirs = {unit_key(p.point_id) for p in _bounded_points("t2", seed=100)}
    for q in (unit_vector(3), unit_vector(103)):  # t1's point 3; t2's point 3
        for b in BOUNDED:
            for limit in (1, 4, 100):
                _check_nearest(store, "turn", q, b, limit)
                assert not theirs & set(store.nearest("turn", q, b, limit)[0].tolist())
            assert len(store.nearest("turn", q, b, 0)[0]) == 0
        _check_nearest(store, "window", q, Boundary("t1"), 5)
    assert store.nearest("turn", unit_vector(3), Boundary("t1", ("c1",)), 1)[0].tolist() == [unit_key("t1-c1-s1-3")]
    assert len(store.nearest("episode", unit_vector(3), Boundary("t1"), 5)[0]) == 0  # a collection nobody wrote to


def test_nearest_in_a_boundary_of_no_conversations_is_empty(store, request):
    store.apply(VectorChangeSet(upsert_points=[p for p in _bounded_points("t1") if p.collection == "turn"]), {0: 1})
    b = Boundary("t1", ())
    assert len(store.score_units("turn", unit_vector(3), b)[0]) == 0
    assert len(store.nearest("turn", unit_vector(3), b, 5)[0]) == 0


def test_score_points_equals_score_units_for_the_named_points(store):
    """Each named point of the boundary's tenant with score_units' score; another tenant's, unknown
    ids and ids of another collection are left out."""
    store.apply(VectorChangeSet(upsert_points=_bounded_points("t1") + _bounded_points("t2", seed=100)), {0: 1})
    q = unit_vector(7)
    for collection, named in (("turn", ["t1-c1-s1-1", "t1-c1-s2-3", "t1-c2-s1-0", "t2-c1-s1-1", "t1-w", "nothing"]),
                              ("window", ["t1-w", "t2-w", "t1-c1-s1-1"]),
                              ("sentence", ["t1-c1-s1-0.s0", "t2-c1-s1-0.s0"]), ("episode", ["t1-w"])):
        _, score = _ranked(store, collection, q, Boundary("t1"))
        want = {p: score[unit_key(p)] for p in named if unit_key(p) in score}
        got = store.score_points(collection, q, Boundary("t1", ("c1",)), named)
        assert got == pytest.approx(want, abs=1e-5), collection
    assert set(store.score_points("turn", q, Boundary("t1", ("c1",)), ["t1-c2-s1-0"])) == {"t1-c2-s1-0"}  # the tenant's
    assert store.score_points("turn", q, Boundary("t1"), []) == {}




@pytest.mark.parametrize("collections", [("turn", "window"), ("sentence",)], ids=["units", "sentences"])
def test_nearest_and_score_points_see_every_write_and_forget(store, request, collections):
    """A write, a replacement, a delete and a forget applied before the call are seen by the next
    read, also when the scope was read (and possibly kept) before."""
    for collection in collections:
        _see_every_write_and_forget(store, collection)


def _see_every_write_and_forget(store, collection) -> None:
    b, q = Boundary("t1", ("c1",)), unit_vector(42)
    mine = [point(f"p{i}", unit_vector(i), collection=collection, minutes=i) for i in range(5)]
    store.apply(VectorChangeSet(upsert_points=mine), {0: 1})
    _check_nearest(store, collection, q, b, 3)  # the scope is read (and may be kept from now on)
    store.apply(VectorChangeSet(upsert_points=[point("late", q, collection=collection),
                                               point("p1", -q, collection=collection)]), {0: 2})
    assert store.nearest(collection, q, b, 1)[0].tolist() == [unit_key("late")]
    assert store.score_points(collection, q, b, ["late", "p1"]) == pytest.approx({"late": 1.0, "p1": -1.0}, abs=1e-5)
    _check_nearest(store, collection, q, b, 10)
    store.apply(VectorChangeSet(delete_points=[(collection, "late")]), {0: 3})
    assert unit_key("late") not in store.nearest(collection, q, b, 10)[0].tolist()
    assert store.score_points(collection, q, b, ["late", "p2"]).keys() == {"p2"}
    _check_nearest(store, collection, q, b, 10)
    store.apply(VectorChangeSet(forgets=[Forget("t1", ForgetScope(level="conversation", conversation_id="c1"))]),
                {0: 4})
    assert len(store.nearest(collection, q, b, 10)[0]) == 0
    assert len(store.nearest(collection, q, Boundary("t1"), 10)[0]) == 0
    assert store.score_points(collection, q, b, [p.point_id for p in mine]) == {}


def test_bounded_reads_follow_partial_forgets(store):
    """A turn's forget takes its turn and sentence points out and re-cuts its session's windows
    (the projection's rule): nearest and score_points agree with score_units before and after."""
    rows = forgetting.dataset()
    forgetting.write(store, MODEL, rows)

    def check():
        for b in (Boundary("t1"), Boundary("t1", ("c1",), ("s1",)), Boundary("t2", agent_ids=("a2",))):
            for collection in ("turn", "window", "episode"):
                _check_nearest(store, collection, _vec("query"), b, 5)
            _, score = _ranked(store, "sentence", _vec("query"), Boundary(b.tenant_id))
            named = [sentence_id(r.turn_id, 0) for r in rows]
            assert store.score_points("sentence", _vec("query"), b, named) == pytest.approx(
                {s: score[unit_key(s)] for s in named if unit_key(s) in score}, abs=1e-5)

    check()
    scope = forgetting.SCOPES["turn"]
    gone = forgetting.covered(scope, rows)
    forgetting.forget(store, MODEL, scope)
    check()
    keys = {unit_key(t) for t in gone} | {unit_key(sentence_id(t, 0)) for t in gone}
    assert not keys & set(store.nearest("turn", _vec("query"), Boundary("t1"), 100)[0].tolist())
    assert store.score_points("turn", _vec("query"), Boundary("t1"), sorted(gone)) == {}
