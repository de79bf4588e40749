"""The audit trail: who changed keys, retention and projections, who forgot what and when it was
complete, who exported a tenant's memory — folded from the control topic, in its order.

The trail is the control topic itself (append-only, one partition, unlimited retention, never
touched by a forget), read by `AuditTrail.refresh()` incrementally like the key ring reads it.
Its entries carry no text of anyone's memory: ids, scopes, key ids, roles, times and counts —
neither a key's secret nor a forget's or a pause's free-text reason.

A forget enters the trail when the eraser completes it on its first partition
(`ForgetCompleted`, appended by `CompletionRecorder`, the eraser's `on_erased` callback); a
tenant or agent forget is one request per partition and its entry gathers their completions
(`partitions_complete` of `partitions`; `completed_at` is the last one). Until then it is pending:
`/metrics`, the ops snapshot and the dashboard count it (services/ops/forgets.py).

Entries are ordered by the control-topic offset of the record that made them (`control_offset`), which is
what a cursor remembers: a page never changes once the records before its end are written, except
that a forget entry may gain completions of later partitions.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from schemas.control import control_topic, decode_control
from schemas.forgetting import (
    ForgetCompleted,
    ForgettingRecord,
    MemoryExported,
    TenantRetentionSet,
    decode_forgetting_record,
    encode_forgetting_record,
)
from schemas.ports.event_log import EventLog, NewRecord
from schemas.security import KeyCreated, KeyRevoked, KeyRotated, decode_key_record

RETENTION_REQUESTER = "retention"  # `requested_by` of the forgets the retention sweeper makes


def _iso(t: datetime | None) -> str | None:
    """ISO 8601 in UTC (a naive time, which a foreign record may carry, is taken as UTC)."""
    if t is None:
        return None
    return (t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)).isoformat()


async def append_record(log_: EventLog, topic: str, record: ForgettingRecord) -> int:
    """Append one record to `<topic>.control`; returns its offset."""
    key = record.forget_id if isinstance(record, ForgetCompleted) else record.tenant_id
    [appended] = await log_.append(control_topic(topic), [NewRecord(key=key, value=encode_forgetting_record(record), partition=0)])
    return appended.offset


class CompletionRecorder:
    """The eraser's `on_erased` callback: one `ForgetCompleted` per forget and partition.

    The eraser awaits it before it moves its position past the forget (streams/eraser.py), so a
    completion is recorded at least once: a crash in between repeats the forget (destroying nothing
    new: `keys_destroyed` is then 0) and appends a second record for that partition, which the
    trail counts once."""

    def __init__(self, log_: EventLog, topic: str):
        self.log = log_
        self.topic = topic
        self._partitions: int | None = None

    async def __call__(self, erasure) -> None:
        forget = erasure.forget
        if self._partitions is None:
            self._partitions = await self.log.partitions(self.topic)
        record = ForgetCompleted(
            tenant_id=forget.tenant_id, forget_id=forget.event_id, scope=forget.scope, requested_by=forget.requested_by,
            requested_at=forget.requested_at, partition=erasure.partition, offset=erasure.offset,
            partitions=self._partitions if forget.scope.broadcast else 1, keys_destroyed=len(erasure.tombstones),
            records_erased=erasure.records_erased, eraser_seconds=round(erasure.seconds, 6))
        await append_record(self.log, self.topic, record)


@dataclass
class RetentionSetting:
    tenant_id: str
    retain_days: int
    at: datetime
    by: str
    offset: int


@dataclass
class _Forget:
    entry: dict[str, Any]
    partitions_done: set[int] = field(default_factory=set)
    completed_at: datetime | None = None


class AuditTrail:
    def __init__(self, log_: EventLog, topic: str):
        self.log = log_
        self.topic = control_topic(topic)
        self.applied = 0  # next control-topic offset to read
        self.entries: list[dict[str, Any]] = []  # in offset order
        self.forgets: dict[str, _Forget] = {}
        self.retention: dict[str, RetentionSetting] = {}  # tenants with retain_days > 0
        self.last_sweep: dict[str, dict[str, Any]] = {}  # tenant -> entry of the newest retention forget completed
        self._key_tenants: dict[str, str | None] = {}
        self._key_roles: dict[str, str] = {}
        self._lock = asyncio.Lock()

    async def refresh(self) -> None:
        async with self._lock:
            end = (await self.log.end_offsets(self.topic)).get(0, 0)
            while self.applied < end:
                records = await self.log.read(self.topic, 0, self.applied, max_records=1000)
                if not records:
                    break
                for rec in records:
                    self._apply(rec.value, rec.offset)
                    self.applied = rec.offset + 1

    # -- folding ------------------------------------------------------------------------------
    def _apply(self, value: bytes, offset: int) -> None:
        record = decode_forgetting_record(value)
        if record is not None:
            return self._apply_forgetting(record, offset)
        key = decode_key_record(value)
        if key is not None:
            return self._apply_key(key, offset)
        control = decode_control(value)
        if control is not None:
            self.entries.append({"control_offset": offset, "kind": "projection", "action": "paused" if control.paused else "resumed",
                                 "at": _iso(control.requested_at), "by": control.requested_by, "tenant_id": None,
                                 "projection": control.projection})

    def _apply_key(self, record, offset: int) -> None:
        if isinstance(record, KeyCreated):
            if record.key_id in self._key_tenants:  # a re-used id keeps the first key (as the key ring does)
                return
            self._key_tenants[record.key_id] = record.tenant_id
            self._key_roles[record.key_id] = record.role
            action, extra = "created", {"name": record.name}
        elif record.key_id not in self._key_tenants:
            return  # a change to a key that was never created changes nothing
        elif isinstance(record, KeyRevoked):
            action, extra = "revoked", {}
        else:
            assert isinstance(record, KeyRotated)
            action, extra = "rotated", {"previous_valid_until": _iso(record.previous_valid_until)}
        self.entries.append({"control_offset": offset, "kind": "key", "action": action, "at": _iso(record.at), "by": record.by,
                             "tenant_id": self._key_tenants[record.key_id], "key_id": record.key_id,
                             "role": self._key_roles[record.key_id], **extra})

    def _apply_forgetting(self, record, offset: int) -> None:
        if isinstance(record, TenantRetentionSet):
            if record.retain_days > 0:
                self.retention[record.tenant_id] = RetentionSetting(record.tenant_id, record.retain_days, record.at, record.by, offset)
            else:
                self.retention.pop(record.tenant_id, None)
            self.entries.append({"control_offset": offset, "kind": "retention", "action": "set" if record.retain_days else "cleared",
                                 "at": _iso(record.at), "by": record.by, "tenant_id": record.tenant_id, "retain_days": record.retain_days})
        elif isinstance(record, MemoryExported):
            self.entries.append({"control_offset": offset, "kind": "export", "action": "exported", "at": _iso(record.at), "by": record.by,
                                 "tenant_id": record.tenant_id, "conversation_id": record.conversation_id, "turns": record.turns,
                                 "complete": record.complete})
        else:
            self._apply_completion(record, offset)

    def _apply_completion(self, c: ForgetCompleted, offset: int) -> None:
        f = self.forgets.get(c.forget_id)
        if f is None:
            entry = {"control_offset": offset, "kind": "forget", "action": "forgot", "at": _iso(c.requested_at), "by": c.requested_by,
                     "tenant_id": c.tenant_id, "forget_id": c.forget_id, "scope": c.scope.model_dump(mode="json", exclude_none=True),
                     "requested_at": _iso(c.requested_at), "completed_at": None, "seconds": None, "complete": False,
                     "partitions": c.partitions, "partitions_complete": 0, "keys_destroyed": 0, "records_erased": 0}
            f = self.forgets[c.forget_id] = _Forget(entry)
            self.entries.append(entry)
            if c.requested_by == RETENTION_REQUESTER:
                last = self.last_sweep.get(c.tenant_id)
                if last is None or datetime.fromisoformat(last["requested_at"]) < c.requested_at:
                    self.last_sweep[c.tenant_id] = entry
        if c.partition in f.partitions_done:  # a repeated completion (the eraser retried): counted once
            return
        f.partitions_done.add(c.partition)
        f.completed_at = max(f.completed_at or c.completed_at, c.completed_at)
        e = f.entry
        e["partitions_complete"] = len(f.partitions_done)
        e["complete"] = e["partitions_complete"] >= e["partitions"]
        e["keys_destroyed"] += c.keys_destroyed
        e["records_erased"] += c.records_erased
        e["completed_at"] = _iso(f.completed_at)
        e["seconds"] = round(max(0.0, (f.completed_at - c.requested_at).total_seconds()), 3)

    # -- reading ------------------------------------------------------------------------------
    def tenants(self) -> list[str]:
        """Every tenant the trail names: keys, retention settings, forgets, exports."""
        return sorted({e["tenant_id"] for e in self.entries if e["tenant_id"] is not None})

    def page(self, *, tenant_id: str | None = None, since: datetime | None = None, after: int = -1,
             limit: int = 100) -> tuple[list[dict[str, Any]], int | None]:
        """Entries after control offset `after` that match the filters (a tenant's entries; those
        at or after `since`), at most `limit`; and the offset to continue after, None at the end."""
        out: list[dict[str, Any]] = []
        for e in self._after(after):
            if tenant_id is not None and e["tenant_id"] != tenant_id:
                continue
            if since is not None and datetime.fromisoformat(e["at"]) < since:
                continue
            if len(out) == limit:
                return out, out[-1]["control_offset"]
            out.append(dict(e, scope=dict(e["scope"])) if "scope" in e else dict(e))
        return out, None

    def _after(self, after: int):
        lo, hi = 0, len(self.entries)
        while lo < hi:  # entries are in offset order: skip to the cursor
            mid = (lo + hi) // 2
            if self.entries[mid]["control_offset"] <= after:
                lo = mid + 1
            else:
                hi = mid
        return self.entries[lo:]
