"""Contract of the data key store port (crypto-shredding), run against every adapter: keys are
stored once (first wins), destroyed into tombstones that never come back, and a destroyed
secret's bytes leave every file of the store — at once embedded, within the adapter's stated
bound on OpenSearch (scanned in the server's data directory, byte by byte)."""

from __future__ import annotations

import base64
import time
import uuid
from pathlib import Path

import pytest

from schemas.ports.keystore import DataKey, EventRef, key_id
from schemas.sealing import new_secret

pytestmark = pytest.mark.contract


def _sqlite(request, tmp_path):
    from infra.keystore.sqlite import SqliteKeyStore

    store = SqliteKeyStore(tmp_path / "keys.sqlite")
    store.data_dir = tmp_path
    return store


def _opensearch(request, tmp_path):
    from opensearchpy import OpenSearch

    from infra.keystore.opensearch import OpenSearchKeyStore
    from tests.integration.servers import server_data_dir

    url, prefix = request.getfixturevalue("opensearch_url"), f"contract-{uuid.uuid4().hex[:10]}"
    store = OpenSearchKeyStore(url, prefix)
    store.data_dir = server_data_dir("opensearch")

    def cleanup():
        store.close()
        client = OpenSearch(hosts=[url])
        client.indices.delete(index=f"{prefix}-datakeys", ignore=[404])
        client.close()

    request.addfinalizer(cleanup)
    return store


ADAPTERS = {"sqlite": _sqlite, "opensearch": _opensearch}


@pytest.fixture(params=[pytest.param(n, marks=pytest.mark.integration) if n == "opensearch" else n for n in sorted(ADAPTERS)])
def store(request, tmp_path):
    s = ADAPTERS[request.param](request, tmp_path)
    s.start()
    yield s
    if request.param == "sqlite":
        s.close()


def key(tenant="t1", conv="c1", event="e1") -> DataKey:
    return DataKey(key_id(tenant, conv, event), tenant, conv, event, new_secret())


def test_keys_are_stored_once_and_the_first_secret_wins(store):
    a = key()
    assert store.put([a])[a.key_id].secret == a.secret
    assert store.put([key()])[a.key_id].secret == a.secret  # a second publish of the event reuses its key
    b = key(event="e2")
    got = store.get([a.key_id, b.key_id, "k_unknown"])
    assert set(got) == {a.key_id} and got[a.key_id].tenant_id == "t1"
    assert store.put([a, b]).keys() == {a.key_id, b.key_id}


def test_destroyed_keys_become_tombstones_for_ever(store):
    a, b, other = key(event="e1"), key(event="e2"), key(tenant="t2", event="e1")
    store.put([a, b, other])
    gone = store.destroy([EventRef("t1", "c1", "e1"), EventRef("t1", "c1", "never-keyed")], "forget-1", positions={0: 7})
    assert {t.event_id for t in gone} == {"e1", "never-keyed"} and all(t.forget_id == "forget-1" for t in gone)
    assert store.positions() == {0: 7}
    assert set(store.get([a.key_id, b.key_id, other.key_id])) == {b.key_id, other.key_id}  # other tenant, same ids: untouched
    assert set(store.destroyed([a.key_id, b.key_id, key_id("t1", "c1", "never-keyed")])) == {a.key_id, key_id("t1", "c1", "never-keyed")}
    assert store.put([key(event="e1")]) == {}  # never resurrected by a new put
    assert store.destroy([EventRef("t1", "c1", "e1")], "forget-2") == []  # not destroyed twice
    assert store.destroyed([a.key_id])[a.key_id].forget_id == "forget-1"
    assert [t.event_id for t in store.tombstones("t1")] == sorted(["e1", "never-keyed"], key=lambda e: key_id("t1", "c1", e))
    assert store.tombstones("t2") == []
    dump = store.canonical_dump()
    assert len(dump["keys"]) == 4 and "secret" not in str(dump)
    store.write_positions({1: 3})
    assert store.positions() == {0: 7, 1: 3}


def _files_hold(directory: Path, needles: list[bytes]) -> list[str]:
    out = []
    for f in directory.rglob("*"):
        if f.is_file():
            try:
                data = f.read_bytes()
            except OSError:
                continue
            out.extend(f"{f}: {n[:6]!r}…" for n in needles if n in data)
    return out


def test_a_destroyed_secret_leaves_no_byte_in_the_store_files(store):
    if getattr(store, "data_dir", None) is None:
        pytest.skip("INTEGRATION NOT RUN: the OpenSearch data directory is unknown (set MEMSTREAM_TEST_OPENSEARCH_DATA)")
    victims = [key(conv="victim", event=f"e{i}") for i in range(20)]
    keep = [key(conv="kept", event=f"e{i}") for i in range(20)]
    store.put(victims + keep)
    needles = [n for k in victims for n in (k.secret, base64.b64encode(k.secret))]
    deadline = time.monotonic() + 30
    while not _files_hold(store.data_dir, needles):  # the positive control: the scan sees the secrets first
        assert time.monotonic() < deadline, "the scan never saw the stored secrets: it could not prove their erasure"
        if hasattr(store, "_os"):
            store._os().indices.flush(index=store.index, force=True)
        time.sleep(0.5)
    store.destroy([EventRef(k.tenant_id, k.conversation_id, k.event_id) for k in victims], "forget-x")
    deadline = time.monotonic() + store.erasure_deferred_seconds + 30
    while found := _files_hold(store.data_dir, needles):
        assert time.monotonic() < deadline, f"destroyed secrets still on disk after {store.erasure_deferred_seconds}s + 30s: {found[:3]}"
        time.sleep(1.0)
    assert set(store.get([k.key_id for k in keep])) == {k.key_id for k in keep}
    kept = [n for k in keep for n in (k.secret,)]
    assert store.backend != "sqlite" or len(_files_hold(store.data_dir, kept)) > 0  # the rest is still there
