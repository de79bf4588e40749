"""Keys, the key ring's folding of key records, rate limits, and the edge's JSON rules."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone

import pytest

from schemas.security import KeyCreated, KeyRevoked, KeyRotated, decode_key_record, digest, encode_key_record, parse_token, token
from services.auth import TokenBuckets, tenant_for
from services.http_guard import MAX_DEPTH, UnsafeJSON, parse_body
from schemas.errors import Forbidden
from schemas.security import Principal
from streams.keys import KeyRing

pytestmark = pytest.mark.unit


class MemoryLog:
    """Just enough of the event log port for a key ring: one topic, one partition, in order."""

    def __init__(self):
        self.records: list[bytes] = []

    async def ensure_topic(self, topic, partitions):
        return 1

    async def end_offsets(self, topic):
        return {0: len(self.records)}

    async def read(self, topic, partition, offset, max_records=500, max_wait=0.0):
        from schemas.ports.event_log import LogRecord

        return [LogRecord(topic, 0, i, None, v, 0.0) for i, v in enumerate(self.records) if i >= offset][:max_records]

    async def append(self, topic, records):
        from schemas.ports.event_log import Appended

        out = []
        for r in records:
            self.records.append(r.value)
            out.append(Appended(topic, 0, len(self.records) - 1, 0.0))
        return out


def test_tokens_parse_and_malformed_ones_do_not():
    t = token("0123456789abcdef", "A" * 43)
    assert parse_token(t) == ("0123456789abcdef", "A" * 43)
    for bad in ("", "msk_", t[:-1], t + "x", t.replace("msk_", "ms_"), "Bearer " + t, "msk_0123456789ABCDEF_" + "A" * 43):
        assert parse_token(bad) is None


def test_key_records_round_trip_and_foreign_records_are_ignored():
    rec = KeyCreated(key_id="0123456789abcdef", tenant_id="t1", role="writer", secret_sha256=digest("s"))
    assert decode_key_record(encode_key_record(rec)) == rec
    for foreign in (b"not json", b"[]", b'{"type": "ProjectionPaused", "projection": "graph"}', b'{"type": "KeyCreated"}', b"\xff"):
        assert decode_key_record(foreign) is None
    with pytest.raises(ValueError):
        KeyCreated(key_id="0123456789abcdef", tenant_id=None, role="writer", secret_sha256=digest("s"))
    with pytest.raises(ValueError):
        KeyCreated(key_id="0123456789abcdef", tenant_id="t1", role="admin", secret_sha256=digest("s"))


def test_the_ring_follows_create_revoke_and_rotate_with_its_grace_period():
    async def run():
        log = MemoryLog()
        ring = KeyRing(log, "t", refresh_seconds=0)
        await ring.append(KeyCreated(key_id="a" * 16, tenant_id="t1", role="reader", secret_sha256=digest("one" * 15)))
        assert (await ring.authenticate(token("a" * 16, "one" * 15 + "xx"))) is None  # not the secret
        key = token("a" * 16, ("one" * 15)[:43])
        await ring.append(KeyCreated(key_id="b" * 16, tenant_id="t2", role="writer", secret_sha256=digest(("one" * 15)[:43])))
        who = await ring.authenticate(token("b" * 16, ("one" * 15)[:43]))
        assert who is not None and who.tenant_id == "t2" and who.role == "writer"
        assert await ring.authenticate(key) is None  # key a's secret is "one"*15, not its prefix
        # rotation: the new secret works at once, the old one until the grace period ends
        new, old = "n" * 43, ("one" * 15)[:43]
        await ring.append(KeyRotated(key_id="b" * 16, secret_sha256=digest(new), previous_valid_until=datetime.now(timezone.utc) + timedelta(hours=1)))
        assert await ring.authenticate(token("b" * 16, new)) is not None
        assert await ring.authenticate(token("b" * 16, old)) is not None
        await ring.append(KeyRotated(key_id="b" * 16, secret_sha256=digest("m" * 43), previous_valid_until=datetime.now(timezone.utc) - timedelta(seconds=1)))
        assert await ring.authenticate(token("b" * 16, new)) is None  # grace over at once
        assert await ring.authenticate(token("b" * 16, old)) is None  # two rotations ago: gone
        assert await ring.authenticate(token("b" * 16, "m" * 43)) is not None
        await ring.append(KeyRevoked(key_id="b" * 16))
        assert await ring.authenticate(token("b" * 16, "m" * 43)) is None
        assert [k["active"] for k in ring.listing()] == [True, False]
        # a second ring reading the same log from scratch agrees
        again = KeyRing(log, "t", refresh_seconds=0)
        await again.refresh(force=True)
        assert again.listing() == ring.listing()

    asyncio.run(run())


def test_a_key_change_is_enforced_within_the_refresh_bound():
    async def run():
        log = MemoryLog()
        writer, other = KeyRing(log, "t", refresh_seconds=0.05), KeyRing(log, "t", refresh_seconds=0.05)
        await writer.append(KeyCreated(key_id="c" * 16, tenant_id="t1", role="reader", secret_sha256=digest("s" * 43)))
        key = token("c" * 16, "s" * 43)
        assert await other.authenticate(key) is not None  # other has now looked at the log
        offset = await writer.append(KeyRevoked(key_id="c" * 16))
        assert await writer.wait_enforced(offset, 5)
        assert await other.authenticate(key) is None  # without being told: its bound passed

    asyncio.run(run())


def test_token_buckets_admit_a_burst_then_the_rate():
    b = TokenBuckets(rate=10, burst=3)
    assert [b.take("k") for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = b.take("k")
    assert 0 < wait <= 0.1
    assert b.take("other") == 0.0  # per key
    assert TokenBuckets(rate=0, burst=1).take("k") == 0.0  # off


def test_tenant_defaults_to_the_keys_and_other_tenants_are_forbidden():
    reader = Principal(key_id="k", role="reader", tenant_id="t1")
    admin = Principal(key_id="a", role="admin")
    assert tenant_for(reader, None) == "t1" and tenant_for(reader, "t1") == "t1" and tenant_for(admin, "t9") == "t9"
    with pytest.raises(Forbidden):
        tenant_for(reader, "t2")
    with pytest.raises(Forbidden):
        tenant_for(admin, None)


@pytest.mark.parametrize("raw, reason", [
    (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), "nested"),
    (b"[" * 100_000, "nested"),
    (b'{"n": ' + b"9" * 5000 + b"}", "digits"),
    (b'{"n": NaN}', "finite"),
    (b'{"n": -Infinity}', "finite"),
    (b'{"event_id": "\\ud800"}', "surrogate"),
    (b'{"\\udfff": 1}', "surrogate"),
    (b'{"t": "\xff"}', "UTF-8"),
    (b'{"a": ', "not valid JSON"),
])
def test_unsafe_json_is_refused_with_the_reason(raw, reason):
    with pytest.raises(UnsafeJSON, match=reason):
        parse_body(raw, ndjson=False)


def test_safe_json_and_json_lines_parse():
    assert parse_body(json.dumps({"a": [1, 2.5, "😀", "\ud83d\ude00"]}).encode(), ndjson=False)["a"][0] == 1
    assert parse_body(b'{"a": 1}\n\n{"b": 2}\n', ndjson=True) == [{"a": 1}, {"b": 2}]
    with pytest.raises(UnsafeJSON, match="line 2"):
        parse_body(b'{"a": 1}\n{"b": NaN}\n', ndjson=True)
