"""Contract of the VectorStore port (dense view), run against every adapter."""

from __future__ import annotations

import uuid
from datetime import timedelta

import numpy as np
import pytest

from schemas.events import ForgetScope
from schemas.ports.vectors import TurnPooling, VectorChangeSet, VectorPoint
from schemas.ports.views import Boundary, Forget
from tests.contracts.builders import T0, check_versions_pinned_by_read_scope, row, unit_vector

pytestmark = pytest.mark.contract


def _sqlite(request, tmp_path):
    from infra.vectors.sqlite import SqliteVectorStore

    return SqliteVectorStore(tmp_path / "vectors.sqlite", 1)


def _qdrant_local(request, tmp_path):
    from infra.vectors.qdrant import QdrantVectorStore

    # qdrant-client's local mode: the same client API in-process, on disk in the test's own
    # directory (the `qdrant+local://` option); the prefix keeps collection names unique anyway.
    return QdrantVectorStore(str(tmp_path / "qdrant"), f"contract-{uuid.uuid4().hex[:10]}", 1)


def _qdrant_server(request, tmp_path, *, grpc: bool):
    from infra.vectors.qdrant import QdrantVectorStore
    from tests.integration.servers import drop_qdrant_prefix, qdrant_test_client

    # The real server, shared by the session: a fresh prefix per test, its collections deleted after.
    client, prefix = qdrant_test_client(request.getfixturevalue("qdrant_url"), grpc=grpc), f"contract-{uuid.uuid4().hex[:10]}"
    request.addfinalizer(lambda: drop_qdrant_prefix(request.getfixturevalue("qdrant_url"), prefix))
    return QdrantVectorStore(client, prefix, 1)


ADAPTERS = {
    "sqlite": _sqlite, "qdrant-local": _qdrant_local,
    "qdrant-server-grpc": lambda r, t: _qdrant_server(r, t, grpc=True), "qdrant-server-rest": lambda r, t: _qdrant_server(r, t, grpc=False),
}
NEEDS_SERVER = {"qdrant-server-grpc", "qdrant-server-rest"}


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
