"""The retention sweeper on the embedded log, with the view it checks as a double: it requests a
tenant-wide forget of what is older than the tenant's retention only when the view holds such
turns, never again for the same turns before the view has processed the request, and never once
the setting is cleared."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone

import pytest

from infra.log.sqlite import SqliteEventLog
from schemas.control import control_topic
from schemas.forgetting import TenantRetentionSet
from streams.audit import RETENTION_REQUESTER, AuditTrail, append_record
from streams.ingest import Publisher
from streams.retention import RetentionSweeper

pytestmark = pytest.mark.unit
TOPIC = "t.events"
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=timezone.utc)


async def open_log(tmp_path, partitions: int = 4) -> SqliteEventLog:
    log = SqliteEventLog(tmp_path / "log.sqlite")
    await log.start()
    await log.ensure_topic(TOPIC, partitions)
    await log.ensure_topic(control_topic(TOPIC), 1)
    return log


class FakeProbe:
    """The hierarchy view as the sweeper sees it: which turns it holds (by occurred_at), and its positions."""

    def __init__(self):
        self.turns: dict[str, list[datetime]] = {}
        self.seen: dict[int, int] = {}
        self.asked: list[tuple[str, datetime]] = []

    async def has_turns(self, forget) -> bool:
        self.asked.append((forget.tenant_id, forget.scope.occurred_before))
        return any(t < forget.scope.occurred_before for t in self.turns.get(forget.tenant_id, []))

    async def positions(self):
        return dict(self.seen)


def test_the_sweeper_forgets_only_what_is_there_and_never_the_same_turns_twice(tmp_path):
    async def run():
        log = await open_log(tmp_path)
        try:
            probe = FakeProbe()
            sweeper = RetentionSweeper(AuditTrail(log, TOPIC), Publisher(log, TOPIC), probe, interval=0.0, clock=lambda: NOW)
            steps = [await sweeper.step()]                         # no tenant has a retention setting
            await append_record(log, TOPIC, TenantRetentionSet(tenant_id="acme", retain_days=30))
            await append_record(log, TOPIC, TenantRetentionSet(tenant_id="idle", retain_days=1))
            probe.turns = {"acme": [NOW - timedelta(days=40), NOW - timedelta(days=1)], "idle": [NOW - timedelta(hours=2)]}
            steps.append(await sweeper.step())                     # acme holds a turn older than 30 days: one forget
            steps.append(await sweeper.step())                     # the view has not seen that forget yet: no second one
            end = await log.end_offsets(TOPIC)
            probe.seen = dict(end)                                 # the view processed it ...
            probe.turns["acme"] = [NOW - timedelta(days=1)]        # ... and the old turn is gone
            steps.append(await sweeper.step())                     # nothing older than 30 days is left: nothing requested
            probe.turns["acme"].append(NOW - timedelta(days=31))   # a late turn from long ago arrives
            steps.append(await sweeper.step())
            await append_record(log, TOPIC, TenantRetentionSet(tenant_id="acme", retain_days=0))
            probe.seen = dict(await log.end_offsets(TOPIC))
            steps.append(await sweeper.step())                     # retention cleared: never again
            forgets = []
            for p, off in (await log.end_offsets(TOPIC)).items():
                for r in await log.read(TOPIC, p, 0, max_records=off + 1):
                    forgets.append((p, json.loads(r.value)))
            return steps, forgets, probe.asked
        finally:
            await log.close()

    steps, forgets, asked = asyncio.run(run())
    assert steps == [0, 1, 0, 0, 1, 0]
    requests = {f["event_id"]: f for _, f in forgets}
    assert len(requests) == 2 and len(forgets) == 2 * 4, "each sweep is one tenant-wide request, on every partition"
    for f in requests.values():
        assert f["type"] == "ForgetRequested" and f["tenant_id"] == "acme" and f["requested_by"] == RETENTION_REQUESTER
        assert f["scope"]["level"] == "tenant" and datetime.fromisoformat(f["scope"]["occurred_before"]) == NOW - timedelta(days=30)
    assert ("idle", NOW - timedelta(days=1)) in asked, "a tenant with nothing that old is checked, and left alone"
