"""Per-tenant retention: turns older than a tenant's `retain_days` are forgotten automatically, by
the same mechanism as any forget.

The settings are `TenantRetentionSet` records on the control topic (`memstream tenants set T
--retain-days N`, schemas/forgetting.py), folded by the audit trail, so every process knows them.
The sweeper runs beside the eraser (the embedded pipeline's run loop; on Kafka the worker that
runs the hierarchy view) and, at most once per `interval` per tenant, publishes

    ForgetRequested(level="tenant", occurred_before=now - N days, requested_by="retention")

through the pipeline's publisher — one request per partition, completed by the eraser and the
views like every other forget, and in the audit trail like them.

No pointless repeats: a tenant is swept only when the hierarchy view still holds turns of it
older than the cutoff (`ForgetScope.covers`, the reference rule every store's query agrees
with), and not again until that view has processed the previous sweep's request. A sweep costs
what any tenant-wide forget costs (the eraser scans each partition once), so with a daily
interval that is once a day per tenant at most — and never while there is nothing to forget.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Callable, Protocol

from schemas.events import OCCURRED_MIN, ForgetRequested, ForgetScope
from schemas.ports.views import Forget, Positions
from streams.audit import RETENTION_REQUESTER, AuditTrail

log = logging.getLogger(__name__)


class TurnProbe(Protocol):
    """What the sweeper asks of the view it checks (the hierarchy view, read-only)."""

    async def has_turns(self, forget: Forget) -> bool: ...

    async def positions(self) -> Positions: ...


class ViewProbe:
    """A `TurnProbe` on a view's live generation, opened read-only for each question (so it never
    shares a connection with the runner that writes the view, and follows replays)."""

    def __init__(self, backends, view: str = "hierarchy"):
        self.backends = backends
        self.view = view
        self.catalog = backends.catalog()

    def _read(self, read: Callable):
        generation = self.catalog.current(self.view)
        if generation is None:
            return None
        store = self.backends.open_view(self.view, generation)
        try:
            return read(store)
        finally:
            store.close()

    async def has_turns(self, forget: Forget) -> bool:
        return bool(await asyncio.to_thread(self._read, lambda s: s.turns_in_scope(forget)))

    async def positions(self) -> Positions:
        return (await asyncio.to_thread(self._read, lambda s: s.positions())) or {}


class RetentionSweeper:
    name = "retention"

    def __init__(self, trail: AuditTrail, publisher, probe: TurnProbe, *, interval: float = 3600.0,
                 clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc)):
        self.trail = trail
        self.publisher = publisher  # streams.ingest.Publisher (seals; a broadcast forget goes to every partition)
        self.probe = probe
        self.interval = interval
        self.clock = clock
        self._checked: dict[str, float] = {}  # tenant -> monotonic time of the last check
        self._pending: dict[str, Positions] = {}  # tenant -> positions of its last sweep's request

    async def step(self) -> int:
        """Sweep the tenants that are due; returns how many forgets were requested."""
        await self.trail.refresh()
        requested = 0
        for tenant, setting in sorted(self.trail.retention.items()):
            now = time.monotonic()
            if now - self._checked.get(tenant, float("-inf")) < self.interval:
                continue
            pending = self._pending.get(tenant)
            if pending is not None:
                seen = await self.probe.positions()
                if any(seen.get(p, 0) < off for p, off in pending.items()):
                    continue  # the last sweep is not in the view yet: checking now would find its turns again
                del self._pending[tenant]
            self._checked[tenant] = now
            cutoff = self.clock() - timedelta(days=setting.retain_days)
            if cutoff <= OCCURRED_MIN:
                continue  # nothing can be that old
            scope = ForgetScope(level="tenant", occurred_before=cutoff)
            if not await self.probe.has_turns(Forget(tenant, scope)):
                continue
            self._pending[tenant] = await self._request(tenant, scope, setting.retain_days)
            requested += 1
        return requested

    async def _request(self, tenant: str, scope: ForgetScope, days: int) -> Positions:
        event = ForgetRequested(event_id=f"forget-retention-{uuid.uuid4().hex}", tenant_id=tenant, scope=scope,
                                requested_at=self.clock(), reason=f"retention: turns older than {days} days",
                                requested_by=RETENTION_REQUESTER)
        appended = await self.publisher.publish([event])
        log.info("retention tenant=%s forget=%s occurred_before=%s partitions=%d", tenant, event.event_id,
                 scope.occurred_before.isoformat(), len(appended))
        return {a.partition: a.offset + 1 for a in appended}

    async def run(self, stop: asyncio.Event) -> None:
        idle = min(1.0, self.interval)  # a new setting is picked up within a second (or an interval, if shorter)
        while not stop.is_set():
            try:
                await self.step()
            except Exception:  # noqa: BLE001 - a failed sweep (a store restarting) is tried again at the next interval
                log.exception("retention sweep failed; retrying")
            try:
                await asyncio.wait_for(stop.wait(), timeout=max(idle, 0.01))
            except asyncio.TimeoutError:
                pass
