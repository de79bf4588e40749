"""Export straight from the embedded log and key store (services/export.py), without views or
models: what a forget covers is left out whether the eraser has reached it or not, a plain
record with a tombstone is left out, a copy of an event goes out once, another tenant's and
another conversation's turns never."""

from __future__ import annotations

import asyncio
from datetime import timezone

import pytest

from infra.keystore.sqlite import SqliteKeyStore
from infra.log.sqlite import SqliteEventLog
from schemas.events import ForgetRequested, ForgetScope, encode_event, partition_key
from schemas.ports.event_log import NewRecord, default_partition
from schemas.ports.keystore import EventRef
from services.export import export_turns
from streams.eraser import EraserRunner
from streams.ingest import Publisher
from tests.conftest import T0, turn

pytestmark = pytest.mark.unit
TOPIC = "x.events"


def forget(event_id: str, scope: ForgetScope, tenant: str = "acme") -> ForgetRequested:
    return ForgetRequested(event_id=event_id, tenant_id=tenant, scope=scope, requested_at=T0.astimezone(timezone.utc))


def test_export_leaves_out_what_is_forgotten_applied_or_not(tmp_path):
    async def run():
        log = SqliteEventLog(tmp_path / "log.sqlite")
        await log.start()
        await log.ensure_topic(TOPIC, 4)
        keystore = SqliteKeyStore(tmp_path / "keys.sqlite")
        keystore.start()
        try:
            publisher = Publisher(log, TOPIC, keystore=keystore)
            a = [turn(i, conv="a", tenant="acme") for i in range(6)]
            b = [turn(i, conv="b", tenant="acme", session="s2") for i in range(4)]
            await publisher.publish(a + b + [turn(0, conv="a", tenant="other"), a[1]])  # another tenant; a[1] twice
            # A plain turn a foreign producer wrote straight to the event topic, then forgotten by id (a tombstone, no key).
            plain = turn(7, conv="a", tenant="acme")
            await log.append(TOPIC, [NewRecord(partition_key("acme", "a"), encode_event(plain))])
            await asyncio.to_thread(keystore.destroy, [EventRef("acme", "a", plain.event_id)], "forget-by-hand")
            # Applied by the eraser: a[0]. Not applied yet (the eraser never runs again): a[2] and session s2 of b.
            await publisher.publish([forget("f-applied", ForgetScope(level="turn", conversation_id="a", event_id=a[0].event_id))])
            await EraserRunner(log, TOPIC, keystore).run_until(await log.end_offsets(TOPIC))
            await publisher.publish([forget("f-pending", ForgetScope(level="turn", conversation_id="a", event_id=a[2].event_id)),
                                     forget("f-session", ForgetScope(level="session", conversation_id="b", session_id="s2"))])
            late = turn(3, conv="b", tenant="acme", session="s2", event_id="b-after-the-forget")  # published after: new memory
            await publisher.publish([late])
            everything = [e async for e in export_turns(log, TOPIC, keystore, "acme")]
            only_a = [e async for e in export_turns(log, TOPIC, keystore, "acme", "a")]
            other = [e async for e in export_turns(log, TOPIC, keystore, "other")]
            return a, b, late, everything, only_a, other
        finally:
            keystore.close()
            await log.close()

    a, b, late, everything, only_a, other = asyncio.run(run())
    kept_a = [a[1], a[3], a[4], a[5]]
    partitions = {c: default_partition(partition_key("acme", c), 4) for c in ("a", "b")}
    by_partition = sorted([("a", e) for e in kept_a] + [("b", late)], key=lambda x: partitions[x[0]])
    assert [e.event_id for e in everything] == [e.event_id for _, e in by_partition]
    assert everything == [e for _, e in by_partition], "the raw events, each once, in log order"
    assert only_a == kept_a
    assert [e.tenant_id for e in other] == ["other"]
