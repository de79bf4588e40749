"""Pending forgets and how long forgets take, as the sampler sees them (services/ops/monitor.py).

A forget is **pending** from its request until it is complete: the eraser past it (its
positions in the data key store) and every view past it (their own positions) on every
partition it was appended to — the same condition POST /v1/wait checks. The tracker reads the
event topic's new records at each sample (from where the previous sample stopped; at the first
sample from the lowest position of the eraser and the views, below which everything is
complete), keeps the forget requests it sees, and drops each once complete, observing
(sample time − `requested_at`) in `memstream_forget_complete_seconds`. The resolution is the
sampling interval; forgets complete before the first sample are not observed (a restart does not
replay history into the histogram). At most `cap` records per partition are read per sample.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone

from schemas.errors import InvalidEvent
from schemas.events import ForgetRequested, decode_event
from schemas.ports.views import Positions
from streams.audit import RETENTION_REQUESTER


@dataclass
class _Pending:
    forget: ForgetRequested
    records: dict[int, int] = field(default_factory=dict)  # partition -> offset


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


class ForgetTracker:
    def __init__(self, log_, topic: str, keystore, metrics, *, cap: int = 5000):
        self.log = log_
        self.topic = topic
        self.keystore = keystore
        self.metrics = metrics
        self.cap = cap
        self._scanned: Positions | None = None
        self._pending: dict[str, _Pending] = {}
        self._done: dict[str, None] = {}  # ids of requests seen complete (bounded, oldest first)
        self._completed: deque[tuple[float, float]] = deque(maxlen=5000)  # (sample time, seconds)
        self._last_retention: dict[str, ForgetRequested] = {}  # tenant -> newest retention request seen pending

    async def sample(self, statuses, now: float) -> dict:
        end: Positions = dict(statuses[0].end_offsets) if statuses else await self.log.end_offsets(self.topic)
        erased = await asyncio.to_thread(self.keystore.positions)
        done = {p: min([erased.get(p, 0)] + [st.positions.get(p, 0) for st in statuses]) for p in end}
        if self._scanned is None:
            self._scanned = dict(done)
        for p, off in end.items():
            await self._scan(p, off)
        at = datetime.fromtimestamp(now, timezone.utc)
        for forget_id, pending in list(self._pending.items()):
            if self._complete(pending, done, end):
                del self._pending[forget_id]
                self._done[forget_id] = None
                while len(self._done) > 10_000:
                    self._done.pop(next(iter(self._done)))
                seconds = max(0.0, (at - pending.forget.requested_at).total_seconds())
                self.metrics.forget_complete.observe(seconds)
                self._completed.append((now, seconds))
        oldest = min((p.forget.requested_at for p in self._pending.values()), default=None)
        age = max(0.0, (at - oldest).total_seconds()) if oldest is not None else 0.0
        self.metrics.forgets_pending.set(len(self._pending))
        self.metrics.forget_oldest_pending.set(age)
        recent = [s for t, s in self._completed if now - t <= 3600]
        return {
            "pending": len(self._pending), "oldest_pending_seconds": round(age, 3),
            "pending_requests": [{"forget_id": p.forget.event_id, "tenant_id": p.forget.tenant_id, "level": p.forget.scope.level,
                                  "requested_by": p.forget.requested_by, "requested_at": p.forget.requested_at.isoformat(),
                                  "age_seconds": round(max(0.0, (at - p.forget.requested_at).total_seconds()), 3),
                                  "partitions_pending": sorted(q for q, o in p.records.items() if done.get(q, 0) <= o)}
                                 for p in sorted(self._pending.values(), key=lambda p: p.forget.requested_at)[:20]],
            "completed": {"window_seconds": 3600, "count": len(recent), "p50_seconds": round(_quantile(recent, 0.5), 3),
                          "p95_seconds": round(_quantile(recent, 0.95), 3)},
        }

    def _complete(self, pending: _Pending, done: Positions, end: Positions) -> bool:
        """Every record of the request is below the eraser's and every view's positions. A copy of
        a broadcast request this tracker has not seen lies below where its scan began (complete
        then), once the scan of that partition has reached the end."""
        if not all(done.get(p, 0) > o for p, o in pending.records.items()):
            return False
        return not pending.forget.scope.broadcast or all(q in pending.records or self._scanned.get(q, 0) >= off for q, off in end.items())

    async def _scan(self, partition: int, end: int) -> None:
        start = self._scanned.get(partition, 0)
        offset, budget = start, self.cap
        while offset < end and budget > 0:
            records = await self.log.read(self.topic, partition, offset, max_records=min(1000, budget))
            records = [r for r in records if r.offset < end]
            if not records:
                break
            for r in records:
                if r.header("type") not in (None, b"ForgetRequested"):
                    continue
                try:
                    event = decode_event(r.value)
                except InvalidEvent:
                    continue
                if not isinstance(event, ForgetRequested):
                    continue
                if event.event_id in self._done:  # a copy of a request already complete (appended a moment after its others)
                    continue
                pending = self._pending.setdefault(event.event_id, _Pending(event))
                pending.records[partition] = r.offset
                if event.requested_by == RETENTION_REQUESTER:
                    last = self._last_retention.get(event.tenant_id)
                    if last is None or last.requested_at < event.requested_at:
                        self._last_retention[event.tenant_id] = event
            budget -= len(records)
            offset = records[-1].offset + 1
        self._scanned[partition] = offset

    def last_retention_request(self, tenant_id: str) -> ForgetRequested | None:
        """The newest retention request of the tenant this tracker saw (complete or not)."""
        return self._last_retention.get(tenant_id)

    def pending_ids(self) -> set[str]:
        return set(self._pending)
