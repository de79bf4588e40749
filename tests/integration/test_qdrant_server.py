"""What only a real Qdrant server shows: its errors over gRPC and REST, API keys, writers that
share a view generation, and acknowledged writes surviving a SIGKILL of the server.

The contract suites run every VectorStore/ViewCatalog behaviour against this server too
(tests/contracts); these are the server-only behaviours the adapter had to be fixed for."""

from __future__ import annotations

import threading
import time
import uuid

import numpy as np
import pytest

from infra.registry import Registry
from infra.settings import Settings
from infra.vectors.qdrant import QdrantVectorStore
from schemas.errors import StoreError, TransientError
from schemas.ports.vectors import VectorChangeSet
from schemas.ports.views import Boundary
from tests.contracts.builders import sealer, unit_vector
from tests.contracts.test_vector_contract import point
from tests.integration import servers

pytestmark = pytest.mark.integration


def client_for(url: str, *, grpc: bool, api_key: str | None = None):
    view_url = servers.qdrant_view_url(url, "unused", grpc=grpc)
    return Registry(Settings.load(views={"dense_url": view_url, "qdrant_api_key": api_key}))._qdrant(view_url)


@pytest.mark.parametrize("grpc", [True, False], ids=["grpc", "rest"])
def test_a_server_that_is_down_is_a_transient_error_naming_it(grpc, tmp_path):
    http, grpc_port = servers.free_ports(2)
    store = QdrantVectorStore(client_for(f"http://127.0.0.1:{http}?grpc_port={grpc_port}", grpc=grpc), "down", 1, sealer=sealer(tmp_path))
    with pytest.raises(TransientError, match=f"127.0.0.1:{http}.*retried"):
        store.positions()


@pytest.mark.parametrize("grpc", [True, False], ids=["grpc", "rest"])
def test_refusals_are_store_errors_that_say_what_to_check(qdrant_url, grpc, tmp_path):
    prefix = f"refuse{uuid.uuid4().hex[:8]}"
    store = QdrantVectorStore(client_for(qdrant_url, grpc=grpc), prefix, 1, sealer=sealer(tmp_path))
    try:
        store.apply(VectorChangeSet(upsert_points=[point("a", unit_vector(1, dim=16))]), {0: 1})
        with pytest.raises(StoreError, match="refused.*dimension"):  # the collection is 16-d
            store.apply(VectorChangeSet(upsert_points=[point("b", unit_vector(1, dim=8))]), {0: 2})
        assert store.positions() == {0: 1}  # a refused change set moves no position
    finally:
        servers.drop_qdrant_prefix(qdrant_url, prefix)


def test_api_key_is_required_and_never_echoed(tmp_path):
    secret = f"qk-{uuid.uuid4().hex}"
    with servers.private_qdrant(api_key=secret) as (url, _, _):
        for grpc in (True, False):
            good = QdrantVectorStore(client_for(url, grpc=grpc, api_key=secret), f"k{int(grpc)}", 1, sealer=sealer(tmp_path))
            good.apply(VectorChangeSet(upsert_points=[point("a", unit_vector(1))]), {0: 1})
            assert good.positions() == {0: 1}
            wrong = "qk-wrong-" + uuid.uuid4().hex
            for key in (None, wrong):
                store = QdrantVectorStore(client_for(url, grpc=grpc, api_key=key), f"k{int(grpc)}", 1, sealer=sealer(tmp_path))
                with pytest.raises(StoreError, match="MEMSTREAM_VIEWS_QDRANT_API_KEY") as caught:
                    store.positions()
                assert secret not in str(caught.value) and wrong not in str(caught.value)


def test_writers_sharing_a_generation_race_without_errors_or_lost_positions(qdrant_url, tmp_path):
    """Workers of one consumer group write one generation, each its own partitions: both may
    create the same collections at once, and neither may overwrite the other's positions."""
    prefix = f"race{uuid.uuid4().hex[:8]}"
    writers = [QdrantVectorStore(client_for(qdrant_url, grpc=True), prefix, 1, sealer=sealer(tmp_path)) for _ in range(4)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(writers))

    def write(n: int, store: QdrantVectorStore):
        try:
            barrier.wait()
            for step in range(1, 6):
                pts = [point(f"w{n}-{step}-{i}", unit_vector(100 * n + 10 * step + i), conv=f"c{n}") for i in range(3)]
                store.apply(VectorChangeSet(upsert_points=pts), {n: step * 3})
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n, s)) for n, s in enumerate(writers)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert writers[0].positions() == {n: 15 for n in range(len(writers))}
        for n in range(len(writers)):
            hits = writers[0].search("turn", unit_vector(100 * n + 11), Boundary("t1", (f"c{n}",)), 100)
            assert len(hits) == 15 and hits[0].unit_id == f"w{n}-1-1"
    finally:
        servers.drop_qdrant_prefix(qdrant_url, prefix)


@pytest.mark.parametrize("grpc", [True, False], ids=["grpc", "rest"])
def test_acknowledged_writes_survive_a_sigkill_and_the_client_reconnects_by_itself(grpc, tmp_path):
    with servers.private_qdrant() as (url, state, env):
        store = QdrantVectorStore(client_for(url, grpc=grpc), "crash", 1, sealer=sealer(tmp_path))
        vectors = {f"p{i}": unit_vector(i) for i in range(50)}
        store.apply(VectorChangeSet(upsert_points=[point(k, v) for k, v in vectors.items()]), {0: 50})
        servers.kill_qdrant(state)
        with pytest.raises(TransientError):
            store.positions()
        servers.start_qdrant(state, env)
        # The same store (and client) works again within a few reconnection attempts.
        deadline = time.monotonic() + 5
        while True:
            try:
                positions = store.positions()
                break
            except TransientError:
                assert time.monotonic() < deadline, "the client did not reconnect within 5 s of the server being healthy"
                time.sleep(0.2)
        assert positions == {0: 50}
        got = store.vectors("turn", "t1", list(vectors))
        assert set(got) == set(vectors)
        for k, v in vectors.items():
            np.testing.assert_allclose(got[k], v, atol=1e-6)
