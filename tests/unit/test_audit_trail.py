"""The audit trail on the embedded log and key store (no models): the control records of
forgetting and their decoders, the trail folded from the control topic (keys, retention,
pause/resume, forget completions, exports) with its filters and cursor, and the eraser recording
one completion per forget and partition, at least once."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone

import pytest

from infra.keystore.sqlite import SqliteKeyStore
from infra.log.sqlite import SqliteEventLog
from schemas.control import ProjectionControl, control_topic, decode_control, encode_control
from schemas.errors import InvalidRequest
from schemas.events import ForgetRequested, ForgetScope
from schemas.forgetting import (
    ForgetCompleted,
    MemoryExported,
    TenantRetentionSet,
    decode_forgetting_record,
    encode_forgetting_record,
)
from schemas.ports.event_log import NewRecord
from schemas.security import KeyCreated, KeyRevoked, decode_key_record, encode_key_record
from schemas.errors import InvalidCursor
from services.audit import decode_cursor, encode_cursor
from streams.audit import RETENTION_REQUESTER, AuditTrail, CompletionRecorder, append_record
from streams.eraser import EraserRunner
from streams.ingest import Publisher
from tests.conftest import turn

pytestmark = pytest.mark.unit
TOPIC = "t.events"
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=timezone.utc)


def completion(forget_id: str, partition: int, *, tenant: str = "acme", partitions: int = 1, keys: int = 2,
               scope: ForgetScope | None = None, by: str | None = "key:0123456789abcdef", minutes: float = 1.0) -> ForgetCompleted:
    return ForgetCompleted(tenant_id=tenant, forget_id=forget_id, scope=scope or ForgetScope(level="conversation", conversation_id="c1"),
                           requested_by=by, requested_at=NOW, partition=partition, offset=10 + partition, partitions=partitions,
                           keys_destroyed=keys, records_erased=0, completed_at=NOW + timedelta(minutes=minutes))


async def open_log(tmp_path, partitions: int = 4) -> SqliteEventLog:
    log = SqliteEventLog(tmp_path / "log.sqlite")
    await log.start()
    await log.ensure_topic(TOPIC, partitions)
    await log.ensure_topic(control_topic(TOPIC), 1)
    return log


async def append_raw(log, value: bytes) -> None:
    await log.append(control_topic(TOPIC), [NewRecord(key="x", value=value, partition=0)])


def test_records_round_trip_and_each_decoder_ignores_the_others():
    records = [completion("forget-1", 0), TenantRetentionSet(tenant_id="acme", retain_days=30, by="cli:ops@host"),
               MemoryExported(tenant_id="acme", conversation_id="c1", turns=3, by="key:0123456789abcdef")]
    for r in records:
        assert decode_forgetting_record(encode_forgetting_record(r)) == r
        assert decode_key_record(encode_forgetting_record(r)) is None
        assert decode_control(encode_forgetting_record(r)) is None
    key = encode_key_record(KeyCreated(key_id="0123456789abcdef", role="admin", secret_sha256="0" * 64))
    pause = encode_control(ProjectionControl(type="ProjectionPaused", projection="dense"))
    deep = b"[" * 5000 + b"]" * 5000
    for foreign in (key, pause, deep, b"\xff\xfe", b"{}", b'{"type": "ForgetCompleted"}', b'{"type": ["ForgetCompleted"]}', b"null"):
        assert decode_forgetting_record(foreign) is None
    with pytest.raises(ValueError):
        TenantRetentionSet(tenant_id="acme", retain_days=-1)
    with pytest.raises(ValueError):
        TenantRetentionSet(tenant_id="Not A Tenant", retain_days=3)


def test_the_trail_folds_every_kind_of_record_and_pages_with_a_cursor(tmp_path):
    async def run():
        log = await open_log(tmp_path)
        try:
            await append_raw(log, encode_key_record(KeyCreated(key_id="00000000000000aa", tenant_id="acme", role="writer",
                                                               name="agent-7", secret_sha256="1" * 64, by="cli:ops@host")))
            await append_raw(log, b"not a record at all")
            await append_raw(log, encode_key_record(KeyRevoked(key_id="00000000000000aa", by="key:00000000000000ff")))
            await append_raw(log, encode_key_record(KeyRevoked(key_id="00000000000000bb")))  # never created: no entry
            await append_record(log, TOPIC, TenantRetentionSet(tenant_id="acme", retain_days=30, by="cli:ops@host"))
            await append_record(log, TOPIC, TenantRetentionSet(tenant_id="other", retain_days=7))
            await append_raw(log, encode_control(ProjectionControl(type="ProjectionPaused", projection="dense", reason="disk full",
                                                                   requested_by="key:00000000000000ff")))
            await append_record(log, TOPIC, completion("forget-a", 0, keys=3))
            await append_record(log, TOPIC, MemoryExported(tenant_id="acme", turns=12, by="key:00000000000000ff"))
            await append_record(log, TOPIC, TenantRetentionSet(tenant_id="other", retain_days=0))
            trail = AuditTrail(log, TOPIC)
            await trail.refresh()
            everything, end = trail.page(limit=1000)
            # Reading more later picks up only what is new.
            await append_record(log, TOPIC, completion("forget-b", 2, tenant="other", minutes=5))
            await trail.refresh()
            later, _ = trail.page(limit=1000)
            pages, cursor = [], None
            while True:
                page, after = trail.page(after=decode_cursor(cursor) if cursor else -1, limit=2)
                pages.append(page)
                if after is None:
                    break
                cursor = encode_cursor(after)
            return everything, end, later, pages, trail
        finally:
            await log.close()

    everything, end, later, pages, trail = asyncio.run(run())
    assert end is None
    kinds = [(e["kind"], e["action"], e["tenant_id"]) for e in everything]
    assert kinds == [("key", "created", "acme"), ("key", "revoked", "acme"), ("retention", "set", "acme"), ("retention", "set", "other"),
                     ("projection", "paused", None), ("forget", "forgot", "acme"), ("export", "exported", "acme"),
                     ("retention", "cleared", "other")]
    assert everything[1]["by"] == "key:00000000000000ff" and everything[1]["role"] == "writer"
    forget = everything[5]
    assert forget["forget_id"] == "forget-a" and forget["complete"] and forget["seconds"] == 60.0 and forget["keys_destroyed"] == 3
    assert forget["scope"] == {"level": "conversation", "conversation_id": "c1"} and forget["by"] == "key:0123456789abcdef"
    assert "disk full" not in json.dumps(everything), "free-text reasons are not part of the trail"
    assert [e["control_offset"] for e in later] == sorted(e["control_offset"] for e in later)
    assert [e["forget_id"] for e in later if e["kind"] == "forget"] == ["forget-a", "forget-b"]
    assert [e for p in pages for e in p] == later and all(len(p) <= 2 for p in pages) and len(pages) == 5
    assert set(trail.retention) == {"acme"} and trail.retention["acme"].retain_days == 30  # "other" was cleared
    acme, _ = trail.page(tenant_id="acme", limit=1000)
    assert {e["tenant_id"] for e in acme} == {"acme"} and len(acme) == 5
    since, _ = trail.page(since=NOW + timedelta(days=365 * 10), limit=1000)
    assert since == []
    assert trail.tenants() == ["acme", "other"]


def test_a_broadcast_forget_is_one_entry_and_a_repeated_completion_counts_once(tmp_path):
    scope = ForgetScope(level="tenant", occurred_before=NOW)

    async def run():
        log = await open_log(tmp_path)
        try:
            trail = AuditTrail(log, TOPIC)
            states = []
            for partition, keys in ((1, 4), (0, 2), (1, 0), (3, 1), (2, 5)):  # partition 1 completed twice (an eraser retry)
                await append_record(log, TOPIC, completion("forget-t", partition, partitions=4, keys=keys, scope=scope,
                                                           by=RETENTION_REQUESTER, minutes=partition + 1))
                await trail.refresh()
                [entry], _ = trail.page(limit=10)
                states.append((entry["partitions_complete"], entry["complete"], entry["keys_destroyed"]))
            return states, entry, trail
        finally:
            await log.close()

    states, entry, trail = asyncio.run(run())
    assert states == [(1, False, 4), (2, False, 6), (2, False, 6), (3, False, 7), (4, True, 12)]
    assert entry["completed_at"] == (NOW + timedelta(minutes=4)).isoformat() and entry["seconds"] == 240.0  # the last partition's
    assert trail.last_sweep["acme"]["forget_id"] == "forget-t"


@pytest.mark.parametrize("cursor", ["", "!!!", "bm90IGpzb24", encode_cursor(3)[:-2], "eyJhZnRlciI6IC0xfQ", "eyJhZnRlciI6dHJ1ZX0"])
def test_a_cursor_that_was_not_handed_out_is_refused(cursor):
    with pytest.raises(InvalidCursor):
        decode_cursor(cursor)
    assert decode_cursor(encode_cursor(41)) == 41


def test_the_eraser_records_one_completion_per_forget_and_partition_at_least_once(tmp_path):
    """A tenant forget over 4 partitions: 4 ForgetCompleted records, the keys of every turn before
    it destroyed; a recorder that fails once (after appending) makes the eraser repeat that
    forget, and the trail still counts each partition once."""

    async def run():
        log = await open_log(tmp_path)
        keystore = SqliteKeyStore(tmp_path / "keys.sqlite")
        keystore.start()
        try:
            publisher = Publisher(log, TOPIC, keystore=keystore)
            turns = [turn(i, conv=f"c{i % 5}", tenant="acme") for i in range(20)] + [turn(0, conv="c0", tenant="kept")]
            await publisher.publish(turns)
            forget = ForgetRequested(event_id="forget-all", tenant_id="acme", scope=ForgetScope(level="tenant"), requested_at=NOW,
                                     requested_by="cli:ops@host", reason="the customer left; nothing else here")
            await publisher.publish([forget])
            recorder, failures = CompletionRecorder(log, TOPIC), []

            async def flaky(erasure):
                await recorder(erasure)
                if not failures:
                    failures.append(erasure.partition)
                    raise RuntimeError("crash after the completion was appended")

            eraser = EraserRunner(log, TOPIC, keystore, on_erased=flaky)
            end = await log.end_offsets(TOPIC)
            with pytest.raises(RuntimeError):
                await eraser.step()
            positions_after_failure = dict(keystore.positions())
            await eraser.run_until(end)
            raw = [decode_forgetting_record(r.value) for r in await log.read(control_topic(TOPIC), 0, 0, max_records=100)]
            trail = AuditTrail(log, TOPIC)
            await trail.refresh()
            entries, _ = trail.page(limit=10)
            return failures, positions_after_failure, raw, entries
        finally:
            keystore.close()
            await log.close()

    failures, positions_after_failure, raw, entries = asyncio.run(run())
    [failed] = failures
    assert positions_after_failure.get(failed, 0) == 0, "the position must not pass a forget whose completion was not acknowledged"
    assert all(isinstance(r, ForgetCompleted) for r in raw)
    assert sorted(r.partition for r in raw) == sorted([0, 1, 2, 3] + [failed])  # the failed one twice: at least once
    first, repeated = [r.keys_destroyed for r in raw if r.partition == failed]
    assert first > 0 and repeated == 0, "the repeat destroys nothing new"
    assert sum(r.keys_destroyed for r in raw) == 20
    [entry] = entries
    assert entry["kind"] == "forget" and entry["complete"] and entry["partitions"] == 4 and entry["partitions_complete"] == 4
    assert entry["keys_destroyed"] == 20 and entry["by"] == "cli:ops@host" and entry["scope"] == {"level": "tenant"}
    assert "customer left" not in json.dumps(entries) and all("customer left" not in r.model_dump_json() for r in raw)
