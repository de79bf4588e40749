"""Small builders for contract tests: turn rows and the units/docs/points derived from them."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import numpy as np

from schemas.ports.views import TurnRow, content_hash, read_scope
from schemas.units import HierarchyPolicy, turn_unit_id
from streams.segmentation import session_units

T0 = datetime(2025, 3, 1, 10, 0, tzinfo=timezone.utc)
POLICY = HierarchyPolicy(window_sizes=(3,), window_stride=2)


def row(i: int, text: str, *, tenant="t1", conv="c1", session="s1", agent="a1", speaker="Ann", partition=0, minutes=None) -> TurnRow:
    event_id = f"{conv}-{session}-{i}"
    return TurnRow(
        turn_id=turn_unit_id(tenant, conv, event_id), tenant_id=tenant, conversation_id=conv, session_id=session, event_id=event_id,
        agent_id=agent, speaker=speaker, role="user", turn_index=i, occurred_at=T0 + timedelta(minutes=i if minutes is None else minutes),
        text=text, source_ref=f"D1:{i}", partition=partition, offset=i, content_hash=content_hash(tenant, conv, event_id, text),
    )


def units(rows: list[TurnRow]):
    return session_units(rows, POLICY)


def sealer(directory):
    """A TextSealer over an embedded data key store in `directory`: what the registry gives the
    stores that keep no plaintext (Qdrant)."""
    from infra.keystore.sqlite import SqliteKeyStore
    from schemas.sealing import KeyStoreSealer

    return KeyStoreSealer(SqliteKeyStore(directory / "keys.sqlite"))


def unit_vector(seed: int, dim: int = 16) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


def check_versions_pinned_by_read_scope(store, write) -> None:
    """ViewStore contract: a write changes the conversation's version; inside one `read_scope`
    (one query) the version first read stays, so a query's stages see one version."""
    before = store.conversation_version("t1", "c1")
    with read_scope():
        assert store.conversation_version("t1", "c1") == before
        write()
        assert store.conversation_version("t1", "c1") == before
        assert store.conversation_version("t1", None) == store.conversation_version("t1", None)
    after = store.conversation_version("t1", "c1")
    assert after != before
    with read_scope():
        assert store.conversation_version("t1", "c1") == after


def check_concurrent_reads(store, adapter: str, needs_server: set[str], reads: dict) -> None:
    """ViewStore contract: `remote` says whether reads are round trips to a server (the server
    adapters, and only they), and a store's reads may be called from several threads at once —
    the query service overlaps a query's independent reads on a server, and serves queries from
    several threads — each answering as it does alone. `reads`: name -> a read returning
    something comparable with ==."""
    assert store.remote is (adapter in needs_server)
    alone = {name: read() for name, read in reads.items()}

    def in_scope(read):
        with read_scope():  # as in a query: a read scope per thread's request
            return read()

    names = [name for name in reads for _ in range(6)]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda name: (name, in_scope(reads[name])), names))
    for name, value in together:
        assert value == alone[name], name
